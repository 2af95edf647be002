"""The janitor: the sweep (evict expired rows, settle lost jobs, end unanswered questions), its schedule
(on beat, or claimed in every worker with MCP_TASKS_JANITOR=worker), and its liveness (the sweep ledger).

Safe to run twice at once: eviction takes bounded batches, and the reaper and the input timeout decide
each task inside a compare-and-swap. Counts are logged and told to the metric hook, never task ids.
"""

from __future__ import annotations

import functools
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from celery_mcp_tasks.config import Settings
from celery_mcp_tasks.model import TaskRecord, now_ms, stale_cutoff
from celery_mcp_tasks.service import TaskService
from celery_mcp_tasks.store.base import Eviction, StoreUnavailable
from celery_mcp_tasks.store.ledger import JANITOR, Ledger, SweepRecord

if TYPE_CHECKING:
    from celery import Celery

logger = logging.getLogger("celery_mcp_tasks.janitor")


# -- the sweep ------------------------------------------------------------------------------------

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
NEAR_CAP = 0.9  # the share of MCP_TASKS_MAX_ROWS from which every sweep warns


@dataclass(frozen=True)
class SweepReport:
    removed: int = 0
    resent: int = 0
    failed: int = 0
    expired_inputs: int = 0  # `input_required` tasks failed by the input timeout


def lost_message(stale_timeout_s: float, record: TaskRecord) -> str:
    """Why a task whose sends are spent failed: its last send's job went silent, or no worker started it (none
    consumes the tool's queue, none could reach the task store to claim it, or the one that took it died first)."""
    sends = record.resends + 1
    sent = f"sent {sends} time{'s' if sends != 1 else ''}"
    if record.never_started:
        return (
            f"The job was not started: no worker took it from its queue, or reached the task store, within "
            f"{stale_timeout_s:g}s ({sent}); check that a worker consumes the tool's queue"
        )
    return f"The job was lost: no worker reported for {stale_timeout_s:g}s ({sent})"


def input_timeout_message(timeout_s: float) -> str:
    span = f"{timeout_s:g}s"  # as a person says it: 86400 -> "24h", 1800 -> "30min", 90 -> "90s"
    for unit, size in (("h", 3600), ("min", 60)):
        if timeout_s >= size and timeout_s % size == 0:
            span = f"{timeout_s / size:g}{unit}"
            break
    return f"No answer to the input request within {span}"


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

    `max_sends(tool)` is a tool's own bound (None: the setting's). A store that fails mid-way stops the pass:
    what it did until then (each batch and each task its own commit) is still logged and told to the metric
    hook, in one line saying why it stopped; it is not recorded in the ledger (the next sweep goes on).
    """
    started = time.monotonic()
    at = now_ms()
    eviction = Eviction()
    done = {"resent": 0, "failed": 0, "skipped": 0, "expired_inputs": 0}
    stopped: StoreUnavailable | None = None
    try:
        service.evict(now_ms=at, retention_ms=settings.retention_ms, batch_size=batch_size, into=eviction)
        _reap(service, settings, at, batch_size, max_sends, done)
        _expire_inputs(service, settings, at, batch_size, done)
    except StoreUnavailable as exc:
        stopped = exc
    report = SweepReport(eviction.removed, done["resent"], done["failed"], done["expired_inputs"])
    counts = asdict(report)
    said = "removed={removed} resent={resent} failed={failed} expired_inputs={expired_inputs}".format(**counts)
    unfinished = sum(eviction.unfinished.values())  # their TTL ran out before they ended: clients lost them
    if unfinished:
        said += f" (of the removed, {unfinished} expired unfinished)"
    if stopped is not None:
        reason = f"{stopped.operation or 'unknown'}: {stopped.reason or 'unknown'}"
        message = f"janitor sweep stopped, the task store failed ({reason}), after {said}; the next sweep goes on"
        logger.warning("%s", message, extra={"event": METRIC, **counts})
        logger.debug("janitor sweep failure", exc_info=stopped)  # the database's own words, in the chained cause
    else:  # an idle sweep is not news (no log spam every interval); a lost job re-sent or failed is a warning
        lost = counts["resent"] or counts["failed"]
        level = logging.WARNING if lost else logging.INFO if any(counts.values()) else logging.DEBUG
        logger.log(level, "janitor sweep: %s", said, extra={"event": METRIC, **counts})
    if metric is not None:
        _tell(metric, METRIC, counts)
        if eviction.unfinished:
            _tell(metric, EXPIRED_UNFINISHED, dict(eviction.unfinished))
    if stopped is None:
        _record(service, settings, started, counts)
    return report


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
    outcomes: dict[str, int],
) -> None:
    """Re-send or fail stale `working` tasks, counting each outcome into `outcomes` as it is committed."""
    stale_before = stale_cutoff(at, settings.stale_timeout_s)
    while True:  # in batches; a batch where another janitor got there first ends the pass
        batch = service.stale(heartbeat_before_ms=stale_before, limit=batch_size)
        acted = 0
        for record in batch:
            outcome = service.reap(
                record.key,
                stale_before_ms=stale_before,
                max_sends=(max_sends(record.tool) if max_sends else None) or settings.max_sends,
                lost_message=functools.partial(lost_message, settings.stale_timeout_s),
            )
            outcomes[outcome] += 1
            acted += outcome != "skipped"
        if len(batch) < batch_size or not acted:
            return


def _expire_inputs(service: TaskService, settings: Settings, at: int, batch_size: int, done: dict[str, int]) -> None:
    """Fail `input_required` tasks nobody answered within the input timeout (None: never), counted into `done`."""
    if settings.input_timeout_s is None:
        return
    before = at - int(settings.input_timeout_s * 1000)
    message = input_timeout_message(settings.input_timeout_s)
    while True:
        batch = service.unanswered(changed_before_ms=before, limit=batch_size)
        acted = 0
        for key in batch:
            expired = service.expire_input(key, changed_before_ms=before, message=message)
            done["expired_inputs"] += expired
            acted += expired
        if len(batch) < batch_size or not acted:
            return


def _record(service: TaskService, settings: Settings, started: float, counts: dict[str, int]) -> None:
    """The sweep in the ledger, and a warning near the row cap. A failure here is a log line:
    the sweep itself happened (the ledger's age will show that recording stopped)."""
    try:
        ledger = service.ledger()
        # The database's clock before the count, back to the sweep's start: where the row cap's count of the rows
        # created since starts (`store.quotas.RowBase`), so no row the count missed is stamped before it, however
        # long the record below waits for a connection. (No ledger row yet, no clock: the record's own.)
        before = ledger.last()
        elapsed_ms = int((time.monotonic() - started) * 1000)
        statuses = service.count_by_status()
        duration_ms = int((time.monotonic() - started) * 1000)
        swept_at = None if before is None or before.read_at is None else before.read_at - elapsed_ms
        ledger.record(JANITOR, duration_ms=duration_ms, report=counts, statuses=statuses, swept_at=swept_at)
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


# -- the schedule ---------------------------------------------------------------------------------

JANITOR_TASK = "celery_mcp_tasks.janitor"

SLACK = 0.05
"""A claim admits its claimant this share of an interval early, so the last sweeper keeps the rhythm
instead of missing every other tick to jitter; two sweeps are never closer than `1 - SLACK` intervals."""

# Sending this interval's janitor message: two quick retries, then the interval is missed (one log line).
_SEND_RETRY: dict[str, Any] = {"max_retries": 2, "interval_start": 0, "interval_step": 0.2, "interval_max": 0.5}


def install_janitor(
    app: Celery,
    run_sweep: Callable[[], Any],
    interval_s: float | None,
    *,
    in_worker: bool = False,
    ledger: Callable[[], Ledger | None],
) -> list[Callable[..., None]]:
    """Register the janitor task (sweeping unconditionally when run by hand; with `claim_interval_s`, as beat
    and the in-worker janitor send it, only when it claimed that interval) and schedule it every `interval_s`
    (None: never): on beat, or with `in_worker` in every worker.

    The beat entry is added in `on_after_configure` (or at once when the app is already configured) and
    re-inserted at `beat_init`: either alone can be clobbered by a user's own `beat_schedule` assignment.
    A sweep message never expires: it waits its turn behind the jobs sent before it, however far behind the
    queue is (one that expired after an interval was never run while the queue stayed that far behind, and
    lost jobs, unanswered questions and TTLs waited for the backlog to drain). Beat's claim half an interval in
    the ledger (the in-worker janitor's, sent by every worker, a whole one), so the messages that piled up in a
    backlog or an outage sweep once between them.
    """
    from celery import signals

    @app.task(name=JANITOR_TASK, ignore_result=True, shared=False, bind=True)  # type: ignore[untyped-decorator]  # Celery ships no types
    def janitor(task: Any, claim_interval_s: float | None = None) -> None:
        if claim_interval_s is not None:
            by = f"{task.request.hostname or socket.gethostname()}:{os.getpid()}"
            try:
                if not claim(ledger(), claim_interval_s, by):
                    return
            except StoreUnavailable as exc:  # one line, not Celery's traceback every interval
                logger.warning(
                    "janitor: the task store failed (%s: %s); trying again next interval", exc.operation, exc.reason
                )
                logger.debug("janitor claim failure", exc_info=True)
                return
        run_sweep()

    if interval_s is None:
        return []
    if in_worker:
        return install_in_worker(app, run_sweep, ledger, interval_s)
    # Beat sends one message per interval: each claims half an interval, so a message that waited longer in the
    # queue than the one before it still sweeps, and only the copies that piled up and arrive together are dropped.
    entry = {"task": JANITOR_TASK, "schedule": interval_s, "kwargs": {"claim_interval_s": interval_s / 2}}

    def add(sender: Celery, **_: Any) -> None:
        schedule = sender.conf.beat_schedule or {}
        if JANITOR_TASK not in schedule:  # a copy: the default dict may be shared between apps
            sender.conf.beat_schedule = {**schedule, JANITOR_TASK: entry}

    app.on_after_configure.connect(add, weak=False)  # connected by call, as in the bridge: Celery is untyped
    if app.configured:
        add(app)

    def ensure(sender: Any = None, **_: Any) -> None:
        scheduler = getattr(sender, "scheduler", None)
        if scheduler is None or scheduler.app is not app or JANITOR_TASK in scheduler.schedule:
            return
        logger.info("re-inserting the janitor into a beat schedule that dropped it")
        scheduler.update_from_dict({JANITOR_TASK: entry})

    signals.beat_init.connect(ensure)  # weakly, and returned: `McpTasks` keeps it
    return [ensure]


def claim(ledger: Ledger | None, interval_s: float, by: str) -> bool:
    """This interval's sweep, claimed in the ledger (on the database's clock); True for one claimant."""
    return ledger is not None and ledger.claim(JANITOR, interval_ms=int(interval_s * 1000 * (1 - SLACK)), by=by)


class InWorkerJanitor:
    """A daemon thread that claims the sweep each interval and sweeps only when it won (solo and threads
    pools: nothing forks). Ticks at a fixed rate from its start; every error is a log line, and the loop goes on.
    """

    def __init__(
        self,
        run_sweep: Callable[[], Any],
        ledger: Callable[[], Ledger | None],
        interval_s: float,
        by: str,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.run_sweep = run_sweep
        self.ledger = ledger
        self.interval_s = interval_s
        self.by = by
        self._clock = clock
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        if self.running:  # one sweep thread, however often a worker says it is ready
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="celery-mcp-tasks-janitor", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(5.0)

    def tick(self) -> bool:
        """Claim this interval; sweep when it is ours. True when this worker swept."""
        if not claim(self.ledger(), self.interval_s, self.by):
            return False
        self.run_sweep()
        return True

    def _loop(self) -> None:
        due = self._clock()
        while not self._stop.wait(max(0.0, due - self._clock())):
            due = self.step(due)

    def step(self, due: float) -> float:
        """The tick that was due at `due` (a failure is a log line), and when the next one is due."""
        try:
            self.tick()
        except Exception as exc:  # a janitor that stops silently is the bug this prevents
            logger.warning("in-worker janitor: the sweep failed (%s); trying again next interval", type(exc).__name__)
            logger.debug("in-worker janitor failure", exc_info=True)
        due += self.interval_s
        now = self._clock()
        return due if due >= now else now + self.interval_s  # no burst after a long sweep


class JanitorMessages:
    """Each interval, one janitor message from the worker's main process (prefork and any pool that forks):
    a pool process claims, then sweeps, exactly like a beat-scheduled sweep.

    Runs on the consumer's timer (Celery's own event loop, or its timer thread), so the main process adds
    no thread and never touches the store or the metrics (whose multiprocess lock a fork would copy while
    another thread held it). The message goes to a queue this worker consumes and never expires (see
    `install_janitor`).
    """

    def __init__(self, app: Celery, timer: Any, interval_s: float) -> None:
        self.app = app
        self.timer = timer
        self.interval_s = interval_s
        self._entries: list[Any] = []

    @property
    def running(self) -> bool:
        return bool(self._entries)

    def start(self) -> None:
        if self._entries:  # started: a second pair of entries could never be cancelled
            return
        self._entries = [
            self.timer.call_after(0.0, self.send),  # the first claim at once, as beat's first sweep
            self.timer.call_repeatedly(self.interval_s, self.send),
        ]

    def stop(self) -> None:
        while self._entries:
            self._entries.pop().cancel()

    def send(self) -> None:
        """This interval's message; a broker that refuses it costs one interval and one log line."""
        try:
            self.app.send_task(
                JANITOR_TASK,
                kwargs={"claim_interval_s": self.interval_s},
                queue=self.queue(),
                retry=True,
                retry_policy=_SEND_RETRY,
            )
        except Exception as exc:  # noqa: BLE001 - a janitor that stops silently is the bug this prevents
            logger.warning(
                "in-worker janitor: could not send this interval's sweep (%s); trying again next interval",
                type(exc).__name__,
            )

    def queue(self) -> str | None:
        """The janitor's routed queue when this worker consumes it, else one this worker does consume."""
        consumed = list(self.app.amqp.queues.consume_from or ())
        routed = self.app.amqp.router.route({}, JANITOR_TASK).get("queue")
        name = getattr(routed, "name", routed)
        if not consumed or name in consumed:
            return None if name is None else str(name)
        return str(consumed[0])


def install_in_worker(
    app: Celery, run_sweep: Callable[[], Any], ledger: Callable[[], Ledger | None], interval_s: float
) -> list[Callable[..., None]]:
    """From `worker_ready` to `worker_shutdown`, every worker of `app` claims the sweep each interval, so any
    number of workers sweep once per interval between them. Returns the receivers, connected weakly."""
    from celery import signals

    janitors: list[InWorkerJanitor | JanitorMessages] = []

    def ready(sender: Any = None, **_: Any) -> None:
        from celery.concurrency import solo, thread

        if getattr(sender, "app", None) is not app or any(j.running for j in janitors):
            return  # another app's worker, or a consumer that became ready again (a reconnect)
        janitor: InWorkerJanitor | JanitorMessages
        if isinstance(getattr(sender, "pool", None), solo.TaskPool | thread.TaskPool):
            node = str(getattr(sender, "hostname", None) or socket.gethostname())
            janitor = InWorkerJanitor(run_sweep, ledger, interval_s, by=f"{node}:{os.getpid()}")
            where = "in this process"
        elif getattr(sender, "timer", None) is not None:
            janitor = JanitorMessages(app, sender.timer, interval_s)
            where = "in the pool's processes"
        else:
            logger.error("in-worker janitor: this worker has no timer to schedule sweeps on; nothing sweeps here")
            return
        janitors.append(janitor)
        janitor.start()
        logger.info(
            "in-worker janitor: claiming a sweep every %gs (MCP_TASKS_JANITOR=worker), sweeping %s", interval_s, where
        )

    def shutdown(sender: Any = None, **_: Any) -> None:
        if getattr(sender, "app", None) is app:
            while janitors:
                janitors.pop().stop()

    signals.worker_ready.connect(ready)
    signals.worker_shutdown.connect(shutdown)
    return [ready, shutdown]


# -- liveness -------------------------------------------------------------------------------------
# `janitor_age` and `janitor_stale` are the one definition of "stale" that `/readyz`, `doctor`, the metrics
# and the web process's janitor watch share. Ages are on the database's clock (the record's `read_at`), where
# sweeps stamp `swept_at`: a host whose clock differs from the sweepers' still reads them right.

_host_now_ms = now_ms  # this host's clock: the functions below take a `now_ms` argument of their own

STALE_INTERVALS = 3
"""No sweep for this many intervals: the janitor is stale."""

FIX = "run `celery -A APP beat`, or set MCP_TASKS_JANITOR=worker to sweep inside the workers"


def janitor_age(record: SweepRecord | None, now_ms: int | None = None) -> float | None:
    """Seconds since the last recorded sweep began; None when none was ever recorded.

    Measured against `now_ms` when given, else the database's clock when the record
    was read (`read_at`), else, for a record made by hand, this host's clock.
    """
    if record is None or record.swept_at is None:
        return None
    at = now_ms if now_ms is not None else record.read_at
    if at is None:
        at = _host_now_ms()
    return max(0, at - record.swept_at) / 1000


def janitor_stale(
    settings: Settings, record: SweepRecord | None, now_ms: int | None = None, *, since_ms: int | None = None
) -> bool:
    """No sweep for `STALE_INTERVALS` janitor intervals. Never stale when the interval is off.

    Without any recorded sweep: stale, unless `since_ms` (e.g. when this process
    started watching, on this host's clock) is less than three intervals ago: a
    fresh deployment's first sweep comes one interval after beat starts. Without
    `now_ms`, the age is on the database's clock (`janitor_age`), `since_ms` on this host's.
    """
    if settings.janitor_interval_s is None:
        return False
    age = janitor_age(record, now_ms)
    if age is None:
        if since_ms is None:
            return True
        age = ((_host_now_ms() if now_ms is None else now_ms) - since_ms) / 1000
    return age >= STALE_INTERVALS * settings.janitor_interval_s
