"""`TasksClient` in the SDK's own `Client`, against a real web process and a separate Celery worker.

Both backends (embedded, and PostgreSQL + Redis). What a user sees: a plain
`call_tool` that waits, questions answered by the client's callbacks, a
cancelled caller that cancels its task, push used when offered.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client
from mcp.client.session import ClientRequestContext
from mcp.shared.exceptions import MCPError
from mcp_types import CallToolResult, ElicitRequestParams, ElicitResult, ErrorData

from celery_mcp_tasks.client import InputNotAnswered, TaskCancelled, TaskFailed, TaskNotFound, TasksClient, calls
from tests.support import Backend, Deployment, wait_until

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def runtime(backend: Backend, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    logs = tmp_path_factory.mktemp(f"client-{backend.name}")
    with Deployment("tests.apps.runtime_app", backend, logs) as deployment:
        deployment.web()
        deployment.worker(concurrency=4)
        yield deployment


def text(result: CallToolResult) -> str:
    return "".join(getattr(item, "text", "") for item in result.content)


class Answers:
    """An elicitation callback that answers each question from a script, keyed by a word of its message."""

    def __init__(self, **by_word: dict[str, Any]) -> None:
        self.by_word = by_word
        self.asked: list[str] = []

    async def __call__(self, ctx: ClientRequestContext, params: ElicitRequestParams) -> ElicitResult | ErrorData:
        self.asked.append(params.message)
        for word, content in self.by_word.items():
            if word in params.message.lower():
                return ElicitResult(action="accept", content=content)
        return ElicitResult(action="decline")


def run(scenario: Any, *args: Any) -> Any:
    return anyio.run(scenario, *args)


def test_a_plain_call_tool_waits_for_the_task_and_returns_its_result(runtime: Deployment):
    async def scenario() -> CallToolResult:
        async with Client(runtime.url, extensions=[TasksClient()]) as client:
            return await client.call_tool("work", {"seconds": 0.5})

    result = run(scenario)
    assert isinstance(result, CallToolResult) and not result.is_error
    assert text(result) == "worked 0.5s on attempt 1"


def test_a_failed_task_raises_the_sdk_error_and_an_iserror_result_is_returned(runtime: Deployment):
    async def scenario() -> tuple[MCPError, CallToolResult]:
        async with Client(runtime.url, extensions=[TasksClient()]) as client:
            with pytest.raises(MCPError) as failed:
                await client.call_tool("explode", {"message": "boom"})
            refused = await client.call_tool("refuse", {"message": "no"})
            return failed.value, refused

    failed, refused = run(scenario)
    assert failed.code == -32603 and not isinstance(failed, TaskNotFound)
    assert isinstance(failed, TaskFailed) and failed.state.status == "failed" and "boom" in failed.message
    assert refused.is_error and "no" in text(refused)


def test_two_questions_are_answered_by_the_elicitation_callback(runtime: Deployment):
    answers = Answers(name={"name": "Ada"}, colour={"colour": "teal"})

    async def scenario() -> CallToolResult:
        async with Client(runtime.url, extensions=[TasksClient()], elicitation_callback=answers) as client:
            return await client.call_tool("two_rounds", {})

    result = run(scenario)
    assert text(result).startswith("Ada likes teal")
    assert answers.asked == ["Your name?", "Favourite colour?"]


def test_a_question_is_asked_once_however_many_coroutines_and_handles_wait_on_the_task(runtime: Deployment):
    """Two coroutines waiting on one handle, and a second handle attached to the task, used to ask the same
    question two or three times, and the first answer was thrown away."""

    class Slow(Answers):
        async def __call__(self, ctx: ClientRequestContext, params: ElicitRequestParams) -> ElicitResult | ErrorData:
            await anyio.sleep(0.3)  # the others look meanwhile
            return await super().__call__(ctx, params)

    answers = Slow(name={"name": "Ada"}, colour={"colour": "teal"})

    async def scenario() -> list[str]:
        tasks = TasksClient()
        async with Client(runtime.url, extensions=[tasks], elicitation_callback=answers) as client:
            handle = await tasks.start(client, "two_rounds", {})
            assert handle.id is not None
            other = await tasks.attach(client, handle.id)
            async with anyio.create_task_group() as group:
                group.start_soon(handle.wait)
                group.start_soon(handle.wait)
                group.start_soon(other.wait)
            return [text(await handle.result()), text(await other.result())]

    results = run(scenario)
    assert all(result.startswith("Ada likes teal") for result in results)
    assert answers.asked == ["Your name?", "Favourite colour?"]


def test_when_the_coroutine_asking_gives_up_another_one_waiting_asks_instead(runtime: Deployment):
    """The first waiter is cancelled while its question is on screen: the second, which was waiting for that
    answer instead of asking too, asks it itself (it does not wait forever for an answer nobody sends)."""

    class FirstSlow(Answers):
        async def __call__(self, ctx: ClientRequestContext, params: ElicitRequestParams) -> ElicitResult | ErrorData:
            if not self.asked:
                self.asked.append(params.message)
                await anyio.sleep(30)  # cancelled long before
            return await super().__call__(ctx, params)

    answers = FirstSlow(name={"name": "Ada"}, colour={"colour": "teal"})

    async def scenario() -> str:
        tasks = TasksClient()
        async with Client(runtime.url, extensions=[tasks], elicitation_callback=answers) as client:
            handle = await tasks.start(client, "two_rounds", {})
            async with anyio.create_task_group() as group:

                async def impatient() -> None:
                    with anyio.move_on_after(1.0):
                        await handle.wait()

                group.start_soon(impatient)
                await anyio.sleep(0.3)  # the impatient one asks first
                with anyio.fail_after(30):
                    result = await handle.result()
            return text(result)

    assert run(scenario).startswith("Ada likes teal")
    assert answers.asked == ["Your name?", "Your name?", "Favourite colour?"]


def test_an_answer_the_server_failed_to_take_is_sent_again_not_lost(
    runtime: Deployment, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a client behind a proxy meets while a web process restarts: one `tasks/update` answered with the
    SDK's "Server returned an error response" (-32603). The answers are sent again; before, they were lost,
    the call failed and the task was cancelled on the way out."""
    from celery_mcp_tasks.client.models import UpdateTaskRequest

    delivered = calls.send
    updates: list[str] = []

    async def first_update_fails(session: Any, request: Any) -> None:
        if isinstance(request, UpdateTaskRequest):
            updates.append("sent")
            if len(updates) == 1:
                raise MCPError(-32603, "Server returned an error response")
        await delivered(session, request)

    monkeypatch.setattr(calls, "send", first_update_fails)
    answers = Answers(name={"name": "Ada"}, colour={"colour": "teal"})

    async def scenario() -> str:
        async with Client(runtime.url, extensions=[TasksClient()], elicitation_callback=answers) as client:
            return text(await client.call_tool("two_rounds", {}))

    assert run(scenario).startswith("Ada likes teal")
    assert answers.asked == ["Your name?", "Favourite colour?"]  # each question asked once
    assert len(updates) == 3  # the first round's answers twice, the second round's once


def test_a_stream_quota_of_one_still_follows_every_task_on_listen(
    runtime: Deployment, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """With `MCP_TASKS_QUOTA_STREAMS=1`, a task joining a connection that already listens is refused a second
    stream (-32029): the client gives its stream back and opens one for them all, instead of polling."""
    url = runtime.web("one-stream", MCP_TASKS_QUOTA_STREAMS="1")
    opened = _recorded_streams(monkeypatch)

    async def scenario() -> list[str]:
        tasks = TasksClient()
        async with Client(url, extensions=[tasks]) as client:
            first = await tasks.start(client, "work", {"seconds": 3})
            await anyio.wait_all_tasks_blocked()
            second = await tasks.start(client, "work", {"seconds": 1})
            return [text(await handle.result()) for handle in (first, second)]

    with caplog.at_level("WARNING", logger="celery_mcp_tasks.client"):
        assert run(scenario) == ["worked 3s on attempt 1", "worked 1s on attempt 1"]
    assert "polling tasks" not in caplog.text, caplog.text
    assert len(opened[-1]) == 2  # the last stream followed both


def test_a_question_the_client_refuses_cancels_the_task_with_a_clear_error(runtime: Deployment):
    async def refuse(ctx: ClientRequestContext, params: ElicitRequestParams) -> ErrorData:
        return ErrorData(code=-32600, message="nobody is here to answer")

    async def scenario() -> tuple[InputNotAnswered, str]:
        tasks = TasksClient()
        async with Client(runtime.url, extensions=[tasks], elicitation_callback=refuse) as client:
            handle = await tasks.start(client, "two_rounds", {})
            with pytest.raises(InputNotAnswered) as refused:
                await handle.result()
            return refused.value, handle.status

    refused, status = run(scenario)
    assert "elicitation/create" in refused.message and "nobody is here" in refused.message
    assert "cancelled" in refused.message and status == "cancelled"


def test_a_callback_that_raises_is_a_refusal_that_cancels_the_task(runtime: Deployment):
    async def broken(ctx: ClientRequestContext, params: ElicitRequestParams) -> ElicitResult:
        raise ValueError("a bug in the callback")

    async def scenario() -> tuple[InputNotAnswered, str]:
        tasks = TasksClient()
        async with Client(runtime.url, extensions=[tasks], elicitation_callback=broken) as client:
            handle = await tasks.start(client, "two_rounds", {})
            with pytest.raises(InputNotAnswered) as refused:  # not an ExceptionGroup of the callback's error
                await handle.result()
            return refused.value, handle.status

    refused, status = run(scenario)
    assert "callback raised ValueError" in refused.message and status == "cancelled"
    assert isinstance(refused.__cause__, ValueError) and str(refused.__cause__) == "a bug in the callback"


def test_cancelling_the_caller_cancels_the_task_and_its_job_stops(runtime: Deployment, tmp_path: Path):
    marker = tmp_path / "started"

    async def scenario() -> None:
        async with Client(runtime.url, extensions=[TasksClient()]) as client:
            with anyio.fail_after(60), anyio.CancelScope() as scope:

                async def cancel_when_started() -> None:
                    while not marker.exists():
                        await anyio.sleep(0.05)
                    scope.cancel()

                async with anyio.create_task_group() as group:
                    group.start_soon(cancel_when_started)
                    await client.call_tool("work", {"seconds": 60, "marker": str(marker)})

    run(scenario)
    wait_until(lambda: Path(f"{marker}.stopped").exists(), 30, "the job to stop for the cancel")


def test_a_wait_past_the_clients_timeout_cancels_the_task(runtime: Deployment, tmp_path: Path):
    marker = tmp_path / "started"

    async def scenario() -> None:
        async with Client(runtime.url, extensions=[TasksClient(timeout=1.5)]) as client:
            with pytest.raises(TimeoutError):
                await client.call_tool("work", {"seconds": 60, "marker": str(marker)})

    run(scenario)
    wait_until(lambda: Path(f"{marker}.stopped").exists(), 30, "the job to stop for the cancel")


def test_a_calls_own_read_timeout_bounds_its_task_as_without_the_extension(runtime: Deployment, tmp_path: Path):
    """`call_tool(..., read_timeout_seconds=)` is this call's bound, below the client's `timeout`: past it the
    task is cancelled and the SDK's request timeout raised, as a call without the extension would. (The job's
    `.stopped` marker shows the task was created and cancelled: not the SDK's own timeout on the creation.)"""
    marker = tmp_path / "started"

    async def scenario() -> MCPError:
        async with Client(runtime.url, extensions=[TasksClient(timeout=600)]) as client:
            with anyio.fail_after(60), pytest.raises(MCPError) as timed_out:
                await client.call_tool("work", {"seconds": 60, "marker": str(marker)}, read_timeout_seconds=4)
            return timed_out.value

    assert run(scenario).code == -32001  # REQUEST_TIMEOUT
    wait_until(lambda: Path(f"{marker}.stopped").exists(), 30, "the job to stop for the cancel")


def test_the_handle_api_start_follow_attach_and_cancel(runtime: Deployment):
    async def scenario() -> dict[str, Any]:
        tasks = TasksClient()
        async with Client(runtime.url, extensions=[tasks]) as client:
            handle = await tasks.start(client, "work", {"seconds": 1})
            assert handle.id and handle.status == "working"
            seen = [state.status async for state in handle.updates()]
            first = text(await handle.result())
            keep = await tasks.start(client, "work", {"seconds": 60})
            kept_id = keep.id
        assert kept_id is not None
        other = TasksClient()  # another process, later: the id is all it has
        async with Client(runtime.url, extensions=[other]) as client:
            again = await other.attach(client, kept_id)
            assert again.status == "working"
            await again.cancel()
            with pytest.raises(TaskCancelled) as cancelled:
                await again.result()
        return {"seen": seen, "first": first, "cancelled": str(cancelled.value)}

    outcome = run(scenario)
    assert outcome["seen"][0] == "working" and outcome["seen"][-1] == "completed"
    assert outcome["first"]
    assert outcome["cancelled"].startswith("The task was cancelled")


def test_a_task_that_expired_is_a_clear_error(runtime: Deployment):
    async def scenario() -> None:
        tasks = TasksClient()
        async with Client(runtime.url, extensions=[tasks]) as client:
            handle = await tasks.start(client, "short_lived", {})
            await handle.result()
            await anyio.sleep(2.0)  # the tool's ttl is 1.5 s
            with pytest.raises(TaskNotFound):
                await tasks.attach(client, handle.id or "")

    run(scenario)


def test_push_is_used_when_the_server_offers_it(runtime: Deployment, monkeypatch: pytest.MonkeyPatch):
    """Five concurrent tasks followed on one listen stream cost about one tasks/get each; polling costs more."""
    gets = {"n": 0}
    original = calls.get_task

    async def counting(session: Any, task_id: str) -> Any:
        gets["n"] += 1
        return await original(session, task_id)

    monkeypatch.setattr(calls, "get_task", counting)

    async def scenario(listen: bool) -> tuple[int, list[str]]:
        gets["n"] = 0
        results: list[str] = []
        tasks = TasksClient(listen=listen, poll_floor_s=0.1, poll_ceiling_s=0.5)
        async with Client(runtime.url, extensions=[tasks]) as client:

            async def one(n: int) -> None:
                results.append(text(await client.call_tool("work", {"seconds": 2})))

            async with anyio.create_task_group() as group:
                for n in range(5):
                    group.start_soon(one, n)
        return gets["n"], results

    pushed, pushed_results = run(scenario, True)
    polled, polled_results = run(scenario, False)
    assert len(pushed_results) == len(polled_results) == 5
    assert pushed <= 2 * 5, pushed  # about one read per task after an acknowledgment, never a poll loop
    assert polled > pushed, (polled, pushed)


def _recorded_streams(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """The task ids of each listen stream the client opens from now on, in order."""
    from celery_mcp_tasks import sdk_internals as _sdk

    opened: list[list[str]] = []
    original = _sdk.listen_tasks

    def recording(session: Any, task_ids: list[str], ack_timeout: float) -> Any:
        opened.append(list(task_ids))
        return original(session, task_ids, ack_timeout)

    monkeypatch.setattr(_sdk, "listen_tasks", recording)
    return opened


def test_tasks_followed_at_once_share_one_listen_stream(runtime: Deployment, monkeypatch: pytest.MonkeyPatch):
    opened = _recorded_streams(monkeypatch)

    async def scenario() -> None:
        tasks = TasksClient()
        async with Client(runtime.url, extensions=[tasks]) as client:
            handles = [await tasks.start(client, "work", {"seconds": 1.5}) for _ in range(3)]
            for handle in handles:
                await handle.result()

    started = time.monotonic()
    run(scenario)
    assert time.monotonic() - started < 60
    assert 1 <= len(opened) <= 3  # re-opened only as tasks joined, never one stream per task and change
    assert len(opened[-1]) >= 1


def test_a_server_that_does_not_follow_tasks_on_listen_is_polled(runtime: Deployment, monkeypatch: pytest.MonkeyPatch):
    """The acknowledgment leaves `taskIds` out (a server without task push): the client polls instead."""
    from contextlib import asynccontextmanager

    from mcp.client.subscriptions import ListenRoute
    from mcp_types import SubscriptionFilter

    from celery_mcp_tasks import sdk_internals as _sdk

    @asynccontextmanager
    async def core_only(session: Any, task_ids: list[str], ack_timeout: float) -> Any:
        yield _sdk.TaskStream(ListenRoute(), SubscriptionFilter())

    monkeypatch.setattr(_sdk, "listen_tasks", core_only)

    async def scenario() -> str:
        async with Client(runtime.url, extensions=[TasksClient(poll_floor_s=0.1)]) as client:
            return text(await client.call_tool("work", {"seconds": 1}))

    assert run(scenario) == "worked 1s on attempt 1"


def test_a_listen_stream_that_drops_is_reopened(runtime: Deployment, monkeypatch: pytest.MonkeyPatch):
    from contextlib import asynccontextmanager

    from celery_mcp_tasks import sdk_internals as _sdk

    original = _sdk.listen_tasks
    opened: list[int] = []

    @asynccontextmanager
    async def dropping(session: Any, task_ids: list[str], ack_timeout: float) -> Any:
        async with original(session, task_ids, ack_timeout) as stream:
            opened.append(len(task_ids))
            if len(opened) == 1:
                stream._route.settle("lost")  # the first stream breaks right after its acknowledgment
            yield stream

    monkeypatch.setattr(_sdk, "listen_tasks", dropping)

    async def scenario() -> str:
        async with Client(runtime.url, extensions=[TasksClient()]) as client:
            return text(await client.call_tool("work", {"seconds": 1.5}))

    assert run(scenario) == "worked 1.5s on attempt 1"
    assert len(opened) >= 2


def test_after_listen_kept_failing_for_a_while_the_client_polls_then_listens_again(
    runtime: Deployment, monkeypatch: pytest.MonkeyPatch
):
    """A proxy answering 503 while the web process restarts: three failed listens are not "this server has no
    push" (that was for good, for every later task on the connection); after `_RELISTEN_S` it listens again."""
    from contextlib import asynccontextmanager

    from mcp.shared.exceptions import MCPError
    from mcp_types import INTERNAL_ERROR

    from celery_mcp_tasks import sdk_internals as _sdk
    from celery_mcp_tasks.client import following

    original = _sdk.listen_tasks
    attempts: list[str] = []

    @asynccontextmanager
    async def failing_at_first(session: Any, task_ids: list[str], ack_timeout: float) -> Any:
        if len(attempts) < 3:
            attempts.append("failed")
            raise MCPError(INTERNAL_ERROR, "Service Unavailable")
        async with original(session, task_ids, ack_timeout) as stream:
            attempts.append("listening")
            yield stream

    monkeypatch.setattr(_sdk, "listen_tasks", failing_at_first)
    monkeypatch.setattr(following, "_RELISTEN_S", 0.3)

    async def scenario() -> str:
        async with Client(runtime.url, extensions=[TasksClient(poll_floor_s=0.1)]) as client:
            return text(await client.call_tool("work", {"seconds": 2}))

    assert run(scenario) == "worked 2s on attempt 1"
    assert attempts[:3] == ["failed"] * 3 and "listening" in attempts[3:]


def test_the_listen_stream_closes_once_the_last_task_ended(runtime: Deployment):
    async def scenario() -> tuple[int, int]:
        tasks = TasksClient()
        async with Client(runtime.url, extensions=[tasks]) as client:
            handle = await tasks.start(client, "work", {"seconds": 0.5})
            await handle.result()
            while_open = len(client.session._listen_routes)
            handle.close()
            with anyio.fail_after(5):
                while client.session._listen_routes:
                    await anyio.sleep(0.05)
            return while_open, len(client.session._listen_routes)

    assert run(scenario)[1] == 0


def test_a_closed_handle_says_so_instead_of_waiting(runtime: Deployment):
    async def scenario() -> None:
        tasks = TasksClient()
        async with Client(runtime.url, extensions=[tasks]) as client:
            handle = await tasks.start(client, "work", {"seconds": 0.2})
            handle.close()
            with anyio.fail_after(5), pytest.raises(RuntimeError, match="closed"):
                await handle.result()

    run(scenario)


async def _every_update(handle: Any) -> None:
    async for _ in handle.updates():
        pass


def test_closing_a_handle_ends_what_another_coroutine_awaits_on_it(runtime: Deployment):
    """`close()` from one coroutine while another is in `updates()` or `result()` on the same handle: both say
    the handle is closed at once, instead of waiting for a change that will never be delivered to them."""

    async def scenario() -> list[str]:
        tasks = TasksClient()
        ended: list[str] = []
        async with Client(runtime.url, extensions=[tasks]) as client:
            for how in ("updates", "result"):
                handle = await tasks.start(client, "work", {"seconds": 30})

                async def follow(handle: Any = handle, how: str = how) -> None:
                    waiting = _every_update(handle) if how == "updates" else handle.result()
                    with pytest.raises(RuntimeError, match="closed"):
                        await waiting
                    ended.append(how)

                with anyio.fail_after(10):
                    async with anyio.create_task_group() as group:
                        group.start_soon(follow)
                        await anyio.sleep(0.5)
                        handle.close()
                await handle.cancel()  # the server keeps a closed handle's task: this test does not
        return ended

    assert run(scenario) == ["updates", "result"]


def test_following_has_ended_when_a_task_ends_or_stop_following_returns(runtime: Deployment):
    """The connection may close next: no listen stream is left open for a late notification to arrive on."""

    async def scenario() -> tuple[int, int, int, str]:
        tasks = TasksClient()
        async with Client(runtime.url, extensions=[tasks]) as client:
            first = await tasks.start(client, "work", {"seconds": 30})
            with anyio.fail_after(10):
                while not client.session._listen_routes:
                    await anyio.sleep(0.02)
            while_followed = len(client.session._listen_routes)
            await first.cancel()  # its last followed task ended: following has ended when this returns
            after_cancel = len(client.session._listen_routes)
            second = await tasks.start(client, "work", {"seconds": 30})
            with anyio.fail_after(10):
                while not client.session._listen_routes:
                    await anyio.sleep(0.02)
            await tasks.stop_following(client)  # a task still followed, the caller leaving
            after_stop = len(client.session._listen_routes)
            with anyio.fail_after(5), pytest.raises(MCPError) as stopped:
                await second.result()
            await second.cancel()
            return while_followed, after_cancel, after_stop, stopped.value.message

    while_followed, after_cancel, after_stop, message = run(scenario)
    assert (while_followed, after_cancel, after_stop) == (1, 0, 0)
    assert message == "Following stopped: the client is leaving this connection"
