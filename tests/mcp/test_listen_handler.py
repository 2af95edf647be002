"""The listen handler on a fake request context: validation, ownership, what is sent and when it stops."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import anyio
import pytest
from mcp.server.subscriptions import InMemorySubscriptionBus, ToolsListChanged
from mcp.shared.exceptions import MCPError
from mcp_types import ClientCapabilities, SubscriptionsListenRequestParams, SubscriptionsListenResult

from celery_mcp_tasks.mcp import listen as listen_module
from celery_mcp_tasks.mcp.listen import TaskListenHandler
from celery_mcp_tasks.migrate import upgrade
from celery_mcp_tasks.notify.hub import Hub
from celery_mcp_tasks.protocol import render_task
from celery_mcp_tasks.service import TaskService
from celery_mcp_tasks.store.base import ANY
from celery_mcp_tasks.store.sql import SqlStore
from tests.support import EXT

ELICIT = {"method": "elicitation/create", "params": {"message": "ok?", "requestedSchema": {"type": "object"}}}

pytestmark = pytest.mark.anyio
SID = "io.modelcontextprotocol/subscriptionId"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class FakeSession:
    def __init__(self, extension: bool) -> None:
        self.client_capabilities = ClientCapabilities(extensions={EXT: {}} if extension else None)
        self.sent, self._recv = anyio.create_memory_object_stream[dict[str, Any]](100)

    async def send_notification(self, notification: Any, related_request_id: Any = None) -> None:
        await self.sent.send(notification.model_dump(by_alias=True, mode="json", exclude_none=True))

    async def next(self) -> dict[str, Any]:
        with anyio.fail_after(10):
            return await self._recv.receive()

    def idle(self) -> bool:
        return self._recv.statistics().current_buffer_used == 0


class World:
    def __init__(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        url = f"sqlite:///{tmp_path / 'tasks.db'}"
        upgrade(url)
        self.store = SqlStore.from_url(url)
        self.service = TaskService(self.store)
        self.hub: Hub | None = Hub()
        self.bus = InMemorySubscriptionBus()
        self.owner: str | None = "sub:alice"
        monkeypatch.setattr(listen_module, "current_principal", lambda: self.owner)

    def handler(self, **options: Any) -> TaskListenHandler:
        return TaskListenHandler(self.bus, lambda: self.service, lambda: self.hub, **options)

    def task(self, owner: str | None = "sub:alice") -> tuple[str, str]:
        task_id, record = self.service.create(owner=owner, tool="t", arguments={}, dispatch=False)
        return task_id, record.key

    def changed(self, key: str) -> None:
        """What a transport does: hint the hub with the row's current version."""
        record = self.store.get(key, ANY)
        assert record is not None and self.hub is not None
        self.hub.hint(key, record.version)


@pytest.fixture
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> World:
    return World(tmp_path, monkeypatch)


def _params(**notifications: Any) -> SubscriptionsListenRequestParams:
    return SubscriptionsListenRequestParams.model_validate({"notifications": notifications})


@asynccontextmanager
async def _open(
    handler: TaskListenHandler, params: SubscriptionsListenRequestParams, *, extension: bool = True, request_id: int = 9
) -> AsyncIterator[tuple[FakeSession, list[Any]]]:
    session = FakeSession(extension)
    ctx = SimpleNamespace(request_id=request_id, session=session, request=None, protocol_version="2026-07-28")
    outcome: list[Any] = []

    async def run() -> None:
        outcome.append(await handler(ctx, params))  # type: ignore[arg-type]

    async with anyio.create_task_group() as tg:
        tg.start_soon(run)
        yield session, outcome
        tg.cancel_scope.cancel()


async def _refused(world: World, extension: bool = True, **notifications: Any) -> MCPError:
    session = FakeSession(extension)
    ctx = SimpleNamespace(request_id=9, session=session, request=None, protocol_version="2026-07-28")
    with pytest.raises(MCPError) as caught:
        await world.handler()(ctx, _params(**notifications))  # type: ignore[arg-type]
    assert session.idle()  # refused before the stream opened: nothing was sent
    return caught.value


@pytest.mark.parametrize("task_ids", ["one", [1], [None], {"a": "b"}, [f"id{n}" for n in range(1001)]])
async def test_malformed_task_ids_are_invalid_params(world: World, task_ids: Any) -> None:
    assert (await _refused(world, taskIds=task_ids)).error.code == -32602


async def test_task_ids_need_the_extension_declared_on_this_request(world: World) -> None:
    error = (await _refused(world, extension=False, taskIds=["x"])).error
    assert error.code == -32021
    assert error.data == {"requiredCapabilities": {"extensions": {EXT: {}}}}


async def test_the_ack_keeps_only_the_callers_tasks_dropping_foreign_and_unknown_alike(world: World) -> None:
    mine, _ = world.task()
    theirs, _ = world.task(owner="sub:mallory")
    unowned, _ = world.task(owner=None)
    async with _open(world.handler(), _params(taskIds=[mine, theirs, "no-such-task", unowned, mine])) as (session, _):
        ack = await session.next()
    assert ack["method"] == "notifications/subscriptions/acknowledged"
    assert ack["params"] == {"_meta": {SID: 9}, "notifications": {"taskIds": [mine]}}


async def test_each_visible_change_is_sent_as_tasks_get_renders_it(world: World) -> None:
    task_id, key = world.task()
    async with _open(world.handler(), _params(taskIds=[task_id])) as (session, _):
        await session.next()
        assert (await session.next())["params"]["status"] == "working"  # its state as it stood
        world.service.progress(key, "half way")
        world.changed(key)
        sent = await session.next()
    record = world.store.get(key, ANY)
    assert record is not None
    assert sent == {"method": "notifications/tasks", "params": {**render_task(task_id, record), "_meta": {SID: 9}}}
    assert sent["params"]["statusMessage"] == "half way"


async def test_a_state_reached_before_the_listen_is_sent_right_after_the_ack(world: World) -> None:
    """A question asked (or a task finished) before the client listened: a client reading nothing after the ack
    (ext-tasks) would wait for a change that never comes."""
    asking, asking_key = world.task()
    world.service.require_input(asking_key, {"q": ELICIT}, "Waiting for you")
    done, done_key = world.task()
    world.service.complete(done_key, {"content": [{"type": "text", "text": "ok"}]})
    async with _open(world.handler(), _params(taskIds=[asking, done])) as (session, _):
        assert (await session.next())["method"] == "notifications/subscriptions/acknowledged"
        first, second = await session.next(), await session.next()
        assert first["params"]["status"] == "input_required" and list(first["params"]["inputRequests"]) == ["q"]
        assert first["params"]["_meta"][SID] == 9
        assert (second["params"]["taskId"], second["params"]["status"]) == (done, "completed")
        assert session.idle()  # said once: the stream waits for changes


async def test_a_write_clients_cannot_see_sends_nothing(world: World) -> None:
    task_id, key = world.task()
    async with _open(world.handler(), _params(taskIds=[task_id])) as (session, _):
        await session.next(), await session.next()
        world.store.update(key, ANY, lambda r: replace(r, version=r.version + 1))  # bookkeeping only
        world.changed(key)
        world.changed(key)  # a duplicate hint, too
        world.service.progress(key, "visible")
        world.changed(key)
        assert (await session.next())["params"]["statusMessage"] == "visible"


async def test_after_its_terminal_notification_a_task_is_no_longer_followed(world: World) -> None:
    task_id, key = world.task()
    other_id, other_key = world.task()
    async with _open(world.handler(), _params(taskIds=[task_id, other_id])) as (session, _):
        await session.next(), await session.next(), await session.next()
        world.service.complete(key, {"content": [{"type": "text", "text": "ok"}]})
        world.changed(key)
        assert (await session.next())["params"]["status"] == "completed"
        assert world.hub is not None and world.hub.watched_keys() == [other_key]
        world.hub.hint(key, 99)  # even a (bogus) later hint is not followed
        world.service.progress(other_key, "still going")
        world.changed(other_key)
        assert (await session.next())["params"]["taskId"] == other_id


async def test_another_principals_stream_hears_nothing_of_the_task(world: World) -> None:
    task_id, key = world.task()
    world.owner = "sub:mallory"
    sentinel, sentinel_key = world.task(owner="sub:mallory")
    async with _open(world.handler(), _params(taskIds=[task_id, sentinel])) as (session, _):
        assert (await session.next())["params"]["notifications"] == {"taskIds": [sentinel]}
        assert (await session.next())["params"]["taskId"] == sentinel
        world.service.progress(key, "secret")
        world.changed(key)
        world.service.progress(sentinel_key, "mine")
        world.changed(sentinel_key)
        assert (await session.next())["params"]["taskId"] == sentinel


async def test_a_lost_hint_is_made_up_by_the_periodic_re_read(world: World) -> None:
    task_id, key = world.task()
    async with _open(world.handler(resync_interval_s=0.05), _params(taskIds=[task_id])) as (session, _):
        await session.next(), await session.next()
        world.service.progress(key, "never hinted")
        assert (await session.next())["params"]["statusMessage"] == "never hinted"


async def test_closing_ends_every_stream_with_its_listen_result(world: World) -> None:
    handler = world.handler()
    async with _open(handler, _params(toolsListChanged=True), request_id=5) as (session, outcome):
        await session.next()
        handler.close()
        with anyio.fail_after(10):
            while not outcome:
                await anyio.sleep(0.01)
    assert isinstance(outcome[0], SubscriptionsListenResult)
    assert outcome[0].meta == {SID: 5}
    assert handler.open_streams == 0


async def test_streams_beyond_the_limit_are_refused(world: World) -> None:
    handler = world.handler(max_streams=1)
    async with _open(handler, _params(toolsListChanged=True)) as (session, _):
        await session.next()
        ctx = SimpleNamespace(request_id=10, session=FakeSession(True), request=None, protocol_version="2026-07-28")
        with pytest.raises(MCPError) as caught:
            await handler(ctx, _params(toolsListChanged=True))  # type: ignore[arg-type]
    assert caught.value.error.code == -32603


def _ctx(request_id: int, host: str | None = None) -> Any:
    request = None if host is None else SimpleNamespace(client=SimpleNamespace(host=host))
    return SimpleNamespace(
        request_id=request_id, session=FakeSession(True), request=request, protocol_version="2026-07-28"
    )


async def test_one_caller_cannot_take_every_stream(world: World) -> None:
    """`MCP_TASKS_QUOTA_STREAMS`: a caller's streams beyond the quota are refused with -32029 (naming no one),
    others' are not, and a closed stream frees its slot."""
    handler = world.handler(max_streams_per_caller=2)
    params = _params(toolsListChanged=True)
    async with _open(handler, params, request_id=1) as (first, _), _open(handler, params, request_id=2) as (second, _):
        await first.next(), await second.next()
        with pytest.raises(MCPError) as caught:
            await handler(_ctx(3), params)
        assert caught.value.error.code == -32029
        assert caught.value.error.data == {"limit": "streams", "allowed": 2, "retryAfterMs": None}
        assert "alice" not in caught.value.error.message
        world.owner = "sub:bob"
        async with _open(handler, params, request_id=4) as (bobs, _):
            await bobs.next()  # acknowledged: alice's quota is hers alone
        world.owner = "sub:alice"
    async with _open(handler, params, request_id=5) as (again, _):
        await again.next()  # her closed streams gave their slots back
    assert handler.open_streams == 0


async def test_anonymous_callers_share_the_stream_quota_unless_counted_per_client(world: World) -> None:
    world.owner = None
    params = _params(toolsListChanged=True)
    for per_client, refused in ((False, True), (True, False)):
        handler = world.handler(max_streams_per_caller=1, per_client=per_client)
        async with _open(handler, params, request_id=1) as (first, _):
            await first.next()
            if refused:
                with pytest.raises(MCPError) as caught:
                    await handler(_ctx(2, host="10.0.0.2"), params)
                assert caught.value.error.code == -32029
            else:  # the first stream came from no address; another client's address is another caller
                async with _open_with(handler, params, _ctx(2, host="10.0.0.2")) as other:
                    await other.next()


@asynccontextmanager
async def _open_with(
    handler: TaskListenHandler, params: SubscriptionsListenRequestParams, ctx: Any
) -> AsyncIterator[FakeSession]:
    async with anyio.create_task_group() as tg:
        tg.start_soon(handler, ctx, params)
        yield ctx.session
        tg.cancel_scope.cancel()


async def test_core_events_reach_only_the_streams_that_asked(world: World) -> None:
    handler = world.handler()
    async with (
        _open(handler, _params(toolsListChanged=True)) as (asked, _),
        _open(handler, _params(promptsListChanged=True), request_id=10) as (other, _),
    ):
        await asked.next()
        await other.next()
        await world.bus.publish(ToolsListChanged())
        sent = await asked.next()
        assert sent == {"method": "notifications/tools/list_changed", "params": {"_meta": {SID: 9}}}
        assert other.idle()


async def test_with_push_off_task_ids_are_not_acknowledged(world: World) -> None:
    world.hub = None
    task_id, _ = world.task()
    async with _open(world.handler(), _params(taskIds=[task_id], toolsListChanged=True)) as (session, _):
        assert (await session.next())["params"]["notifications"] == {"toolsListChanged": True}


async def test_a_store_outage_keeps_the_stream_and_the_change_arrives_later(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    task_id, key = world.task()
    real_get = world.service.get
    failures = [RuntimeError("database is down")]

    def flaky_get(*args: Any) -> Any:
        if failures:
            raise failures.pop()
        return real_get(*args)

    async with _open(world.handler(), _params(taskIds=[task_id])) as (session, outcome):
        await session.next(), await session.next()
        monkeypatch.setattr(world.service, "get", flaky_get)
        world.service.progress(key, "after the outage")
        world.changed(key)
        assert (await session.next())["params"]["statusMessage"] == "after the outage"
        assert not outcome  # still open


async def test_a_stream_keeps_no_payload_and_drops_tasks_once_final(world: World) -> None:
    running, running_key = world.task()
    done, done_key = world.task()
    world.service.complete(done_key, {"content": [{"type": "text", "text": "a large result"}]})
    handler = world.handler()
    async with _open(handler, _params(taskIds=[running, done, "\ud800"])) as (session, _):
        ack = await session.next()
        assert ack["params"]["notifications"]["taskIds"] == [running, done]  # a lone surrogate is simply unknown
        (stream,) = handler._streams
        assert set(stream.followed) == {running_key}  # the finished one is acknowledged, not followed
        assert all(not isinstance(value, dict) for value in vars(stream.followed[running_key]).values())
        now = [await session.next(), await session.next()]  # each one's state as it stood, then only changes
        assert [(n["params"]["taskId"], n["params"]["status"]) for n in now] == [
            (running, "working"),
            (done, "completed"),
        ]
        world.service.complete(running_key, {"content": [{"type": "text", "text": "another large result"}]})
        world.changed(running_key)
        final = await session.next()
        assert final["params"]["status"] == "completed"
        assert stream.followed == {}


class FailingOnce(FakeSession):
    """A session whose first `notifications/tasks` send of a change fails (a transport hiccup)."""

    def __init__(self, extension: bool) -> None:
        super().__init__(extension)
        self.failed = False

    async def send_notification(self, notification: Any, related_request_id: Any = None) -> None:
        changed = notification.method == "notifications/tasks" and notification.params.get("statusMessage")
        if not self.failed and changed:
            self.failed = True
            raise anyio.BrokenResourceError
        await super().send_notification(notification, related_request_id)


async def test_a_notification_whose_send_failed_is_sent_again_and_not_skipped_as_seen(world: World) -> None:
    task_id, key = world.task()
    session = FailingOnce(True)
    ctx = SimpleNamespace(request_id=9, session=session, request=None, protocol_version="2026-07-28")
    handler = world.handler()
    async with anyio.create_task_group() as tg:
        tg.start_soon(handler, ctx, _params(taskIds=[task_id]))
        await session.next(), await session.next()  # the ack, the task as it stood
        world.service.progress(key, "half way")
        world.changed(key)
        with anyio.fail_after(10):
            while not session.failed:
                await anyio.sleep(0.01)
        # a write clients cannot see must not hide the state whose send failed
        world.store.update(key, ANY, lambda r: replace(r, version=r.version + 1))
        world.changed(key)
        sent = await session.next()
        assert sent["method"] == "notifications/tasks"
        assert sent["params"]["statusMessage"] == "half way"
        world.service.progress(key, "then the next change")
        world.changed(key)
        assert (await session.next())["params"]["statusMessage"] == "then the next change"
        tg.cancel_scope.cancel()


async def test_a_stream_ends_when_its_callers_token_expires_and_sends_nothing_after(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = [999.9]
    monkeypatch.setattr(listen_module, "token_expiry", lambda: 1000.0)
    task_id, key = world.task()
    handler = world.handler(clock=lambda: now[0])
    async with _open(handler, _params(taskIds=[task_id]), request_id=6) as (session, outcome):
        await session.next(), await session.next()  # the ack, the task as it stands
        world.service.progress(key, "before the expiry")
        world.changed(key)
        assert (await session.next())["params"]["statusMessage"] == "before the expiry"
        assert not outcome  # still open: its token is still good
        now[0] = 1000.0
        world.service.progress(key, "after the expiry")
        world.changed(key)
        with anyio.fail_after(10):
            while not outcome:
                await anyio.sleep(0.01)
        assert session.idle()  # the change after the expiry never went out
    assert isinstance(outcome[0], SubscriptionsListenResult) and outcome[0].meta == {SID: 6}
    assert handler.open_streams == 0


async def test_a_stream_following_many_tasks_reads_their_states_a_few_at_a_time_as_they_go_out(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client that stops reading holds at most `_HELD` task states in the web process (each may be a result
    of megabytes), not every followed task's: after the ack the states are read in batches as they are sent,
    each once, in the order asked."""
    tasks = [world.task() for _ in range(3 * listen_module._HELD + 2)]
    for _, key in tasks[::2]:
        world.service.complete(key, {"content": [{"type": "text", "text": "x" * 1000}]})
    read_sizes: list[int] = []
    get_many = world.service.get_many

    def counted(task_ids: Any, owner: Any, **options: Any) -> Any:
        task_ids = list(task_ids)
        read_sizes.append(len(task_ids))
        return get_many(task_ids, owner, **options)

    monkeypatch.setattr(world.service, "get_many", counted)
    async with _open(world.handler(), _params(taskIds=[task_id for task_id, _ in tasks])) as (session, _):
        ack = await session.next()
        assert len(ack["params"]["notifications"]["taskIds"]) == len(tasks)
        sent = [(await session.next())["params"]["taskId"] for _ in tasks]
        assert sent == [task_id for task_id, _ in tasks]
        await anyio.sleep(0.2)
        assert session.idle()  # each state went out once
    assert len(read_sizes) > 2 * len(tasks) // listen_module._HELD  # the ack's reads, then the pump's
    assert max(read_sizes) <= listen_module._HELD  # never more rows at once, the ack's reads included


async def test_a_final_state_committed_before_the_ttl_ends_is_sent_though_read_after_it(world: World) -> None:
    """A cancel that lands just before the task's TTL ends is its last word: the stream's re-read comes after the
    expiry, and must still send it (once), not drop the task as expired (found by a race audit, 1 in 200). A
    final state written after the expiry (a job finishing late) is not sent: `tasks/get` answers it expired."""
    now = [1_000_000]
    world.service.clock = lambda: now[0]
    task_id, record = world.service.create(owner="sub:alice", tool="t", arguments={}, ttl_ms=1000, dispatch=False)
    late_id, late = world.service.create(owner="sub:alice", tool="t", arguments={}, ttl_ms=1000, dispatch=False)
    handler = world.handler()
    async with _open(handler, _params(taskIds=[task_id, late_id]), request_id=3) as (session, _):
        await session.next(), await session.next(), await session.next()  # the ack, each task as it stands
        (stream,) = handler._streams
        now[0] += 900
        world.service.cancel(task_id, "sub:alice")
        now[0] += 200  # past the TTL before the stream re-reads
        world.changed(record.key)
        final = (await session.next())["params"]
        assert (final["taskId"], final["status"]) == (task_id, "cancelled")
        world.service.complete(late.key, {"content": [{"type": "text", "text": "too late"}]})
        world.changed(late.key)
        with anyio.fail_after(10):
            while stream.followed:  # each dropped: one sent its final state, the other expired unfinished
                await anyio.sleep(0.01)
        assert session.idle()
