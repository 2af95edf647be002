"""Eviction tells which expired rows were unfinished (by tool), on SQLite and PostgreSQL."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from celery_mcp_tasks.migrate import upgrade
from celery_mcp_tasks.model import TaskRecord, TaskStatus
from celery_mcp_tasks.store import ANY
from celery_mcp_tasks.store.schema import tasks
from celery_mcp_tasks.store.sql import SqlStore
from tests.conftest import needs_postgres
from tests.support import POSTGRES_URL, fresh_postgres_database


def make(key: str, tool: str = "t", **changes: object) -> TaskRecord:
    values: dict[str, object] = dict(
        key=key, owner=None, tool=tool, status=TaskStatus.WORKING, created_at=0, updated_at=0, ttl_ms=10
    )
    values.update(changes)
    return TaskRecord(**values)  # type: ignore[arg-type]


def test_eviction_counts_the_rows_that_were_not_final_by_tool_across_batches(store: SqlStore) -> None:
    for n in range(3):
        store.create(make(f"working{n}", "report"), max_rows=None)
    store.create(make("asking", "ask", status=TaskStatus.INPUT_REQUIRED), max_rows=None)
    for n, status in enumerate((TaskStatus.COMPLETED, TaskStatus.FAILED, TaskStatus.CANCELLED)):
        store.create(make(f"done{n}", "report", status=status), max_rows=None)
    store.create(make("old-done", "ask", ttl_ms=None, status=TaskStatus.COMPLETED), max_rows=None)
    store.create(make("live", "report", ttl_ms=60_000), max_rows=None)

    eviction = store.evict(now_ms=5_000, retention_ms=1_000, batch_size=2)

    assert eviction.removed == 8
    assert dict(eviction.unfinished) == {"report": 3, "ask": 1}  # final ones were counted when they ended
    assert store.get("live") is not None
    assert store.evict(now_ms=5_000, retention_ms=1_000, batch_size=2).removed == 0


def test_cleanup_still_answers_the_total_alone(store: SqlStore) -> None:
    store.create(make("working"), max_rows=None)
    store.create(make("done", status=TaskStatus.COMPLETED), max_rows=None)

    assert store.evict(now_ms=5_000, retention_ms=1_000, batch_size=10).removed == 2


@needs_postgres
@pytest.mark.postgres
def test_a_row_a_writer_holds_is_skipped_and_then_counted_as_what_it_became() -> None:
    """PostgreSQL's SKIP LOCKED: an expiring task whose completion is being written is left for the
    next sweep, which sees it final; so its end is counted once (finished), never also as expired."""
    with fresh_postgres_database(POSTGRES_URL) as url:
        upgrade(url)
        _skipped_then_counted(url)


def _skipped_then_counted(url: str) -> None:
    store = SqlStore.from_url(url)
    writer = sa.create_engine(url)
    try:
        store.create(make("finishing"), max_rows=None)
        store.create(make("abandoned"), max_rows=None)
        with writer.connect() as conn:
            conn.begin()
            conn.execute(sa.select(tasks.c.key).where(tasks.c.key == "finishing").with_for_update())

            held = store.evict(now_ms=5_000, retention_ms=1_000, batch_size=10)  # does not wait for the lock

            conn.execute(tasks.update().where(tasks.c.key == "finishing").values(status=TaskStatus.COMPLETED.value))
            conn.commit()
        after = store.evict(now_ms=5_000, retention_ms=1_000, batch_size=10)

        assert (held.removed, dict(held.unfinished)) == (1, {"t": 1})
        assert (after.removed, dict(after.unfinished)) == (1, {})
        assert store.get("finishing", ANY) is None
    finally:
        writer.dispose()
        store.dispose()
