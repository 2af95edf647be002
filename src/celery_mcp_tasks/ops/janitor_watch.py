"""The web process watches the janitor: one warning when nobody swept for three intervals.

Everything that keeps tasks healthy (TTL eviction, the lost-job reaper, the input
timeout) runs in the janitor, and the janitor runs only where someone started
`celery beat` or set MCP_TASKS_JANITOR=worker. Forgetting both used to be silent
until "Task limit reached". Each sweep records itself in the store's sweep ledger;
this watch reads it every interval, in a thread (a hanging database never blocks
the event loop), and says so once when it goes stale, once when sweeps come back,
and once more if they stop again: a log line per change, not per interval.

`janitor_age` and `janitor_stale` are the one definition of "stale" that
`/readyz`, `doctor` and the metrics share with this watch.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

from celery_mcp_tasks.config import Settings
from celery_mcp_tasks.model import now_ms as _now_ms
from celery_mcp_tasks.store.sweeps import JANITOR, SweepLedger, SweepRecord

if TYPE_CHECKING:
    from celery_mcp_tasks.app import McpTasks

__all__ = ["STALE_INTERVALS", "JanitorWatch", "install", "janitor_age", "janitor_stale"]

logger = logging.getLogger("celery_mcp_tasks.janitor")

STALE_INTERVALS = 3
"""No sweep for this many intervals: the janitor is stale."""

STALE_EVENT = "celery_mcp_tasks.janitor.stale"
RECOVERED_EVENT = "celery_mcp_tasks.janitor.recovered"

FIX = "run `celery -A APP beat`, or set MCP_TASKS_JANITOR=worker to sweep inside the workers"


def janitor_age(record: SweepRecord | None, now_ms: int | None = None) -> float | None:
    """Seconds since the last recorded sweep began; None when none was ever recorded."""
    if record is None or record.swept_at is None:
        return None
    at = _now_ms() if now_ms is None else now_ms
    return max(0, at - record.swept_at) / 1000


def janitor_stale(
    settings: Settings, record: SweepRecord | None, now_ms: int | None = None, *, since_ms: int | None = None
) -> bool:
    """No sweep for `STALE_INTERVALS` janitor intervals. Never stale when the interval is off.

    Without any recorded sweep: stale, unless `since_ms` (e.g. when this process
    started watching) is less than three intervals ago: a fresh deployment's first
    sweep comes one interval after beat starts.
    """
    interval = settings.janitor_interval_s
    if interval is None:
        return False
    at = _now_ms() if now_ms is None else now_ms
    bound_s = STALE_INTERVALS * interval
    age = janitor_age(record, at)
    if age is None:
        return since_ms is None or (at - since_ms) / 1000 >= bound_s
    return age >= bound_s


class JanitorWatch:
    """Decides what to log for each reading of the ledger: a warning on going stale, a note on recovery."""

    def __init__(self, settings: Settings, *, since_ms: int) -> None:
        self.settings = settings
        self.since_ms = since_ms
        self.stale = False
        self.unreadable = False

    def observe(self, record: SweepRecord | None, now_ms: int) -> None:
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


async def watch(settings: Settings, ledger: Callable[[], SweepLedger | None], *, since_ms: int) -> None:
    """Read the ledger every interval until cancelled; each read in a thread, bounded by one interval."""
    import anyio

    interval = settings.janitor_interval_s
    assert interval is not None
    state = JanitorWatch(settings, since_ms=since_ms)

    def read() -> SweepRecord | None:
        found = ledger()
        return None if found is None else found.last(JANITOR)

    while True:
        await anyio.sleep(interval)
        try:
            with anyio.fail_after(interval):
                record = await anyio.to_thread.run_sync(read, abandon_on_cancel=True)
        except Exception as exc:  # noqa: BLE001 - a watch that fails must not end the server
            state.failed(exc)
            continue
        state.observe(record, _now_ms())


def install(tasks: McpTasks) -> None:
    """Watch the janitor for as long as the app is served (nothing when sweeps are off)."""
    settings = tasks.settings
    if settings.janitor_interval_s is None:
        return

    @asynccontextmanager
    async def watching() -> AsyncIterator[None]:
        import anyio

        async with anyio.create_task_group() as group:
            group.start_soon(lambda: watch(settings, tasks.ledger, since_ms=_now_ms()))
            try:
                yield
            finally:
                group.cancel_scope.cancel()

    tasks.serving_contexts.append(watching)
