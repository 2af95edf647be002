"""The sweep ledger on SQLite and PostgreSQL: a recorded sweep reads back, of many
claimants at once exactly one wins each interval, and every time is the database's clock."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import pytest
import sqlalchemy as sa

from celery_mcp_tasks.model import TaskRecord, TaskStatus, now_ms
from celery_mcp_tasks.store import StoreUnavailable
from celery_mcp_tasks.store.schema import sweeps
from celery_mcp_tasks.store.sql import SqlStore
from celery_mcp_tasks.store.sweeps import SweepLedger, count_by_status


def _record(key: str, status: TaskStatus) -> TaskRecord:
    return TaskRecord(key=key, owner=None, tool="t", status=status, created_at=1, updated_at=1, ttl_ms=None)


def test_a_ledger_without_sweeps_reads_none(store: SqlStore):
    assert store.ledger().last() is None
    assert store.ledger().last("other") is None


def test_a_store_keeps_one_ledger(store: SqlStore):
    assert store.ledger() is store.ledger()
    assert store.ledger().engine is store.engine


def age_claim(store: SqlStore, by_ms: int, name: str = "janitor") -> None:
    """Move the row's claim `by_ms` into the past, as if that much time had passed since."""
    with store.engine.begin() as conn:
        conn.execute(sa.update(sweeps).where(sweeps.c.name == name).values(claimed_at=sweeps.c.claimed_at - by_ms))


@contextmanager
def clock_behind(monkeypatch: pytest.MonkeyPatch, seconds: float) -> Iterator[None]:
    """This process's wall clock `seconds` behind (a host whose NTP is off); the database's is untouched."""
    real_ns, real = time.time_ns, time.time
    with monkeypatch.context() as patched:
        patched.setattr(time, "time_ns", lambda: real_ns() - int(seconds * 1e9))
        patched.setattr(time, "time", lambda: real() - seconds)
        yield


def test_a_recorded_sweep_reads_back_and_counts(store: SqlStore):
    ledger = store.ledger()
    ledger.record("janitor", duration_ms=12, report={"removed": 3}, statuses={"working": 2})
    before = now_ms()
    ledger.record("janitor", duration_ms=7, report={"removed": 0, "resent": 1}, statuses={})
    last = ledger.last()
    assert last is not None
    assert (last.duration_ms, last.sweeps) == (7, 2)
    assert last.swept_at is not None and before - 7 <= last.swept_at <= now_ms() - 7  # began duration_ms ago
    assert last.read_at is not None and last.swept_at + 7 <= last.read_at <= now_ms()
    assert last.report == {"removed": 0, "resent": 1}
    assert last.statuses == {}
    assert (last.claimed_at, last.claimed_by) == (None, None)  # a beat sweep never claims


def test_a_record_is_stamped_by_the_database_clock_not_the_callers(store: SqlStore, monkeypatch: pytest.MonkeyPatch):
    ledger = store.ledger()
    with clock_behind(monkeypatch, 600):
        ledger.record("janitor", duration_ms=0, report={}, statuses={})
    last = ledger.last()
    assert last is not None and last.swept_at is not None and last.read_at is not None
    assert abs(last.swept_at - now_ms()) < 5_000, "swept_at must not carry the caller's 10-minute skew"
    assert 0 <= last.read_at - last.swept_at < 5_000


def test_a_claim_keeps_the_sweep_history(store: SqlStore):
    ledger = store.ledger()
    ledger.record("janitor", duration_ms=1, report={"removed": 1}, statuses={"working": 1})
    swept_at = ledger.last().swept_at  # type: ignore[union-attr]
    before = now_ms()
    assert ledger.claim("janitor", interval_ms=1_000, by="host-1")
    last = ledger.last()
    assert last is not None and last.claimed_at is not None
    assert (last.claimed_by, last.sweeps, last.swept_at) == ("host-1", 1, swept_at)
    assert before <= last.claimed_at <= now_ms()


def test_a_claim_holds_for_one_interval(store: SqlStore):
    ledger = store.ledger()
    assert ledger.claim("janitor", interval_ms=60_000, by="a")
    assert not ledger.claim("janitor", interval_ms=60_000, by="b")
    age_claim(store, 59_000)  # 59 s later: still a's interval
    assert not ledger.claim("janitor", interval_ms=60_000, by="b")
    age_claim(store, 1_000)  # a full interval since a's claim
    assert ledger.claim("janitor", interval_ms=60_000, by="b")
    assert not ledger.claim("janitor", interval_ms=60_000, by="a")
    last = ledger.last()
    assert last is not None and last.claimed_by == "b"


def test_a_claimant_whose_clock_is_behind_does_not_open_the_next_interval_early(
    store: SqlStore, monkeypatch: pytest.MonkeyPatch
):
    """With the callers' clocks, a claim stamped 30 s in the past let a worker with a right clock claim (and
    sweep) again at once: two sweeps within one 10 s interval. On the database's clock, one."""
    ledger = store.ledger()
    with clock_behind(monkeypatch, 30):
        assert ledger.claim("janitor", interval_ms=10_000, by="behind")
    assert not ledger.claim("janitor", interval_ms=10_000, by="right")
    with clock_behind(monkeypatch, -30):  # nor does one whose clock is ahead
        assert not ledger.claim("janitor", interval_ms=10_000, by="ahead")
    last = ledger.last()
    assert last is not None and last.claimed_by == "behind"
    assert last.claimed_at is not None and abs(last.claimed_at - now_ms()) < 5_000


def test_duties_claim_independently(store: SqlStore):
    ledger = store.ledger()
    assert ledger.claim("janitor", interval_ms=1_000, by="a")
    assert ledger.claim("other", interval_ms=1_000, by="a")


@pytest.mark.parametrize("claimants", [8])
def test_of_many_claimants_at_once_exactly_one_wins_each_interval(store_url: str, claimants: int):
    """Threads on their own engines (as separate workers are), released together by a barrier; between
    rounds the claim is aged by one interval, as if the interval had passed."""
    rounds = 15
    stores = [SqlStore.from_url(store_url) for _ in range(claimants)]
    barrier = threading.Barrier(claimants, action=lambda: age_claim(stores[0], 60_000))

    def claimant(n: int) -> list[int]:
        ledger = SweepLedger(stores[n].engine)
        won = []
        for interval in range(rounds):
            barrier.wait(timeout=60)
            if ledger.claim("janitor", interval_ms=60_000, by=f"w{n}"):
                won.append(interval)
        return won

    try:
        with ThreadPoolExecutor(claimants) as pool:
            results = list(pool.map(claimant, range(claimants)))
    finally:
        for s in stores:
            s.dispose()
    wins = sorted(interval for won in results for interval in won)
    assert wins == list(range(rounds)), results


def test_count_by_status_names_every_status(store: SqlStore):
    assert count_by_status(store.engine) == {status.value: 0 for status in TaskStatus}
    for n, status in enumerate([TaskStatus.WORKING, TaskStatus.WORKING, TaskStatus.INPUT_REQUIRED, TaskStatus.FAILED]):
        store.create(_record(f"k{n}", status), max_rows=None)
    assert count_by_status(store.engine) == {
        "working": 2,
        "input_required": 1,
        "completed": 0,
        "failed": 1,
        "cancelled": 0,
    }


def test_a_ledger_whose_table_is_missing_reports_the_store_unavailable(tmp_path):
    store = SqlStore.from_url(f"sqlite:///{tmp_path / 'empty.db'}")
    try:
        with pytest.raises(StoreUnavailable) as caught:
            store.ledger().last()
        assert caught.value.operation == "last"
        with pytest.raises(StoreUnavailable):
            store.ledger().claim("janitor", interval_ms=1, by="a")
    finally:
        store.dispose()
