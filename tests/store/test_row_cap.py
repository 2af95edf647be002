"""The row cap's count starts from the janitor's last count of the rows (`quotas.RowBase`), not the table's first
row: at a million rows, counting them all took most of a second of the database's CPU once a second per process."""

from __future__ import annotations

from dataclasses import replace

from celery_mcp_tasks.model import TaskRecord, TaskStatus, now_ms
from celery_mcp_tasks.store.base import TaskLimitReached
from celery_mcp_tasks.store.ledger import JANITOR, SweepRecord
from celery_mcp_tasks.store.quotas import BASE_MARGIN_MS, BASE_REFRESH_S, RowBase, RowGauge
from celery_mcp_tasks.store.sql import SqlStore
from celery_mcp_tasks.store.sweeps import SweepLedger


def _record(key: str, created_at: int) -> TaskRecord:
    return TaskRecord(
        key=key,
        owner="sub:alice",
        tool="t",
        status=TaskStatus.WORKING,
        created_at=created_at,
        updated_at=created_at,
        ttl_ms=None,
        dispatches=1,
        heartbeat_at=created_at,
    )


def _refused(store: SqlStore, record: TaskRecord, max_rows: int) -> bool:
    try:
        store.create(record, max_rows=max_rows)
    except TaskLimitReached:
        return True
    return False


def test_without_a_sweep_every_row_counts(store: SqlStore) -> None:
    old = now_ms() - 3_600_000
    for n in range(3):
        store.create(_record(f"old{n}", old), max_rows=None)
    store._row_gauge = RowGauge(clock=lambda: 0.0)
    assert _refused(store, _record("new", now_ms()), max_rows=3)


def test_the_count_starts_from_the_janitors_last_count(store: SqlStore) -> None:
    """Rows created before the sweep's count are its count's, whatever the table holds (here the ledger says 1
    where 3 are: what the count would not walk shows); rows created since are counted on top of it."""
    old = now_ms() - 3_600_000
    for n in range(3):
        store.create(_record(f"old{n}", old), max_rows=None)
    SweepLedger(store.engine).record(JANITOR, duration_ms=0, report={}, statuses={"working": 1, "completed": 0})
    now = [0.0]
    store._row_gauge = RowGauge(clock=lambda: now[0])
    for n in range(2):  # 1 counted + 0, then + 1: room under a cap of 3
        assert not _refused(store, _record(f"new{n}", now_ms()), max_rows=3)
        now[0] += 1.0  # each creation counts again (`ROOM_CHECK_S`), from the same base
    assert _refused(store, _record("full", now_ms()), max_rows=3)  # 1 + 2
    # The sweep deletes, counts again and records it: a process sees that within BASE_REFRESH_S.
    SweepLedger(store.engine).record(JANITOR, duration_ms=0, report={}, statuses={"working": 0})
    now[0] += BASE_REFRESH_S
    assert not _refused(store, _record("later", now_ms()), max_rows=3)  # 0 + 2: the two since (the margin's)
    now[0] += 1.0
    assert _refused(store, _record("later2", now_ms()), max_rows=3)  # 0 + 3


def test_a_row_created_while_the_sweep_ran_counts_however_long_it_ran(store: SqlStore) -> None:
    """Created after the sweep counted (so not in its count) and stamped seconds before it recorded that count:
    a sweep whose count and record took longer than the margin must not lose it."""
    store.create(_record("during", now_ms() - 5_500), max_rows=None)
    SweepLedger(store.engine).record(JANITOR, duration_ms=6_000, report={}, statuses={"working": 0})
    store._row_gauge = RowGauge(clock=lambda: 0.0)
    assert _refused(store, _record("new", now_ms()), max_rows=1)


def test_the_base_starts_before_the_sweep_that_counted() -> None:
    """From the sweep's start, not its record: a row created while it counted, or between its count and its
    record (a wait for a connection), is counted on top of it."""
    sweep = SweepRecord(JANITOR, 10_000, 2_500, 1, {}, {"working": 4, "completed": 6}, None, None)
    assert RowBase.of(sweep) == RowBase(10, 10_000 - BASE_MARGIN_MS)
    assert RowBase.of(None) == RowBase(0, None)
    assert RowBase.of(replace(sweep, statuses={})) == RowBase(0, None)  # a ledger row with no count yet
    assert RowBase.of(replace(sweep, swept_at=None)) == RowBase(0, None)
