"""The janitor watch: one shared definition of stale (on the database's clock), and a web process that says
so once per change, with at most one read in flight however long the database hangs."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
import sqlalchemy as sa

from celery_mcp_tasks.config import Settings
from celery_mcp_tasks.migrate import upgrade
from celery_mcp_tasks.model import now_ms
from celery_mcp_tasks.ops.janitor_watch import JanitorWatch, LedgerReads, watch
from celery_mcp_tasks.ops.probes import ProbeEngine
from celery_mcp_tasks.store.engine import create_store_engine
from celery_mcp_tasks.store.ledger import SweepRecord
from celery_mcp_tasks.store.sql import SqlStore
from celery_mcp_tasks.store.sweeps import JANITOR
from celery_mcp_tasks.worker.janitor import janitor_age, janitor_stale
from tests.support import table_locked

EVERY_10S = Settings(janitor_interval_s=10)
T0 = 1_000_000


def swept(at_ms: int | None) -> SweepRecord:
    return SweepRecord("janitor", at_ms, 5, 1, {}, {}, None, None)


def test_the_age_is_seconds_since_the_last_sweep_and_none_before_the_first() -> None:
    assert janitor_age(None, T0) is None
    assert janitor_age(swept(None), T0) is None
    assert janitor_age(swept(T0 - 2_500), T0) == 2.5
    assert janitor_age(swept(T0 + 100), T0) == 0  # another host's clock a little ahead


def test_the_age_is_on_the_database_clock_the_record_was_read_with() -> None:
    read = SweepRecord("janitor", T0 - 2_000, 5, 1, {}, {}, None, None, read_at=T0)
    assert janitor_age(read) == 2.0  # whatever this host's clock says
    assert not janitor_stale(EVERY_10S, read)
    assert janitor_stale(EVERY_10S, SweepRecord("janitor", T0 - 30_000, 5, 1, {}, {}, None, None, read_at=T0))


def test_a_web_host_whose_clock_is_off_still_reads_a_fresh_sweep_as_fresh(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"sqlite:///{tmp_path / 'tasks.db'}"
    upgrade(url)
    store = SqlStore.from_url(url)
    try:
        store.ledger().record(JANITOR, duration_ms=0, report={}, statuses={})
        real_ns, real = time.time_ns, time.time
        monkeypatch.setattr(time, "time_ns", lambda: real_ns() + 120 * 10**9)  # this host: two minutes ahead
        monkeypatch.setattr(time, "time", lambda: real() + 120)
        record = store.ledger().last()
    finally:
        store.dispose()
    age = janitor_age(record)
    assert age is not None and age < 5
    assert not janitor_stale(EVERY_10S, record)


def test_stale_means_no_sweep_for_three_intervals() -> None:
    assert not janitor_stale(EVERY_10S, swept(T0 - 29_999), T0)
    assert janitor_stale(EVERY_10S, swept(T0 - 30_000), T0)


def test_never_swept_is_stale_unless_the_watch_began_less_than_three_intervals_ago() -> None:
    assert janitor_stale(EVERY_10S, None, T0)
    assert not janitor_stale(EVERY_10S, None, T0, since_ms=T0 - 29_999)
    assert janitor_stale(EVERY_10S, None, T0, since_ms=T0 - 30_000)


def test_with_sweeps_off_nothing_is_stale() -> None:
    assert not janitor_stale(Settings(janitor_interval_s=None), None, T0)


def test_the_watch_warns_once_then_notes_the_recovery_then_warns_again(caplog: pytest.LogCaptureFixture) -> None:
    state = JanitorWatch(EVERY_10S, since_ms=T0)
    with caplog.at_level(logging.INFO, logger="celery_mcp_tasks.janitor"):
        for tick in range(1, 7):  # never swept: stale from the third interval on, said once
            state.observe(None, T0 + tick * 10_000)
        state.observe(swept(T0 + 65_000), T0 + 70_000)  # sweeps resume
        state.observe(swept(T0 + 75_000), T0 + 80_000)
        for tick in range(9, 14):  # and stop again
            state.observe(swept(T0 + 75_000), T0 + tick * 10_000)
    said = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert [level for level, _ in said] == ["WARNING", "INFO", "WARNING"]
    assert said[0][1] == (
        "the janitor is not sweeping: no sweep was ever recorded (expected every 10s), so expired tasks are not "
        "evicted, lost jobs are not settled and unanswered questions do not time out; run `celery -A APP beat`, "
        "or set MCP_TASKS_JANITOR=worker to sweep inside the workers"
    )
    assert "the last sweep was 35s ago" in said[2][1]


def test_an_unreadable_ledger_is_one_warning_per_outage(caplog: pytest.LogCaptureFixture) -> None:
    state = JanitorWatch(EVERY_10S, since_ms=T0)
    with caplog.at_level(logging.WARNING, logger="celery_mcp_tasks.janitor"):
        for _ in range(3):
            state.failed(RuntimeError("down"))
        state.observe(swept(T0), T0)
        state.failed(RuntimeError("down"))
    assert [r.getMessage() for r in caplog.records] == [
        "janitor watch: cannot read the sweep ledger (RuntimeError)"
    ] * 2


def test_the_watch_loop_reads_a_real_ledger_and_warns(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    url = f"sqlite:///{tmp_path / 'tasks.db'}"
    upgrade(url)
    settings = Settings(janitor_interval_s=0.05)

    async def main() -> None:
        with anyio.move_on_after(0.5):
            await watch(settings, ProbeEngine(url), since_ms=0)

    with caplog.at_level(logging.WARNING, logger="celery_mcp_tasks.janitor"):
        anyio.run(main)
    said = [r.getMessage() for r in caplog.records if r.name == "celery_mcp_tasks.janitor"]
    # A first read slower than the 50 ms interval (a loaded machine) adds "cannot read ... (TimeoutError)".
    (warning,) = [line for line in said if line.startswith("the janitor is not sweeping")]
    assert warning.startswith("the janitor is not sweeping: no sweep was ever recorded")


# -- a database that hangs (real PostgreSQL, a real lock) -------------------------------------


def waiting_on_locks(url: str) -> int:
    """Backends of this database waiting for a lock right now."""
    engine = create_store_engine(url, poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            query = (
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
            )
            return int(conn.execute(sa.text(query)).scalar_one())
    finally:
        engine.dispose()


@pytest.fixture
def locked_ledger(postgres_url: str) -> Iterator[tuple[str, threading.Event]]:
    """The sweep table locked (ACCESS EXCLUSIVE) by another session until the event is set: every read waits."""
    upgrade(postgres_url)
    with table_locked(postgres_url, "mcp_tasks_sweep") as release:
        yield postgres_url, release


@pytest.mark.postgres
def test_while_the_database_hangs_the_watch_keeps_one_read_in_flight(
    locked_ledger: tuple[str, threading.Event], caplog: pytest.LogCaptureFixture
) -> None:
    """Before: every interval abandoned the hung read and started another on the store's pool (ten intervals,
    ten connections waiting). Now a read still running is waited for, and the probe's statement timeout ends it."""
    url, release = locked_ledger
    settings = Settings(janitor_interval_s=0.1)
    most = 0

    async def main() -> None:
        nonlocal most
        async with anyio.create_task_group() as group:
            group.start_soon(lambda: watch(settings, ProbeEngine(url), since_ms=now_ms()))
            for _ in range(12):
                await anyio.sleep(0.1)
                most = max(most, await anyio.to_thread.run_sync(waiting_on_locks, url))
            group.cancel_scope.cancel()

    with caplog.at_level(logging.WARNING, logger="celery_mcp_tasks.janitor"):
        anyio.run(main)
    release.set()
    assert most == 1, f"{most} reads waited on the lock at once"
    said = [r.getMessage() for r in caplog.records if r.name == "celery_mcp_tasks.janitor"]
    assert said == ["janitor watch: cannot read the sweep ledger (TimeoutError)"], said  # once per outage


@pytest.mark.postgres
def test_a_hung_read_ends_at_the_probe_statement_timeout(locked_ledger: tuple[str, threading.Event]) -> None:
    url, _ = locked_ledger
    reads = LedgerReads(ProbeEngine(url))

    async def main() -> BaseException | None:
        try:
            await reads.read(10)
        except Exception as exc:  # noqa: BLE001 - the answer under test
            return exc
        return None

    started = time.monotonic()
    failed = anyio.run(main)
    elapsed = time.monotonic() - started
    assert isinstance(failed, sa.exc.OperationalError) and "statement timeout" in str(failed), failed
    assert 2.5 < elapsed < 6, elapsed  # PROBE_TIMEOUT_S, not the lock holder's 30 s
    assert not reads.in_flight


@pytest.mark.postgres
def test_a_read_slower_than_one_wait_is_waited_for_again_and_its_answer_used(
    locked_ledger: tuple[str, threading.Event],
) -> None:
    """Before: the wait after a timeout failed at once ("the previous read has not returned"), and the slow
    read's answer was dropped; on a loaded machine that pushed the stale warning back by whole intervals."""
    url, release = locked_ledger
    reads = LedgerReads(ProbeEngine(url))

    async def main() -> tuple[BaseException | None, SweepRecord | None]:
        try:
            await reads.read(0.2)
        except TimeoutError as exc:
            first: BaseException | None = exc
        else:
            first = None
        assert reads.pending and reads.in_flight
        threading.Timer(0.3, release.set).start()  # the lock goes while the second wait is on
        return first, await reads.read(10)

    first, record = anyio.run(main)
    assert isinstance(first, TimeoutError) and str(first) == "no answer within 0.2s"
    assert record is None  # the same read's answer: nothing swept yet
    assert not reads.pending and not reads.in_flight
