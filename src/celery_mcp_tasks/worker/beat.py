"""The janitor's Celery side: its task, its beat schedule, and the in-worker janitor
(the sweep itself is `celery_mcp_tasks.janitor`).

With MCP_TASKS_JANITOR=beat (the default) the beat entry is added in
`on_after_configure` (or at once when the app is already configured) and
re-inserted at `beat_init`: either alone can be clobbered by a user's own
`beat_schedule` assignment. Each sweep message expires after one interval, so
sweeps missed while no worker ran do not pile up.

With MCP_TASKS_JANITOR=worker there is no beat entry: every worker, from
`worker_ready` to `worker_shutdown`, claims the sweep in the store's ledger each
interval, and only the claimant that won sweeps. Any number of workers then sweep
once per interval between them, and the janitor lives exactly as long as some
worker does. Where the claim and the sweep run depends on the pool:

- prefork (and any pool but solo and threads): the worker's main process only
  *sends*, from Celery's own timer (the thread that forks the pool, or Celery's
  timer thread), one janitor message per interval that expires after one
  interval; a pool process claims and, when it won, sweeps, exactly like a
  beat-scheduled sweep. Nothing in the main process touches the store or the
  metrics (whose multiprocess lock a fork would copy while another thread held
  it, leaving the new child hung on its first metric write).
- solo and threads (nothing forks): a thread claims and sweeps in process.

`MCP_TASKS_JANITOR_INTERVAL_S=off` opts out of both; the task stays registered
for a hand-run sweep.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from celery import Celery, signals

from celery_mcp_tasks.store.base import Ledger
from celery_mcp_tasks.store.sweeps import JANITOR

logger = logging.getLogger("celery_mcp_tasks.janitor")

JANITOR_TASK = "celery_mcp_tasks.janitor"

SLACK = 0.05
"""A claim admits its claimant this share of an interval early, so the last sweeper keeps the rhythm
instead of missing every other tick to jitter; two sweeps are never closer than `1 - SLACK` intervals."""

# Sending this interval's janitor message: two quick retries, then the interval is missed (one log line).
_SEND_RETRY: dict[str, Any] = {"max_retries": 2, "interval_start": 0, "interval_step": 0.2, "interval_max": 0.5}


def janitor_entry(interval_s: float) -> dict[str, Any]:
    return {"task": JANITOR_TASK, "schedule": interval_s, "options": {"expires": interval_s}}


def install_janitor(
    app: Celery,
    run_sweep: Callable[[], Any],
    interval_s: float | None,
    *,
    in_worker: bool = False,
    ledger: Callable[[], Ledger | None] | None = None,
) -> None:
    """Register the janitor task; schedule it on beat, or (`in_worker`, with `ledger`) in every worker.

    The task sweeps unconditionally (beat, a hand-run sweep); with `claim_interval_s`
    (the in-worker janitor's messages) it first claims that interval and sweeps only when it won.
    """

    @app.task(name=JANITOR_TASK, ignore_result=True, shared=False, bind=True)  # type: ignore[untyped-decorator]  # Celery ships no types
    def janitor(task: Any, claim_interval_s: float | None = None) -> None:
        if claim_interval_s is not None:
            found = ledger() if ledger is not None else None
            by = f"{task.request.hostname or socket.gethostname()}:{os.getpid()}"
            if found is None or not claim(found, claim_interval_s, by):
                return
        run_sweep()

    if interval_s is None:
        return
    if in_worker:
        if ledger is None:
            raise ValueError("the in-worker janitor needs the sweep ledger")
        install_in_worker(app, run_sweep, ledger, interval_s)
        return
    entry = janitor_entry(interval_s)

    def add(conf: Any) -> None:
        schedule = conf.beat_schedule or {}
        if JANITOR_TASK not in schedule:  # a copy: the default dict may be shared between apps
            conf.beat_schedule = {**schedule, JANITOR_TASK: entry}

    def _add(sender: Celery, **_: Any) -> None:
        add(sender.conf)

    app.on_after_configure.connect(_add, weak=False)  # connected by call, as in the bridge: Celery is untyped

    if app.configured:
        add(app.conf)

    def _ensure(sender: Any = None, **_: Any) -> None:
        scheduler = getattr(sender, "scheduler", None)
        if scheduler is None or scheduler.app is not app or JANITOR_TASK in scheduler.schedule:
            return
        logger.info("re-inserting the janitor into a beat schedule that dropped it")
        scheduler.update_from_dict({JANITOR_TASK: entry})

    signals.beat_init.connect(_ensure, weak=False)


def claim(ledger: Ledger, interval_s: float, by: str) -> bool:
    """This interval's sweep, claimed in the ledger (on the database's clock); True for one claimant."""
    return ledger.claim(JANITOR, interval_ms=int(interval_s * 1000 * (1 - SLACK)), by=by)


class InWorkerJanitor:
    """A daemon thread that claims the sweep each interval and sweeps only when it won (solo and threads pools).

    Ticks at a fixed rate from its start (a slow sweep does not shift later ticks).
    Every error is a log line, and the loop goes on.
    """

    def __init__(
        self, run_sweep: Callable[[], Any], ledger: Callable[[], Ledger | None], interval_s: float, by: str
    ) -> None:
        self.run_sweep = run_sweep
        self.ledger = ledger
        self.interval_s = interval_s
        self.by = by
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        if self.running:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="celery-mcp-tasks-janitor", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def tick(self) -> bool:
        """Claim this interval; sweep when it is ours. True when this worker swept."""
        ledger = self.ledger()
        if ledger is None:
            return False
        if not claim(ledger, self.interval_s, self.by):
            return False
        self.run_sweep()
        return True

    def _loop(self) -> None:
        due = time.monotonic()
        while not self._stop.wait(max(0.0, due - time.monotonic())):
            try:
                self.tick()
            except Exception as exc:  # a janitor that stops silently is the bug this prevents
                logger.warning(
                    "in-worker janitor: the sweep failed (%s); trying again next interval", type(exc).__name__
                )
                logger.debug("in-worker janitor failure", exc_info=True)
            due += self.interval_s
            if due < time.monotonic():  # fell behind (a long sweep): next tick from now, no burst
                due = time.monotonic() + self.interval_s


class JanitorMessages:
    """Each interval, one janitor message from the worker's main process: a pool process claims, then sweeps.

    Runs on the consumer's timer (Celery's own event loop, or its timer thread), so
    the main process adds no thread of its own and never touches the store or the
    metrics. The message goes to a queue this worker consumes (the janitor's routed
    queue when it is one of them) and expires after one interval, like beat's.
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
        if not self._entries:
            self._entries = [
                self.timer.call_after(0.0, self.send),  # the first claim at once, as beat's first sweep
                self.timer.call_repeatedly(self.interval_s, self.send),
            ]

    def stop(self, timeout: float = 5.0) -> None:
        while self._entries:
            self._entries.pop().cancel()

    def send(self) -> None:
        """This interval's message; a broker that refuses it costs one interval and one log line."""
        try:
            self.app.send_task(
                JANITOR_TASK,
                kwargs={"claim_interval_s": self.interval_s},
                expires=self.interval_s,
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


def in_process(pool: Any) -> bool:
    """Pools that never fork (solo, threads): the in-worker janitor may claim and sweep in a thread of its own."""
    from celery.concurrency import solo, thread

    return isinstance(pool, solo.TaskPool | thread.TaskPool)


def install_in_worker(
    app: Celery, run_sweep: Callable[[], Any], ledger: Callable[[], Ledger | None], interval_s: float
) -> None:
    """Start this app's in-worker janitor when its worker is ready; stop it at shutdown."""
    janitors: list[InWorkerJanitor | JanitorMessages] = []

    def _ready(sender: Any = None, **_: Any) -> None:
        if getattr(sender, "app", None) is not app or any(j.running for j in janitors):
            return  # another app's worker, or a consumer that became ready again (a reconnect)
        janitor: InWorkerJanitor | JanitorMessages
        if in_process(getattr(sender, "pool", None)):
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

    def _shutdown(sender: Any = None, **_: Any) -> None:
        if getattr(sender, "app", None) is not app:
            return
        while janitors:
            janitors.pop().stop()

    signals.worker_ready.connect(_ready, weak=False)
    signals.worker_shutdown.connect(_shutdown, weak=False)
