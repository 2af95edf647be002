"""`LoopReads` (tasks/get on the event loop) answers what `SqlStore.get` answers, on PostgreSQL."""

import asyncio
import time
from dataclasses import replace

import anyio
import pytest
import sqlalchemy as sa

from celery_mcp_tasks.model import TaskRecord, TaskStatus
from celery_mcp_tasks.protocol import render_task
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


def _shapes() -> list[TaskRecord]:
    """Every column's awkward values: each row decodes through `json_build_array` as Core decodes it."""
    text = 'quote " backslash \\ newline \n tab \t nul-free \u00e9 \u2603 \U0001f600'
    return [
        record(
            key="k-input",
            owner="ålice ☃",
            status=TaskStatus.INPUT_REQUIRED,
            status_message=text,
            input_requests={"q": {"method": "elicitation/create", "params": {"message": text}}},
            input_responses={"a": {"n": [1, 2.5, None, True, "x"]}},
            issued_keys=("q", "r"),
            parked=True,
        ),
        record(
            key="k-done",
            status=TaskStatus.COMPLETED,
            result={"content": [{"type": "text", "text": text}]},
            created_at=4_102_444_800_000,
            updated_at=4_102_444_800_999,
            ttl_ms=None,
            poll_interval_ms=None,
        ),
        record(key="k-failed", status=TaskStatus.FAILED, error={"code": -32603, "message": text, "data": None}),
        record(
            key="k-floats",
            progress=0.1 + 0.2,
            progress_total=1e-300,
            heartbeat_at=2**62,
            started_at=1,
            version=2**31 - 1,
            dispatches=3,
            attempt=2,
            resends=1,
            trace_context="00-" + "a" * 32 + "-" + "b" * 16 + "-01",
        ),
        record(key="k-big", progress=12345678901234567.0, progress_total=None, arguments={"n": 2**70, "f": -0.0}),
        record(key="k-whole", progress=3.0, progress_total=10.0),  # whole floats stay floats (JSON would say 3)
    ]


async def test_every_column_decodes_as_the_threaded_read(pg_store: SqlStore):
    rows = _shapes()
    for row in rows:
        pg_store.create(row, max_rows=None)
    # A server default that rounds floats to 15 digits: the read's own setting still makes them exact.
    rounding = pg_store.engine.url.update_query_dict({"options": "-c extra_float_digits=0"})
    reads = LoopReads(sa.create_engine(rounding), size=1)
    try:
        for row in rows:
            seen = await reads.get(row.key, ANY)
            assert seen == pg_store.get(row.key, ANY) == row, row.key
            assert type(seen.progress) is type(row.progress) and type(seen.progress_total) is type(row.progress_total)
            render_task("id", seen)  # what tasks/get does with it
    finally:
        await reads.aclose()


async def test_a_key_or_owner_with_a_nul_matches_nothing(pg_store: SqlStore):
    pg_store.create(_row("k", "alice"), max_rows=None)
    reads = LoopReads(pg_store.engine, size=1)
    try:  # libpq would cut the parameter at the NUL: "alice\x00x" must not read alice's row
        assert await reads.get("k", "alice\x00x") is None and await reads.get("k\x00", ANY) is None
        assert await reads.get("k", "alice") is not None
    finally:
        await reads.aclose()


async def _delaying_proxy(target_port: int, delay_s: float) -> tuple[asyncio.AbstractServer, int]:
    """A TCP proxy to PostgreSQL that holds every ReadyForQuery ('Z') message back for `delay_s`."""

    async def pipe_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
        writer.close()

    async def pipe_down(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:  # sslmode=disable: every byte from the server is in a framed message
            kind = await reader.readexactly(1)
            length = await reader.readexactly(4)
            body = await reader.readexactly(int.from_bytes(length, "big") - 4)
            if kind == b"Z":
                await writer.drain()
                await asyncio.sleep(delay_s)
            writer.write(kind + length + body)

    async def handle(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        server_r, server_w = await asyncio.open_connection("127.0.0.1", target_port)
        await asyncio.gather(pipe_up(client_r, server_w), pipe_down(server_r, client_w), return_exceptions=True)
        client_w.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


@pytest.mark.timeout(60)  # a read that blocks the loop blocks this proxy too: it would never end
async def test_the_loop_never_blocks_while_the_end_of_an_answer_is_on_its_way(pg_store: SqlStore):
    pg_store.create(_row("k", None), max_rows=None)
    url = pg_store.engine.url
    server, port = await _delaying_proxy(url.port or 5432, 0.3)
    reads = LoopReads(sa.create_engine(url.set(host="127.0.0.1", port=port).update_query_dict({"sslmode": "disable"})))
    gaps: list[float] = []

    async def ticker() -> None:
        last = time.perf_counter()
        while True:
            await asyncio.sleep(0.01)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    ticking = asyncio.create_task(ticker())
    try:
        assert await reads.get("k", None) == pg_store.get("k", None)  # the row first, ReadyForQuery 0.3 s later
        assert await reads.get("k", None) == pg_store.get("k", None)  # a pooled connection, the same way
        assert max(gaps) < 0.2, max(gaps)
    finally:
        ticking.cancel()
        await reads.aclose()
        server.close()


async def test_a_query_larger_than_the_socket_buffer_is_sent_in_full(pg_store: SqlStore):
    pg_store.create(_row("k", "alice"), max_rows=None)
    reads = LoopReads(pg_store.engine, size=1)
    try:
        assert await reads.get("k", "x" * 8_000_000) is None  # flushed as the socket drains, then answered
        assert await reads.get("k", "alice") == pg_store.get("k", "alice")  # the same connection, reused
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
