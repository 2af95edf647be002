"""The web process watches the janitor: one warning when nobody swept for three intervals.

The janitor runs only where someone started `celery beat` or set MCP_TASKS_JANITOR=worker; forgetting
both used to be silent until "Task limit reached". A log line per change (stale, recovered), not per
interval; a hanging database costs the watch one thread, never one per interval.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from concurrent.futures import Future
from contextlib import asynccontextmanager
from typing import Any

from celery_mcp_tasks.config import Settings
from celery_mcp_tasks.model import now_ms
from celery_mcp_tasks.ops.probes import ProbeEngine, in_daemon_thread, janitor_record
from celery_mcp_tasks.plugin import Plugin, Runtime
from celery_mcp_tasks.store.ledger import SweepRecord
from celery_mcp_tasks.worker.janitor import FIX, janitor_age, janitor_stale

logger = logging.getLogger("celery_mcp_tasks.janitor")

STALE_EVENT = "celery_mcp_tasks.janitor.stale"
RECOVERED_EVENT = "celery_mcp_tasks.janitor.recovered"


class JanitorWatch:
    """Decides what to log for each reading of the ledger: a warning on going stale, a note on recovery."""

    def __init__(self, settings: Settings, *, since_ms: int) -> None:
        self.settings = settings
        self.since_ms = since_ms
        self.stale = False
        self.unreadable = False

    def observe(self, record: SweepRecord | None, now_ms: int | None = None) -> None:
        self.unreadable = False
        stale = janitor_stale(self.settings, record, now_ms, since_ms=self.since_ms)
        if stale and not self.stale:
            age = janitor_age(record, now_ms)
            ago = "no sweep was ever recorded" if age is None else f"the last sweep was {age:.0f}s ago"
            logger.warning(
                "the janitor is not sweeping: %s (expected every %gs), so expired tasks are not evicted, "
                "lost jobs are not settled and unanswered questions do not time out; %s",
                ago,
                self.settings.janitor_interval_s,
                FIX,
                extra={"event": STALE_EVENT, "age_s": age},
            )
        elif self.stale and not stale:
            logger.info("the janitor is sweeping again", extra={"event": RECOVERED_EVENT})
        self.stale = stale

    def failed(self, exc: BaseException) -> None:
        """The ledger could not be read: one warning per outage (readiness reports the store itself)."""
        if not self.unreadable:
            logger.warning("janitor watch: cannot read the sweep ledger (%s)", type(exc).__name__)
        self.unreadable = True


class LedgerReads:
    """The watch's reads of the ledger: each in a daemon thread through the probe engine, one at a time."""

    def __init__(self, probe: ProbeEngine) -> None:
        self.probe = probe
        self._reading: Future[SweepRecord | None] | None = None
        self.pending = False  # a read whose answer no call has returned yet

    @property
    def in_flight(self) -> bool:
        return self._reading is not None and not self._reading.done()

    async def read(self, timeout_s: float) -> SweepRecord | None:
        """The janitor's record; `TimeoutError` after `timeout_s`. The read goes on, and the next call waits
        for it again, never starts a second: a slow read is late, never lost, and a hung one costs one thread."""
        if self._reading is None or not self.pending:
            self._reading = in_daemon_thread(lambda: janitor_record(self.probe), name="mcp-tasks-janitor-watch")
            self.pending = True
        waiting = asyncio.wrap_future(self._reading)
        # A read that fails after the watch moved on is retrieved, not logged as "never retrieved".
        waiting.add_done_callback(lambda read: read.cancelled() or read.exception())
        done, _ = await asyncio.wait({waiting}, timeout=timeout_s)
        if not done:
            raise TimeoutError(f"no answer within {timeout_s:g}s")
        self.pending = False
        return waiting.result()


async def watch(settings: Settings, probe: ProbeEngine, *, since_ms: int) -> None:
    """Read the ledger once an interval until cancelled, on a fixed schedule from the start (a slow read pushes
    no later one back); a read that outlasts its wait is waited for again at once, not an interval later."""
    import anyio

    interval = settings.janitor_interval_s
    assert interval is not None
    state = JanitorWatch(settings, since_ms=since_ms)
    reads = LedgerReads(probe)
    start = anyio.current_time()
    while True:
        if not reads.pending:
            ticks = int((anyio.current_time() - start) / interval) + 1  # the next tick (a missed one is skipped)
            await anyio.sleep_until(start + ticks * interval)
        try:
            record = await reads.read(interval)
        except Exception as exc:  # noqa: BLE001 - a watch that fails must not end the server
            state.failed(exc)
            continue
        state.observe(record)


@asynccontextmanager
async def _watching(settings: Settings) -> AsyncIterator[None]:
    import anyio

    async with anyio.create_task_group() as group:
        probe = ProbeEngine(settings.store_url)
        group.start_soon(lambda: watch(settings, probe, since_ms=now_ms()))
        try:
            yield
        finally:
            group.cancel_scope.cancel()


class JanitorWatcher(Plugin):
    """The janitor watch plugin: the served app warns once when nobody swept for three intervals
    (MCP_TASKS_JANITOR_WATCH=on); nothing when sweeps are off."""

    def __init__(self) -> None:
        self._settings: Settings | None = None

    def setup(self, runtime: Runtime) -> None:
        self._settings = runtime.settings

    def serving(self) -> Any:
        settings = self._settings
        if settings is None or settings.janitor_interval_s is None:
            return None
        return _watching(settings)
