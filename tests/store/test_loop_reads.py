"""`LoopReads` (tasks/get on the event loop) answers what `SqlStore.get` answers, on PostgreSQL."""

from dataclasses import replace

import anyio
import pytest
import sqlalchemy as sa

from celery_mcp_tasks.model import TaskRecord
from celery_mcp_tasks.store import ANY
from celery_mcp_tasks.store.base import StoreUnavailable
from celery_mcp_tasks.store.loop_reads import LoopReads, loop_reads
from celery_mcp_tasks.store.sql import SqlStore
from tests.builders import record
from tests.store.test_reconnect import drop_every_connection
from tests.support import free_port

pytestmark = [pytest.mark.anyio, pytest.mark.postgres]


def _row(key: str, owner: str | None) -> TaskRecord:
    """A row with JSON columns and a float, so a decoding slip on either path shows."""
    return record(key=key, owner=owner, ttl_ms=None, arguments={"a": [1, 2]}, issued_keys=("q",), progress=2.5)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def test_the_same_answers_as_the_threaded_read(pg_store: SqlStore):
    for key, owner in (("k-alice", "alice"), ("k-none", None)):
        pg_store.create(_row(key, owner), max_rows=None)
    reads = loop_reads(pg_store)
    assert reads is not None
    try:
        for key in ("k-alice", "k-none", "missing"):
            for owner in (ANY, None, "alice", "bob"):
                assert await reads.get(key, owner) == pg_store.get(key, owner), (key, owner)
    finally:
        await reads.aclose()


async def test_every_committed_write_is_seen_at_once(pg_store: SqlStore):
    pg_store.create(_row("k", "alice"), max_rows=None)
    reads = LoopReads(pg_store.engine, size=2)
    try:
        for version in range(2, 30):
            pg_store.update("k", "alice", lambda r: replace(r, version=r.version + 1, status_message=str(r.version)))
            seen = await reads.get("k", "alice")
            assert seen is not None and seen.version == version
    finally:
        await reads.aclose()


async def test_pooled_connections_dropped_by_the_server_are_replaced(pg_store: SqlStore):
    pg_store.create(_row("k", None), max_rows=None)
    reads = LoopReads(pg_store.engine, size=3)
    try:
        async with anyio.create_task_group() as tg:  # three connections in the pool
            for _ in range(3):
                tg.start_soon(reads.get, "k", None)
        assert drop_every_connection(pg_store) >= 3
        assert await reads.get("k", None) == pg_store.get("k", None)
    finally:
        await reads.aclose()


async def test_a_cancelled_read_never_returns_its_connection(pg_store: SqlStore):
    pg_store.create(_row("k", None), max_rows=None)
    reads = LoopReads(pg_store.engine, size=1)
    try:
        assert await reads.get("k", None) is not None
        with pg_store.engine.connect() as locker:
            locker.execute(sa.text("LOCK TABLE mcp_tasks_task IN ACCESS EXCLUSIVE MODE"))  # the SELECT waits
            with anyio.move_on_after(0.3) as scope:
                await reads.get("k", None)
            assert scope.cancelled_caught
            locker.rollback()
        assert reads._pool().idle == []  # the interrupted connection was closed, not pooled
        assert await reads.get("k", None) is not None
    finally:
        await reads.aclose()


async def test_an_unreachable_database_is_store_unavailable(pg_store: SqlStore):
    dead = sa.create_engine(pg_store.engine.url.set(host="127.0.0.1", port=free_port()))
    reads = LoopReads(dead)
    with pytest.raises(StoreUnavailable) as caught:
        await reads.get("k", None)
    assert str(caught.value) == StoreUnavailable.MESSAGE and caught.value.operation == "get"


def test_no_loop_reads_off_a_loop_or_on_sqlite(pg_store: SqlStore, tmp_path):
    assert loop_reads(pg_store) is None  # no running event loop here
    sqlite = SqlStore.from_url(f"sqlite:///{tmp_path / 'tasks.db'}")

    async def on_loop() -> object:
        return loop_reads(sqlite)

    assert anyio.run(on_loop) is None
    sqlite.dispose()
