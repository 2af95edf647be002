"""The sweep ledger on SQLite and PostgreSQL: a recorded sweep reads back, and of many
claimants at once exactly one wins each interval."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from celery_mcp_tasks.model import TaskRecord, TaskStatus
from celery_mcp_tasks.store import StoreUnavailable
from celery_mcp_tasks.store.sql import SqlStore
from celery_mcp_tasks.store.sweeps import SweepLedger, count_by_status, ledger_for


def _record(key: str, status: TaskStatus) -> TaskRecord:
    return TaskRecord(key=key, owner=None, tool="t", status=status, created_at=1, updated_at=1, ttl_ms=None)


def test_a_ledger_without_sweeps_reads_none(store: SqlStore):
    assert ledger_for(store).last() is None
    assert ledger_for(store).last("other") is None


def test_ledger_for_is_one_ledger_per_store(store: SqlStore):
    assert ledger_for(store) is ledger_for(store)
    assert ledger_for(store).engine is store.engine


def test_a_recorded_sweep_reads_back_and_counts(store: SqlStore):
    ledger = ledger_for(store)
    ledger.record("janitor", at_ms=1_000, duration_ms=12, report={"removed": 3}, statuses={"working": 2})
    ledger.record("janitor", at_ms=2_000, duration_ms=7, report={"removed": 0, "resent": 1}, statuses={})
    last = ledger.last()
    assert last is not None
    assert (last.swept_at, last.duration_ms, last.sweeps) == (2_000, 7, 2)
    assert last.report == {"removed": 0, "resent": 1}
    assert last.statuses == {}
    assert (last.claimed_at, last.claimed_by) == (None, None)  # a beat sweep never claims


def test_a_claim_keeps_the_sweep_history(store: SqlStore):
    ledger = ledger_for(store)
    ledger.record("janitor", at_ms=1_000, duration_ms=1, report={"removed": 1}, statuses={"working": 1})
    assert ledger.claim("janitor", now_ms=5_000, interval_ms=1_000, by="host-1")
    last = ledger.last()
    assert last is not None
    assert (last.claimed_at, last.claimed_by, last.sweeps, last.swept_at) == (5_000, "host-1", 1, 1_000)


def test_a_claim_holds_for_one_interval(store: SqlStore):
    ledger = ledger_for(store)
    assert ledger.claim("janitor", now_ms=10_000, interval_ms=1_000, by="a")
    assert not ledger.claim("janitor", now_ms=10_999, interval_ms=1_000, by="b")
    assert ledger.claim("janitor", now_ms=11_000, interval_ms=1_000, by="b")
    assert not ledger.claim("janitor", now_ms=11_500, interval_ms=1_000, by="a")
    last = ledger.last()
    assert last is not None and (last.claimed_at, last.claimed_by) == (11_000, "b")


def test_duties_claim_independently(store: SqlStore):
    ledger = ledger_for(store)
    assert ledger.claim("janitor", now_ms=1, interval_ms=1_000, by="a")
    assert ledger.claim("other", now_ms=1, interval_ms=1_000, by="a")


@pytest.mark.parametrize("claimants", [8])
def test_of_many_claimants_at_once_exactly_one_wins_each_interval(store_url: str, claimants: int):
    """Threads on their own engines (as separate workers are), released together by a barrier."""
    rounds = 15
    stores = [SqlStore.from_url(store_url) for _ in range(claimants)]
    barrier = threading.Barrier(claimants)

    def claimant(n: int) -> list[int]:
        ledger = SweepLedger(stores[n].engine)
        won = []
        for interval in range(rounds):
            barrier.wait(timeout=60)
            # Clocks differ a little between hosts: every claimant is inside the same interval.
            if ledger.claim(
                "janitor", now_ms=1_000_000 + interval * 1_000 + n, interval_ms=1_000 - claimants, by=f"w{n}"
            ):
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
            ledger_for(store).last()
        assert caught.value.operation == "last"
        with pytest.raises(StoreUnavailable):
            ledger_for(store).claim("janitor", now_ms=1, interval_ms=1, by="a")
    finally:
        store.dispose()
