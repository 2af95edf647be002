"""The janitor's Celery side: its task, its beat schedule, and the in-worker janitor
(the sweep itself is `celery_mcp_tasks.janitor`).

With MCP_TASKS_JANITOR=beat (the default) the beat entry is added in
`on_after_configure` (or at once when the app is already configured) and
re-inserted at `beat_init`: either alone can be clobbered by a user's own
`beat_schedule` assignment. Each sweep message expires after one interval, so
sweeps missed while no worker ran do not pile up.

With MCP_TASKS_JANITOR=worker there is no beat entry: each worker's main process
(at `worker_ready`, so prefork children never run one) starts a thread that,
every interval, claims the sweep in the store's ledger and sweeps only when it
won. Any number of workers then sweep once per interval between them, and the
janitor lives exactly as long as some worker does.

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

from celery_mcp_tasks.model import now_ms
from celery_mcp_tasks.store.sweeps import JANITOR, SweepLedger

logger = logging.getLogger("celery_mcp_tasks.janitor")

JANITOR_TASK = "celery_mcp_tasks.janitor"


def janitor_entry(interval_s: float) -> dict[str, Any]:
    return {"task": JANITOR_TASK, "schedule": interval_s, "options": {"expires": interval_s}}


def install_janitor(
    app: Celery,
    run_sweep: Callable[[], Any],
    interval_s: float | None,
    *,
    in_worker: bool = False,
    ledger: Callable[[], SweepLedger | None] | None = None,
) -> None:
    """Register the janitor task; schedule it on beat, or (`in_worker`, with `ledger`) in every worker."""

    @app.task(name=JANITOR_TASK, ignore_result=True, shared=False)  # type: ignore[untyped-decorator]  # Celery ships no types
    def janitor() -> None:
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


class InWorkerJanitor:
    """A daemon thread that claims the sweep each interval and sweeps only when it won.

    Ticks at a fixed rate from its start (a slow sweep does not shift later ticks).
    A claim admits its claimant a little before the full interval (`SLACK`), so the
    worker that swept last keeps the rhythm instead of missing every other tick to
    clock jitter; two sweeps are still never closer than `(1 - SLACK)` intervals.
    Every error is a log line, and the loop goes on.
    """

    SLACK = 0.05

    def __init__(
        self, run_sweep: Callable[[], Any], ledger: Callable[[], SweepLedger | None], interval_s: float, by: str
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
        interval_ms = int(self.interval_s * 1000 * (1 - self.SLACK))
        if not ledger.claim(JANITOR, now_ms=now_ms(), interval_ms=interval_ms, by=self.by):
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


def install_in_worker(
    app: Celery, run_sweep: Callable[[], Any], ledger: Callable[[], SweepLedger | None], interval_s: float
) -> None:
    """Start an `InWorkerJanitor` in this app's worker main process when it is ready; stop it at shutdown."""
    janitors: list[InWorkerJanitor] = []

    def _ready(sender: Any = None, **_: Any) -> None:
        if getattr(sender, "app", None) is not app or any(j.running for j in janitors):
            return  # another app's worker, or a consumer that became ready again (a reconnect)
        node = str(getattr(sender, "hostname", None) or socket.gethostname())
        janitor = InWorkerJanitor(run_sweep, ledger, interval_s, by=f"{node}:{os.getpid()}")
        janitors.append(janitor)
        janitor.start()
        logger.info("in-worker janitor: claiming a sweep every %gs (MCP_TASKS_JANITOR=worker)", interval_s)

    def _shutdown(sender: Any = None, **_: Any) -> None:
        if getattr(sender, "app", None) is not app:
            return
        while janitors:
            janitors.pop().stop()

    signals.worker_ready.connect(_ready, weak=False)
    signals.worker_shutdown.connect(_shutdown, weak=False)
