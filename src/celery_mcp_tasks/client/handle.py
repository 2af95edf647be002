"""`TaskHandle`: one task as an application holds it (its state, its changes, its questions, cancel)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Mapping
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc
from mcp.shared.exceptions import MCPError
from mcp_types import INTERNAL_ERROR, INVALID_PARAMS, CallToolResult, ErrorData, InputRequest
from pydantic import BaseModel, TypeAdapter, ValidationError

from celery_mcp_tasks.client import calls
from celery_mcp_tasks.client.calls import InputNotAnswered, TaskCancelled, TaskFailed, TaskNotFound
from celery_mcp_tasks.client.following import Pacing, Tracked, outcome_missing
from celery_mcp_tasks.client.models import (
    CancelTaskRequest,
    TaskIdParams,
    TaskState,
    TaskStatus,
    UpdateParams,
    UpdateTaskRequest,
)

if TYPE_CHECKING:
    from mcp.client.session import ClientSession


logger = logging.getLogger("celery_mcp_tasks.client")
_DELIVER_S = 30.0  # how long answers are sent again while the server answers with an internal error

_INPUT_REQUEST: TypeAdapter[Any] = TypeAdapter(InputRequest)


class TaskHandle:
    """One task: its id, its latest state, its changes, and what a client can do with it.

    `TasksClient.start` and `TasksClient.attach` make one (never construct it yourself);
    `async with handle:` closes it on the way out.
    """

    def __init__(
        self,
        tasks: Pacing,
        session: ClientSession,
        tracked: Tracked | None,
        tool: str | None,
        *,
        immediate: CallToolResult | None = None,
    ) -> None:
        self._tasks = tasks
        self._session = session
        self._tracked = tracked
        self.tool = tool
        self._immediate = immediate
        self._closed = False
        if tracked is not None:
            tracked.refs += 1

    @property
    def id(self) -> str | None:
        """The task id (keep it to `attach` later); None when the tool answered at once."""
        return self._tracked.state.task_id if self._tracked is not None else None

    @property
    def state(self) -> TaskState | None:
        """The latest state seen (None when the tool answered at once)."""
        return self._tracked.state if self._tracked is not None else None

    @property
    def status(self) -> TaskStatus:
        """The latest status seen (`"completed"` when the tool answered at once)."""
        return self._tracked.state.status if self._tracked is not None else "completed"

    @property
    def finished(self) -> bool:
        """True once the task is final, gone, or the tool answered at once: nothing more will change."""
        tracked = self._tracked
        return tracked is None or tracked.state.terminal or tracked.gone is not None

    async def refresh(self) -> TaskState | None:
        """Read the task now (`tasks/get`)."""
        tracked = self._tracked
        if tracked is None:
            return None
        try:
            tracked.offer(await calls.get_task(self._session, tracked.state.task_id))
        except TaskNotFound as gone:
            tracked.lose(gone)
            raise
        return tracked.state

    async def updates(self) -> AsyncIterator[TaskState]:
        """The current state, then each change, ending after the terminal one.

        It only reports: an `input_required` state stays until you answer it (`respond(state)`
        or `answer(...)`); `wait()` and `result()` answer with the session's callbacks.
        Raises `TaskNotFound` when the task disappears while followed.
        """
        tracked = self._open()
        if tracked is None:
            return
        seen = -1
        last: TaskState | None = None
        while True:
            self._open()  # closed meanwhile (by another coroutine): RuntimeError
            if tracked.gone is not None and tracked.state is last:  # the loss bumped the version: no repeat
                raise tracked.gone
            if tracked.version != seen:
                seen, last = tracked.version, tracked.state
                yield last
                if tracked.state.terminal:
                    await self._settle()
                    return
            if tracked.gone is not None:
                raise tracked.gone
            if tracked.version == seen:
                await tracked.changed.wait()

    async def wait(self, *, answer_input: bool = True) -> TaskState | None:
        """Wait for the task to end and return its final state (no exception for failed/cancelled).

        With `answer_input`, questions are answered with the session's callbacks.
        """
        tracked = self._open()
        if tracked is None:
            return None
        while True:
            self._open()  # closed meanwhile (by another coroutine): RuntimeError
            state = tracked.state
            if state.terminal:
                if outcome_missing(state):
                    await self.refresh()  # e.g. a CreateTaskResult that was already final: read the outcome
                await self._settle()
                return tracked.state
            if tracked.gone is not None:
                raise tracked.gone
            version = tracked.version
            if answer_input and state.status == "input_required":
                await self._respond_while_asked(tracked, state)
            if tracked.version == version:
                await tracked.changed.wait()

    async def _respond_while_asked(self, tracked: Tracked, state: TaskState) -> None:
        """`respond`, given up as soon as the questions are gone (answered elsewhere, task ended or lost)."""
        asked = set(state.input_requests or {}) - tracked.answered

        async def watch(group: anyio.abc.TaskGroup) -> None:
            while True:
                await tracked.changed.wait()
                now = tracked.state
                if (
                    self._closed
                    or now.terminal
                    or tracked.gone is not None
                    or not asked & set(now.input_requests or {})
                ):
                    group.cancel_scope.cancel()
                    return

        failure: Exception | None = None
        async with anyio.create_task_group() as group:
            group.start_soon(watch, group)
            try:
                await self.respond(state)
            except Exception as exc:  # noqa: BLE001 - re-raised below, outside the group (no ExceptionGroup)
                failure = exc
            group.cancel_scope.cancel()
        if failure is not None:
            raise failure

    async def result(self, *, answer_input: bool = True) -> CallToolResult:
        """The task's `CallToolResult` once it completes (bound it with `anyio.fail_after`).

        failed -> `TaskFailed` (an `MCPError` with the task's error); cancelled -> `TaskCancelled`.
        """
        if self._immediate is not None:
            return self._immediate
        state = await self.wait(answer_input=answer_input)
        assert state is not None
        if state.status == "completed":
            try:
                return state.call_tool_result()
            except ValidationError as exc:
                raise MCPError(INVALID_PARAMS, f"The completed task's result is not a CallToolResult: {exc}") from None
        if state.status == "failed":
            raise TaskFailed(state)
        raise TaskCancelled(state)

    async def respond(self, state: TaskState) -> None:
        """Answer the outstanding questions in `state` with the session's callbacks, then `tasks/update`.

        A question this client cannot answer (no callback for it, or the callback
        refused with an error) cancels the task and raises `InputNotAnswered`. A question another coroutine
        (or another handle of the task on this connection) is asking already is not asked twice: this waits
        for that answer instead.
        """
        if not state.input_requests:
            return
        tracked = self._require()
        while True:
            outstanding = {k: v for k, v in state.input_requests.items() if k not in tracked.answered}
            elsewhere = [tracked.asking[k] for k in outstanding if k in tracked.asking]
            pending = {k: v for k, v in outstanding.items() if k not in tracked.asking}
            if pending:
                mine = {key: anyio.Event() for key in pending}
                tracked.asking.update(mine)
                try:
                    await self._ask(state, pending)
                    tracked.answered.update(pending)  # only once delivered: a later `respond` asks again
                finally:
                    for key, done in mine.items():
                        tracked.asking.pop(key, None)
                        done.set()
            if not elsewhere:
                return
            for done in elsewhere:
                await done.wait()
            # Answered there, or that asker gave up (cancelled, its send failed): what is left is asked here.

    async def _ask(self, state: TaskState, pending: dict[str, Any]) -> None:
        """Ask `pending` with the session's callbacks (at once), then deliver every answer in one `tasks/update`."""
        from mcp.client.session import ClientRequestContext

        responses: dict[str, Any] = {}
        refused: tuple[str, ErrorData] | None = None
        cause: Exception | None = None  # what the user's callback raised for it, if it raised

        async def ask(key: str, raw: Any) -> None:
            nonlocal refused, cause
            try:
                request = _INPUT_REQUEST.validate_python(raw, by_name=False)
            except ValidationError:
                refused = (
                    str(raw.get("method") if isinstance(raw, dict) else "?"),
                    ErrorData(code=INVALID_PARAMS, message="the server sent a malformed input request"),
                )
                return
            ctx = ClientRequestContext(session=self._session, request_id=key, meta=None)
            raised: Exception | None = None
            try:
                answer = await self._session.dispatch_input_request(ctx, request)
            except Exception as exc:  # noqa: BLE001 - the user's callback: a refusal, not an ExceptionGroup
                answer = ErrorData(code=INTERNAL_ERROR, message=f"its callback raised {type(exc).__name__}")
                raised = exc
            if isinstance(answer, ErrorData):
                refused, cause = (request.method, answer), raised
                group.cancel_scope.cancel()
                return
            responses[key] = answer.model_dump(by_alias=True, mode="json", exclude_none=True)

        async with anyio.create_task_group() as group:
            for key, raw in pending.items():
                group.start_soon(ask, key, raw)
        if refused is not None:
            method, error = refused
            await self._cancel_on_the_way_out()
            raise InputNotAnswered(
                error.code,
                f"The task asked for {method}, which this client did not answer ({error.message});"
                " the task was cancelled",
            ) from cause
        await self._deliver(responses)

    async def _deliver(self, responses: dict[str, Any]) -> None:
        """`answer`, sent again while the server answers with an internal error (a restart behind a proxy, a
        store outage) for up to `_DELIVER_S`: answers the task already has are ignored, so a second copy is
        harmless, and a user's answer is not lost to one bad response. Each send is shielded (once asked and
        answered, a send under way is finished); the pause between sends is not."""
        deadline = anyio.current_time() + _DELIVER_S
        pause = 0.25
        while True:
            try:
                with anyio.CancelScope(shield=True):
                    await self.answer(responses)
                return
            except MCPError as exc:
                if exc.code != INTERNAL_ERROR or anyio.current_time() + pause > deadline:
                    raise
                logger.warning("tasks/update failed (%s); sending the answers again", calls.brief(exc))
            await anyio.sleep(pause)
            pause = min(pause * 2, 5.0)

    async def answer(self, responses: Mapping[str, Any]) -> None:
        """Send answers (`tasks/update`), keyed as the task's `inputRequests` are."""
        tracked = self._require()
        plain = {
            k: v.model_dump(by_alias=True, mode="json", exclude_none=True) if isinstance(v, BaseModel) else v
            for k, v in responses.items()
        }
        request = UpdateTaskRequest(params=UpdateParams(task_id=tracked.state.task_id, input_responses=plain))
        await calls.send(self._session, request)

    async def cancel(self) -> None:
        """Ask the server to cancel the task (`tasks/cancel`); a finished task stays as it is."""
        tracked = self._require()
        await calls.send(self._session, CancelTaskRequest(params=TaskIdParams(task_id=tracked.state.task_id)))
        with contextlib.suppress(TaskNotFound):
            await self.refresh()
        await self._settle()

    async def _cancel_on_the_way_out(self) -> None:
        """Shielded and bounded: the caller is leaving (cancelled, timed out, failed to answer)."""
        with anyio.CancelScope(shield=True), anyio.move_on_after(self._tasks.cancel_timeout):
            try:
                await self.cancel()
            except (MCPError, OSError) as exc:
                logger.warning("could not cancel an abandoned task: %s", type(exc).__name__)

    def close(self) -> None:
        """Stop following the task (the server keeps it; `attach` again later)."""
        if self._closed or self._tracked is None:
            return
        self._closed = True
        self._tracked.refs -= 1
        if self._tracked.refs <= 0 and self._tracked.on_end is not None:
            self._tracked.on_end()  # nobody follows it any more: the follower may let it go
        self._tracked.wake()  # a coroutine waiting on this handle (`updates`, `wait`, `result`) raises, not hangs

    async def _settle(self) -> None:
        """The task ended: when it was the connection's last followed task, wait until following has
        ended, so the connection may close next without a notification still under way."""
        if self._tracked is not None and self._tracked.settle is not None:
            await self._tracked.settle()

    def _open(self) -> Tracked | None:
        if self._closed:
            raise RuntimeError("this TaskHandle is closed; attach() again to follow the task")
        return self._tracked

    def _require(self) -> Tracked:
        if self._tracked is None:
            raise RuntimeError("this tool answered at once: there is no task to update or cancel")
        return self._tracked

    async def __aenter__(self) -> TaskHandle:
        return self

    async def __aexit__(self, *_: object) -> None:
        self.close()
        await self._settle()
