"""The janitor's sweep: evict expired tasks, settle tasks whose job was lost.

Idempotent and safe to run twice at once (two beats by mistake): eviction
takes bounded batches (skipping rows another sweep holds on PostgreSQL), and
the reaper decides each task inside a compare-and-swap, so a stale task is
re-sent or failed once. It reports counts as a log event and through an
optional metric hook, never task ids.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass

from celery_mcp_tasks.config import Settings
from celery_mcp_tasks.model import now_ms
from celery_mcp_tasks.service import TaskService

__all__ = ["METRIC", "MetricHook", "SweepReport", "sweep"]

logger = logging.getLogger("celery_mcp_tasks.janitor")

MetricHook = Callable[[str, dict[str, int]], None]
"""`(name, counts)`, e.g. to feed a StatsD or Prometheus counter. Exceptions are logged, never raised."""

METRIC = "celery_mcp_tasks.janitor.sweep"


@dataclass(frozen=True)
class SweepReport:
    removed: int = 0
    resent: int = 0
    failed: int = 0


def lost_message(stale_timeout_s: float, sends: int) -> str:
    return (
        f"The job was lost: no worker reported for {stale_timeout_s:g}s (sent {sends} time{'s' if sends != 1 else ''})"
    )


def sweep(
    service: TaskService,
    settings: Settings,
    *,
    batch_size: int = 1000,
    metric: MetricHook | None = None,
    max_sends: Callable[[str], int | None] | None = None,
) -> SweepReport:
    """One pass: evict expired rows, then re-send or fail `working` tasks with a stale heartbeat.

    `max_sends(tool)` is a tool's own bound (None: the setting's).
    """
    at = now_ms()
    removed = service.store.cleanup(now_ms=at, retention_ms=settings.retention_ms, batch_size=batch_size)
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
            break
    report = SweepReport(removed=removed, resent=outcomes["resent"], failed=outcomes["failed"])
    # An idle sweep is not news: INFO only when it did something (no log spam every interval).
    level = logging.INFO if report.removed or report.resent or report.failed else logging.DEBUG
    logger.log(
        level,
        "janitor sweep: removed=%d resent=%d failed=%d",
        report.removed,
        report.resent,
        report.failed,
        extra={"event": METRIC, **asdict(report)},
    )
    if metric is not None:
        try:
            metric(METRIC, asdict(report))
        except Exception:
            logger.exception("janitor metric hook raised")
    return report
