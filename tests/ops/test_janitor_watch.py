"""The janitor watch: one shared definition of stale, and a web process that says so once per change."""

from __future__ import annotations

import logging
from pathlib import Path

import anyio
import pytest

from celery_mcp_tasks.config import Settings
from celery_mcp_tasks.migrate import upgrade
from celery_mcp_tasks.ops.janitor_watch import JanitorWatch, janitor_age, janitor_stale, watch
from celery_mcp_tasks.store.sql import SqlStore
from celery_mcp_tasks.store.sweeps import SweepLedger, SweepRecord, ledger_for

EVERY_10S = Settings(janitor_interval_s=10)
T0 = 1_000_000


def swept(at_ms: int | None) -> SweepRecord:
    return SweepRecord("janitor", at_ms, 5, 1, {}, {}, None, None)


def test_the_age_is_seconds_since_the_last_sweep_and_none_before_the_first() -> None:
    assert janitor_age(None, T0) is None
    assert janitor_age(swept(None), T0) is None
    assert janitor_age(swept(T0 - 2_500), T0) == 2.5
    assert janitor_age(swept(T0 + 100), T0) == 0  # another host's clock a little ahead


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
    store = SqlStore.from_url(url)
    settings = Settings(janitor_interval_s=0.05)
    ledger: SweepLedger = ledger_for(store)

    async def main() -> None:
        with anyio.move_on_after(0.5):
            await watch(settings, lambda: ledger, since_ms=0)

    try:
        with caplog.at_level(logging.WARNING, logger="celery_mcp_tasks.janitor"):
            anyio.run(main)
    finally:
        store.dispose()
    (line,) = caplog.records
    assert line.getMessage().startswith("the janitor is not sweeping: no sweep was ever recorded")
