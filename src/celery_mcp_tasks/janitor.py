"""The janitor's sweep: evict expired tasks, settle tasks whose job was lost, end unanswered questions.

Idempotent and safe to run twice at once (two beats by mistake, many in-worker
janitors): eviction takes bounded batches (skipping rows another sweep holds on
PostgreSQL), and the reaper and the input timeout decide each task inside a
compare-and-swap, so a stale task is re-sent or failed once. It reports counts
as a log event and through an optional metric hook, never task ids.

A janitor that stops must not go unnoticed: every sweep records itself in the
store's sweep ledger (`store.sweeps`: when, how long, the counts, the tasks in
each status), which `/readyz`, the metrics, `doctor` and the web process's
janitor watch read; and a sweep that finds the store at 90% of
MCP_TASKS_MAX_ROWS says so before tool calls start failing with "Task limit reached".

How an `input_required` task ends when nobody answers: after
MCP_TASKS_INPUT_TIMEOUT_S (default 24h; `off`: never) without an answer (a
partial answer restarts the clock) a sweep fails it with "No answer to the
input request within 24h". A task without a TTL is then evicted like any final
one, `MCP_TASKS_RETENTION_MS` later, so a forgotten question no longer holds a
row-cap slot forever.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

from celery_mcp_tasks.config import Settings
from celery_mcp_tasks.model import now_ms
from celery_mcp_tasks.service import TaskService
from celery_mcp_tasks.store.base import Ledger
from celery_mcp_tasks.store.cleanup import Eviction
from celery_mcp_tasks.store.sweeps import JANITOR

__all__ = ["EXPIRED_UNFINISHED", "METRIC", "MetricHook", "SweepReport", "ledger_of", "sweep"]

logger = logging.getLogger("celery_mcp_tasks.janitor")

MetricHook = Callable[[str, dict[str, int]], None]
"""`(name, counts)`, e.g. to feed a StatsD or Prometheus counter. Exceptions are logged, never raised.

Every sweep calls it with `METRIC` and the `SweepReport` as a dict; a sweep that
evicted tasks before they were final calls it again with `EXPIRED_UNFINISHED` and
`{tool: count}`. A hook should ignore names it does not know.
"""

METRIC = "celery_mcp_tasks.janitor.sweep"
EXPIRED_UNFINISHED = "celery_mcp_tasks.janitor.expired_unfinished"
"""Tasks the TTL removed while `working` or `input_required`: they end here, with no final status."""
CAP_WARNING = "celery_mcp_tasks.janitor.near_cap"
NEAR_CAP = 0.9
"""The share of MCP_TASKS_MAX_ROWS from which every sweep warns."""


@dataclass(frozen=True)
class SweepReport:
    removed: int = 0
    resent: int = 0
    failed: int = 0
    expired_inputs: int = 0  # `input_required` tasks failed by the input timeout


def lost_message(stale_timeout_s: float, sends: int) -> str:
    return (
        f"The job was lost: no worker reported for {stale_timeout_s:g}s (sent {sends} time{'s' if sends != 1 else ''})"
    )


def _span(seconds: float) -> str:
    """86400 -> "24h", 1800 -> "30min", 90 -> "90s": how a person says a timeout."""
    for unit, size in (("h", 3600), ("min", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"


def input_timeout_message(timeout_s: float) -> str:
    return f"No answer to the input request within {_span(timeout_s)}"


def ledger_of(service: TaskService) -> Ledger:
    """The sweep ledger on the service's store."""
    return service.store.ledger()


def sweep(
    service: TaskService,
    settings: Settings,
    *,
    batch_size: int = 1000,
    metric: MetricHook | None = None,
    max_sends: Callable[[str], int | None] | None = None,
) -> SweepReport:
    """One pass: evict expired rows, re-send or fail `working` tasks with a stale heartbeat, fail
    `input_required` tasks past the input timeout; then record the sweep in the ledger.

    `max_sends(tool)` is a tool's own bound (None: the setting's).
    """
    started = time.monotonic()
    at = now_ms()
    eviction = _evict(service, settings, at, batch_size)
    outcomes = _reap(service, settings, at, batch_size, max_sends)
    report = SweepReport(
        removed=eviction.removed,
        resent=outcomes["resent"],
        failed=outcomes["failed"],
        expired_inputs=_expire_inputs(service, settings, at, batch_size),
    )
    counts = asdict(report)
    # An idle sweep is not news: INFO only when it did something (no log spam every interval).
    level = logging.INFO if any(counts.values()) else logging.DEBUG
    logger.log(
        level,
        "janitor sweep: removed=%d resent=%d failed=%d expired_inputs=%d",
        report.removed,
        report.resent,
        report.failed,
        report.expired_inputs,
        extra={"event": METRIC, **counts},
    )
    if metric is not None:
        _tell(metric, METRIC, counts)
        if eviction.unfinished:
            _tell(metric, EXPIRED_UNFINISHED, dict(eviction.unfinished))
    _record(service, settings, at, started, counts)
    return report


def _evict(service: TaskService, settings: Settings, at: int, batch_size: int) -> Eviction:
    """Expired rows out, telling which of them were unfinished."""
    return service.store.evict(now_ms=at, retention_ms=settings.retention_ms, batch_size=batch_size)


def _tell(metric: MetricHook, name: str, counts: dict[str, int]) -> None:
    try:
        metric(name, counts)
    except Exception:
        logger.exception("janitor metric hook raised")


def _reap(
    service: TaskService,
    settings: Settings,
    at: int,
    batch_size: int,
    max_sends: Callable[[str], int | None] | None,
) -> dict[str, int]:
    outcomes = {"resent": 0, "failed": 0, "skipped": 0}
    stale_before = at - int(settings.stale_timeout_s * 1000)
    while True:  # in batches; a batch where another janitor got there first ends the pass
        batch = service.store.stale(heartbeat_before_ms=stale_before, limit=batch_size)
        acted = 0
        for record in batch:
            limit = (max_sends(record.tool) if max_sends else None) or settings.max_sends
            outcome = service.reap(
                record.key,
                stale_before_ms=stale_before,
                max_sends=limit,
                lost_message=lost_message(settings.stale_timeout_s, record.resends + 1),
            )
            outcomes[outcome] += 1
            acted += outcome != "skipped"
        if len(batch) < batch_size or not acted:
            return outcomes


def _expire_inputs(service: TaskService, settings: Settings, at: int, batch_size: int) -> int:
    """Fail `input_required` tasks nobody answered within the input timeout (None: never)."""
    if settings.input_timeout_s is None:
        return 0
    before = at - int(settings.input_timeout_s * 1000)
    message = input_timeout_message(settings.input_timeout_s)
    expired = 0
    while True:
        batch = service.store.unanswered(changed_before_ms=before, limit=batch_size)
        acted = sum(service.expire_input(key, changed_before_ms=before, message=message) for key in batch)
        expired += acted
        if len(batch) < batch_size or not acted:
            return expired


def _record(service: TaskService, settings: Settings, at: int, started: float, counts: dict[str, int]) -> None:
    """The sweep in the ledger, and a warning near the row cap. A failure here is a log line:
    the sweep itself happened (the ledger's age will show that recording stopped)."""
    try:
        statuses = service.store.count_by_status()
        duration_ms = int((time.monotonic() - started) * 1000)
        ledger_of(service).record(JANITOR, duration_ms=duration_ms, report=counts, statuses=statuses)
    except Exception as exc:  # noqa: BLE001 - the sweep ran; only its record is missing
        logger.warning("could not record the janitor sweep in the store: %s", type(exc).__name__)
        return
    held = sum(statuses.values())
    if settings.max_rows is not None and held >= NEAR_CAP * settings.max_rows:
        logger.warning(
            "the task store holds %d tasks, %d%% of MCP_TASKS_MAX_ROWS=%d: at the cap every new task is "
            'refused ("Task limit reached"); raise MCP_TASKS_MAX_ROWS, or shorten task TTLs, '
            "MCP_TASKS_RETENTION_MS or MCP_TASKS_INPUT_TIMEOUT_S",
            held,
            100 * held // max(settings.max_rows, 1),
            settings.max_rows,
            extra={"event": CAP_WARNING, "tasks": held, "max_rows": settings.max_rows},
        )
