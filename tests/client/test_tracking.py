"""How the client keeps one task's state (newer wins, terminal is final, out-of-order notifications are dropped),
follows it (each change once) and delivers answers (sent again only after an internal error, for a while)."""

from __future__ import annotations

import pickle
from typing import Any

import anyio
import pytest
from mcp.shared.exceptions import MCPError

from celery_mcp_tasks.client import TaskCancelled, TaskFailed, calls
from celery_mcp_tasks.client import handle as handle_module
from celery_mcp_tasks.client.calls import TaskNotFound, translate
from celery_mcp_tasks.client.following import Tracked
from celery_mcp_tasks.client.handle import TaskHandle
from celery_mcp_tasks.client.models import CreateTaskResult, TaskState


def state(status: str = "working", at: str = "2026-12-01T10:00:00.000Z", **extra: Any) -> TaskState:
    return TaskState.model_validate(
        {"taskId": "t", "status": status, "createdAt": "2026-12-01T10:00:00.000Z", "lastUpdatedAt": at, **extra}
    )


def test_a_newer_state_replaces_the_current_one_and_fires():
    tracked = Tracked(state=state())
    event = tracked.changed
    assert tracked.offer(state("input_required", "2026-12-01T10:00:01.000Z"))
    assert event.is_set() and tracked.version == 1 and tracked.state.status == "input_required"


def test_an_older_or_identical_state_is_ignored():
    tracked = Tracked(state=state("working", "2026-12-01T10:00:05.000Z"))
    assert not tracked.offer(state("input_required", "2026-12-01T10:00:04.000Z"))  # arrived out of order
    assert not tracked.offer(state("working", "2026-12-01T10:00:05.000Z"))
    assert tracked.version == 0


def test_a_terminal_state_is_final():
    tracked = Tracked(state=state("completed", "2026-12-01T10:00:05.000Z", result={"content": []}))
    assert not tracked.offer(state("working", "2026-12-01T10:00:09.000Z"))
    assert tracked.state.terminal


def test_a_final_state_without_its_outcome_takes_it_once_and_nothing_else():
    """A creation answered with a task already final (an idempotent call's repeat) carries no result:
    `tasks/get`'s state of the same status fills it in; nothing moves a final state otherwise."""
    tracked = Tracked(state=state("completed", "2026-12-01T10:00:05.000Z"))
    assert not tracked.offer(state("failed", "2026-12-01T10:00:05.000Z", error={"code": -1, "message": "x"}))
    assert not tracked.offer(state("completed", "2026-12-01T10:00:06.000Z"))  # still without it: nothing new
    assert tracked.offer(state("completed", "2026-12-01T10:00:05.000Z", result={"content": []}))
    assert tracked.state.result == {"content": []}
    assert not tracked.offer(state("completed", "2026-12-01T10:00:05.000Z", result={"content": [], "isError": True}))
    failed = Tracked(state=state("failed", "2026-12-01T10:00:05.000Z"))
    assert failed.offer(state("failed", "2026-12-01T10:00:05.000Z", error={"code": -32603, "message": "boom"}))


def test_another_tasks_state_is_never_taken():
    tracked = Tracked(state=state())
    other = state("completed", "2026-12-01T10:00:09.000Z").model_copy(update={"task_id": "u"})
    assert not tracked.offer(other)


def test_the_created_result_reads_as_a_state_and_progress_is_parsed():
    created = CreateTaskResult.model_validate(
        {
            "resultType": "task",
            "taskId": "t",
            "status": "working",
            "createdAt": "x",
            "lastUpdatedAt": "x",
            "ttlMs": None,
            "pollIntervalMs": 500,
            "statusMessage": "Queued",
        },
        by_name=False,
    )
    assert created.state().poll_interval_ms == 500 and created.state().status_message == "Queued"
    progressed = state(_meta={"io.github.celery-mcp-tasks/progress": {"progress": 3, "total": 10}})
    assert progressed.progress() == (3, 10)
    assert state().progress() is None


def test_progress_numbers_keep_their_type():
    """2 stays 2 (not 2.0): what the job reported, as it reported it."""
    key = "io.github.celery-mcp-tasks/progress"
    whole = state(_meta={key: {"progress": 2, "total": 5}}).progress()
    assert whole is not None and [type(n) for n in whole] == [int, int]
    assert state(_meta={key: {"progress": 0.5, "total": None}}).progress() == (0.5, None)
    assert state(_meta={key: {"progress": True}}).progress() is None  # a bool is not a number here


def test_a_state_that_differs_only_in_its_timestamp_or_the_protocols_meta_is_no_news():
    tracked = Tracked(state=state(statusMessage="Queued", _meta={"io.modelcontextprotocol/serverInfo": {"name": "s"}}))
    event = tracked.changed
    same = state(
        at="2026-12-01T10:00:01.000Z",
        statusMessage="Queued",
        _meta={"io.modelcontextprotocol/subscriptionId": "tasks-listen-1"},
    )
    assert not tracked.offer(same)
    envelope = state(at="2026-12-01T10:00:01.500Z", statusMessage="Queued", resultType="complete")
    assert not tracked.offer(envelope)  # a tasks/get answer's envelope field is no news either
    assert tracked.version == 0 and not event.is_set()
    assert tracked.state.last_updated_at == "2026-12-01T10:00:01.500Z"  # kept: the newest is what orders the next
    assert tracked.offer(state(at="2026-12-01T10:00:01.600Z", statusMessage="Started"))
    progressed = state(
        at="2026-12-01T10:00:02.000Z",
        statusMessage="Started",
        _meta={"io.github.celery-mcp-tasks/progress": {"progress": 1, "total": 2}},
    )
    assert tracked.offer(progressed) and tracked.version == 2


def test_a_failed_state_gives_its_jsonrpc_error():
    failed = state("failed", error={"code": -32603, "message": "RuntimeError: boom", "data": {"x": 1}})
    error = failed.error_data()
    assert (error.code, error.message, error.data) == (-32603, "RuntimeError: boom", {"x": 1})


@pytest.mark.parametrize(
    ("message", "gone"),
    [
        ("Failed to retrieve task: Task not found", True),
        ("Failed to retrieve task: Task has expired", True),
        ("inputResponses must be an object", False),
    ],
)
def test_only_a_missing_task_is_task_not_found(message: str, gone: bool):

    from celery_mcp_tasks.client import TaskNotFound

    assert isinstance(translate(MCPError(-32602, message)), TaskNotFound) is gone


def test_a_final_state_wins_whatever_its_timestamp_says():
    """Another server's clock or format must never keep a waiter from seeing the end."""
    tracked = Tracked(state=state("working", "2026-12-01T10:00:01.500Z"))
    assert tracked.offer(state("completed", "2026-12-01T10:00:01Z", result={"content": []}))


def test_timestamps_are_compared_as_moments_not_text():
    tracked = Tracked(state=state("working", "2026-12-01T10:00:01Z"))
    assert tracked.offer(state("input_required", "2026-12-01T10:00:01.5+00:00"))  # later, though it sorts lower
    assert not tracked.offer(state("working", "2026-12-01T11:00:00+02:00"))  # 09:00 UTC: older


def test_a_task_that_ends_wakes_its_follower():
    woken: list[bool] = []
    tracked = Tracked(state=state(), on_end=lambda: woken.append(True))
    tracked.offer(state("working", "2026-12-01T10:00:02.000Z", statusMessage="still going"))
    assert woken == []
    tracked.offer(state("cancelled", "2026-12-01T10:00:03.000Z"))
    assert woken == [True]


def _updates_until_lost(news: list[TaskState]) -> list[str]:
    """The statuses `updates()` yields for a followed task that, once the follower waits, receives `news` and
    then disappears, all before the follower runs again; `TaskNotFound` must end it."""
    tracked = Tracked(state=state())
    handle = TaskHandle(None, None, tracked, "t")  # type: ignore[arg-type]  # updates() reads only the tracked task
    seen: list[str] = []

    async def follow() -> None:
        async for update in handle.updates():
            seen.append(update.status)

    async def scenario() -> None:
        with anyio.fail_after(10):
            async with anyio.create_task_group() as group:
                group.start_soon(follow)
                await anyio.wait_all_tasks_blocked()  # the follower saw the state and waits for the next change
                for news_state in news:
                    tracked.offer(news_state)
                tracked.lose(TaskNotFound(-32602, "Task not found"))

    with pytest.raises(BaseExceptionGroup) as raised:
        anyio.run(scenario)
    assert raised.group_contains(TaskNotFound)
    return seen


def test_a_followed_task_that_disappears_raises_without_its_last_state_again():
    """`updates()` yields each change once: the loss fires the task's event (a version bump) but is no new state."""
    assert _updates_until_lost([]) == ["working"]


def test_a_state_that_came_just_before_the_loss_is_still_yielded():
    assert _updates_until_lost([state("input_required", "2026-12-01T10:00:01.000Z")]) == ["working", "input_required"]


def test_answers_are_sent_again_only_after_an_internal_error_and_only_for_a_while(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    failures: list[int] = []
    sent: list[object] = []

    async def send(session: object, request: object) -> None:
        sent.append(request)
        if failures:
            raise MCPError(failures.pop(0), "refused")

    monkeypatch.setattr(calls, "send", send)
    handle = TaskHandle(None, None, Tracked(state=state("input_required")), "t")  # type: ignore[arg-type]

    def deliver(*codes: int) -> int:
        failures[:], sent[:] = list(codes), []
        try:
            anyio.run(handle._deliver, {"k": {"action": "accept"}})
        finally:
            count = len(sent)
        return count

    assert deliver(-32603, -32603) == 3  # a restart behind a proxy: sent until it is taken
    with pytest.raises(MCPError):
        deliver(-32602)  # the answers themselves are refused: never sent again
    assert len(sent) == 1
    monkeypatch.setattr(handle_module, "_DELIVER_S", 0.3)  # the first pause (0.25 s) fits, the second not
    with pytest.raises(MCPError):
        deliver(*[-32603] * 10)
    assert len(sent) == 2


def test_a_final_states_errors_survive_pickling_with_their_state():
    """A client inside a Celery task: its exception is pickled to the result backend, and read back whole."""
    failed = TaskFailed(state("failed", error={"code": -32603, "message": "Job failed: boom"}))
    cancelled = TaskCancelled(state("cancelled", statusMessage="stopped by the user"))
    again_failed, again_cancelled = pickle.loads(pickle.dumps((failed, cancelled)))
    assert (again_failed.code, again_failed.message, again_failed.state) == (-32603, "Job failed: boom", failed.state)
    assert isinstance(again_failed, MCPError)
    assert str(again_cancelled) == "The task was cancelled: stopped by the user"
    assert again_cancelled.state == cancelled.state
