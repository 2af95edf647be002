"""Shared re-reads (`mcp/listen_reads.py`): one store read per (row, owner) per hint, never one that predates it.

Counted with a wrapper around a real store (SQLite and PostgreSQL). To make
"these streams woke together" deterministic, the handler runs with one thread
and a blocker stream of another owner holds it: the woken streams all find the
shared read queued, not started, exactly as they do behind a busy thread pool.
"""

from __future__ import annotations

import math
import threading
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any, cast

import anyio
import anyio.to_thread
import pytest
from mcp.server.subscriptions import InMemorySubscriptionBus

from celery_mcp_tasks.mcp import listen as listen_module
from celery_mcp_tasks.mcp.listen import TaskListenHandler
from celery_mcp_tasks.mcp.listen_reads import SharedRead, SharedReads
from celery_mcp_tasks.model import TaskRecord
from celery_mcp_tasks.notify.hub import Hub
from celery_mcp_tasks.service import TaskService
from celery_mcp_tasks.store.base import ANY, StoreUnavailable
from celery_mcp_tasks.store.sql import SqlStore
from tests.mcp.test_listen_handler import FakeSession, _open, _params

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class CountingStore:
    """A real store whose reads (`get`, `get_many`) are counted per row, and can be held once (before or after
    its query)."""

    def __init__(self, inner: SqlStore) -> None:
        self.inner = inner
        self.reads: Counter[str] = Counter()
        self.queries = 0
        self._lock = threading.Lock()
        self._hold: tuple[str, bool] | None = None
        self.holding = threading.Event()
        self.release = threading.Event()

    def hold(self, key: str, *, after_query: bool = False) -> None:
        """The next `get` of `key` waits for `release` (after its query ran: an in-flight read of the old row)."""
        self.holding.clear()
        self.release.clear()
        self._hold = (key, after_query)

    def get(self, key: str, owner: Any = ANY) -> TaskRecord | None:
        return self._counted([key], lambda: self.inner.get(key, owner))

    def get_many(self, keys: Any, owner: Any = ANY) -> dict[str, TaskRecord]:
        wanted = list(keys)
        return self._counted(wanted, lambda: self.inner.get_many(wanted, owner))

    def _counted(self, keys: list[str], query: Any) -> Any:
        with self._lock:
            self.reads.update(keys)
            self.queries += 1
            hit = self._hold is not None and self._hold[0] in keys
            held, self._hold = (self._hold, None) if hit else (None, self._hold)
        if held is not None and not held[1]:
            self.holding.set()
            assert self.release.wait(30)
        found = query()
        if held is not None and held[1]:
            self.holding.set()
            assert self.release.wait(30)
        return found

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class World:
    def __init__(self, store_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
        self.inner = SqlStore.from_url(store_url)
        self.store = CountingStore(self.inner)
        self.service = TaskService(cast(Any, self.store))
        self.hub = Hub()
        self.owner = "sub:alice"
        self.handler = TaskListenHandler(
            InMemorySubscriptionBus(), lambda: self.service, lambda: self.hub, max_threads=1
        )
        monkeypatch.setattr(listen_module, "current_principal", lambda: self.owner)

    def task(self, owner: str) -> tuple[str, str]:
        task_id, record = self.service.create(owner=owner, tool="t", arguments={}, dispatch=False)
        return task_id, record.key

    def change(self, key: str, message: str) -> None:
        """A visible write, then what a transport does: hint the hub with the row's version."""
        self.service.progress(key, message)
        record = self.inner.get(key, ANY)
        assert record is not None
        self.hub.hint(key, record.version)

    async def wait(self, event: threading.Event) -> None:
        assert await anyio.to_thread.run_sync(event.wait, 30)


@pytest.fixture
def world(store_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[World]:
    world = World(store_url, monkeypatch)
    yield world
    world.store.release.set()
    world.inner.dispose()


async def _streams(
    stack: AsyncExitStack, world: World, owner: str, task_ids: list[str], count: int, first_id: int = 100
) -> list[FakeSession]:
    """`count` acknowledged streams of `owner` following `task_ids`."""
    world.owner = owner
    sessions = []
    for n in range(count):
        session, _ = await stack.enter_async_context(
            _open(world.handler, _params(taskIds=task_ids), request_id=first_id + n)
        )
        ack = await session.next()  # the ack: the stream has read its owner and follows its rows
        for _ in ack["params"]["notifications"]["taskIds"]:
            await session.next()  # each task as it stood
        sessions.append(session)
    return sessions


@asynccontextmanager
async def _thread_held(world: World) -> AsyncIterator[None]:
    """The handler's only thread busy with a blocker stream's read until the block exits."""
    blocker, blocker_key = world.task("sub:bob")
    world.owner = "sub:bob"
    world.store.hold(blocker_key)
    async with _open(world.handler, _params(taskIds=[blocker]), request_id=1) as (session, _):
        await world.wait(world.store.holding)
        try:
            yield
        finally:
            world.store.release.set()
        await session.next()


async def _joined(world: World, key: str, owner: str, streams: int) -> None:
    """Until `streams` streams of `owner` wait on one read of `key` whose query has not started: one leads it
    (its query queued behind the held thread), the others joined it. Driven by the handler's state, not a sleep."""

    def waiting() -> int:
        read = world.handler._reads._pending.get((key, owner))
        return -1 if read is None or read.started else read.done.statistics().tasks_waiting

    with anyio.fail_after(30):
        while waiting() != streams - 1:
            await anyio.sleep(0.005)


async def test_streams_of_one_owner_woken_by_one_hint_share_one_store_read(world: World) -> None:
    task_id, key = world.task("sub:alice")
    async with AsyncExitStack() as stack:
        sessions = await _streams(stack, world, "sub:alice", [task_id], 12)
        world.store.reads.clear()
        async with _thread_held(world):
            world.change(key, "one change")
            await _joined(world, key, "sub:alice", 12)
        for session in sessions:
            sent = await session.next()
            assert sent["params"]["taskId"] == task_id and sent["params"]["statusMessage"] == "one change"
        assert world.store.reads[key] == 1, world.store.reads
        assert all(session.idle() for session in sessions)


async def test_two_owners_never_share_a_read_and_a_foreign_task_reaches_only_its_owner(world: World) -> None:
    alices, alice_key = world.task("sub:alice")
    mallorys, mallory_key = world.task("sub:mallory")
    async with AsyncExitStack() as stack:
        alice = await _streams(stack, world, "sub:alice", [alices], 3)
        mallory = await _streams(stack, world, "sub:mallory", [alices, mallorys], 3, first_id=200)
        world.store.reads.clear()
        async with _thread_held(world):
            world.change(alice_key, "alice's")
            world.change(mallory_key, "mallory's")
            await _joined(world, alice_key, "sub:alice", 3)
            await _joined(world, mallory_key, "sub:mallory", 3)
        for session in alice:
            assert (await session.next())["params"]["statusMessage"] == "alice's"
        for session in mallory:
            sent = await session.next()
            assert sent["params"]["taskId"] == mallorys and sent["params"]["statusMessage"] == "mallory's"
        await anyio.sleep(0.2)
        assert all(session.idle() for session in alice + mallory)  # nothing of the other owner's task, ever
        assert (world.store.reads[alice_key], world.store.reads[mallory_key]) == (1, 1), world.store.reads


async def test_a_stream_following_many_tasks_decides_its_ack_a_few_rows_to_a_query(world: World) -> None:
    """A stream's `taskIds` (up to 1 000) are read `_HELD` to an owner-scoped query when it opens, not one each
    and not all at once (a thousand results at the size limit held together were gigabytes); the caller's own
    are acknowledged (a final one too), another's and unknown ones are not. The states after the first `_HELD`
    are read again as they go out, `_HELD` to a query (a client that stops reading holds no more than those)."""
    mine = [world.task("sub:alice") for _ in range(40)]
    theirs = [world.task("sub:bob")[0] for _ in range(5)]
    world.service.cancel(mine[0][0], "sub:alice")
    world.owner = "sub:alice"
    world.store.queries = 0
    requested = [*theirs, *(task_id for task_id, _ in mine), "no-such-task"]
    async with _open(world.handler, _params(taskIds=requested), request_id=7) as (session, _):
        ack = await session.next()
        acked = math.ceil(len(requested) / listen_module._HELD)
        assert world.store.queries == acked
        assert ack["params"]["notifications"] == {"taskIds": [task_id for task_id, _ in mine]}
        now = [(await session.next())["params"] for _ in mine]  # each as it stood, in the order asked
        assert [(n["taskId"], n["status"]) for n in now[:2]] == [(mine[0][0], "cancelled"), (mine[1][0], "working")]
        assert [n["taskId"] for n in now] == [task_id for task_id, _ in mine]
        assert world.store.queries == acked + math.ceil((len(mine) - listen_module._HELD) / listen_module._HELD)
        world.change(mine[1][1], "moved")
        sent = await session.next()
        assert (sent["params"]["taskId"], sent["params"]["statusMessage"]) == (mine[1][0], "moved")


def _shared() -> SharedReads:
    """SharedReads over a one-thread pool of its own."""
    limiter = anyio.CapacityLimiter(1)

    async def run(fn: Any) -> Any:
        return await anyio.to_thread.run_sync(fn, limiter=limiter)

    return SharedReads(run)


async def test_the_owner_stays_in_the_query_of_a_shared_read(world: World) -> None:
    _, key = world.task("sub:alice")
    reads = _shared()
    got: dict[int, SharedRead] = {}

    async def one(n: int, owner: str) -> None:
        got[n] = await reads.read(key, owner, lambda: world.store.get(key, owner))

    world.store.hold(key)  # the first read holds the only thread: the rest queue, unstarted
    async with anyio.create_task_group() as tg:
        tg.start_soon(one, 0, "sub:bob")
        await world.wait(world.store.holding)
        for n, owner in enumerate(["sub:alice", "sub:mallory", "sub:alice", "sub:mallory"], start=1):
            tg.start_soon(one, n, owner)
        await anyio.sleep(0.1)
        assert reads.in_flight == 3  # bob's (running), alice's and mallory's (queued)
        world.store.release.set()
    assert got[1] is got[3] and got[2] is got[4] and got[1] is not got[2]  # one owner shares; two never do
    assert got[1].record is not None and got[1].record.owner == "sub:alice"
    assert got[2].record is None and got[0].record is None  # the store's own answer for each: not theirs
    assert world.store.reads[key] == 3


async def test_a_stream_woken_after_a_read_started_reads_the_row_as_after_its_hint(world: World) -> None:
    task_id, key = world.task("sub:alice")
    world.handler = TaskListenHandler(InMemorySubscriptionBus(), lambda: world.service, lambda: world.hub)
    async with AsyncExitStack() as stack:
        (early,) = await _streams(stack, world, "sub:alice", [task_id], 1)
        world.store.hold(key, after_query=True)  # the early stream's read runs, took v2, and is still in flight
        world.change(key, "v2")
        await world.wait(world.store.holding)
        (late,) = await _streams(stack, world, "sub:alice", [task_id], 1, first_id=300)  # follows from v2
        world.change(key, "v3")
        assert (await late.next())["params"]["statusMessage"] == "v3"  # its own read, not the v2 one in flight
        world.store.release.set()
        assert (await early.next())["params"]["statusMessage"] == "v2"
        assert (await early.next())["params"]["statusMessage"] == "v3"


async def test_a_store_failure_is_every_joined_streams_failure(world: World) -> None:
    _, key = world.task("sub:alice")
    reads = _shared()
    calls: list[int] = []
    got: list[BaseException | SharedRead] = []

    def failing() -> TaskRecord | None:
        calls.append(1)
        raise StoreUnavailable("down")

    async def one() -> None:
        try:
            got.append(await reads.read(key, "sub:alice", failing))
        except StoreUnavailable as exc:
            got.append(exc)

    world.store.hold(key)
    async with anyio.create_task_group() as tg:
        tg.start_soon(lambda: reads.read(key, "sub:bob", lambda: world.store.get(key, "sub:bob")))
        await world.wait(world.store.holding)
        for _ in range(3):
            tg.start_soon(one)
        await anyio.sleep(0.1)
        world.store.release.set()
    assert len(calls) == 1 and len(got) == 3 and all(isinstance(exc, StoreUnavailable) for exc in got)


async def test_when_the_reading_stream_is_cancelled_the_others_still_share_a_fresh_read(world: World) -> None:
    _, key = world.task("sub:alice")
    reads = _shared()
    got: list[SharedRead] = []

    async def joiner() -> None:
        got.append(await reads.read(key, "sub:alice", lambda: world.store.get(key, "sub:alice")))

    world.store.hold(key)
    async with anyio.create_task_group() as tg:
        tg.start_soon(lambda: reads.read(key, "sub:bob", lambda: world.store.get(key, "sub:bob")))
        await world.wait(world.store.holding)
        async with anyio.create_task_group() as leading:
            leading.start_soon(joiner)  # leads the (queued) read
            await anyio.sleep(0.05)
            tg.start_soon(joiner)
            tg.start_soon(joiner)
            await anyio.sleep(0.05)
            leading.cancel_scope.cancel()  # the leading stream goes away before its query ran
        await anyio.sleep(0.05)
        world.store.release.set()
    assert len(got) == 2 and got[0] is got[1] and got[0].record is not None
    assert world.store.reads[key] == 2  # bob's, and one fresh read for both joiners
