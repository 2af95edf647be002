"""`TasksExtension`: the Tasks extension on the SDK's `MCPServer`.

It intercepts `tools/call` for task tools and serves `tasks/get`,
`tasks/update` and `tasks/cancel`. Everything it knows about a task it reads
from the store through the service, on a bounded thread pool (the store and
the Celery publish are synchronous; nothing may block the event loop).

Check order on `tasks/*`: the routing header (-32020), the client's opt-in
(-32021, before any lookup), then the owner-scoped lookup (-32602, the same
answer for a missing, expired-and-evicted or foreign task; the id is never
echoed). A store outage is -32603 "The task store is unavailable" on every
path and every protocol era, with one log line naming the method.

A client that did not declare the extension (every earlier-era client, and a
2026-07-28 one without the opt-in) gets the synchronous path: the job runs
as a hidden task the client never sees, and the call answers with its outcome.
The wait wakes on the push hub's change hints; the job's reports reach the
caller as `notifications/progress`; its questions are asked on the request's
own stream (earlier eras) or as an MRTR `InputRequiredResult` (2026-07-28);
and a cancelled, abandoned or timed-out call cancels the hidden task.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any, TypeVar

import anyio
import anyio.to_thread
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.extension import Extension, MethodBinding
from mcp.shared.exceptions import MCPError
from mcp_types import CallToolRequestParams, InputRequiredResult
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import BaseModel, ValidationError

from celery_mcp_tasks.mcp.principal import current_principal
from celery_mcp_tasks.mcp.toolspec import TaskTool
from celery_mcp_tasks.mcp.wire import (
    TASKS_VERSIONS,
    CallProgress,
    TaskIdParams,
    UpdateParams,
    ask_client,
    can_answer,
    declared_capability,
    declared_extension,
    input_required,
    internal,
    invalid_params,
    missing_capability,
    not_found,
    require_extension,
    require_routing_name,
    store_unavailable,
    unless_caller_leaves,
)
from celery_mcp_tasks.model import InvalidInputResponse, TaskRecord, TaskStatus
from celery_mcp_tasks.notify.hub import Hub, Watch
from celery_mcp_tasks.protocol import EXTENSION_ID, render_create_result, render_error, render_task
from celery_mcp_tasks.service import TaskExpired, TaskService
from celery_mcp_tasks.store.base import StoreUnavailable, TaskLimitReached, TaskNotFound

logger = logging.getLogger("celery_mcp_tasks.mcp")

T = TypeVar("T")
_COMPLETE = {"resultType": "complete"}
_SYNC_STATE = "celery-mcp-tasks/sync/1:"
"""`requestState` of a synchronous call's MRTR round: this prefix, then the hidden row's key (sealed by the SDK)."""
_SAFETY_REREAD_S = 1.0  # with push on: a hint can be lost (or land before the watch exists); re-read anyway
_POLL_FIRST_S, _POLL_MAX_S = 0.02, 0.25  # with push off: poll the row, growing delay


class TasksExtension(Extension):
    """The Tasks extension for `MCPServer(extensions=[...])` (`McpTasks` builds and wires it).

    `sync_timeout_s` (default 60 s, `MCP_TASKS_SYNC_TIMEOUT_S`; a tool's own
    `@mcp_task(sync_timeout_s=...)` wins) bounds a synchronous call's silence,
    not its length: the bound restarts at every change the job reports (its
    state, statusMessage or progress), so a job that keeps reporting is never
    cut; one that stays silent that long is cancelled (and revoked for
    `terminate=True` tools) and the caller gets -32603. `hub`: this process's
    push hub (None: push is off, the wait polls the row). `sealed_state`: whether
    the SDK seals `requestState` on this server (a synchronous 2026-07-28 call
    asks its job's questions by MRTR only then).
    """

    identifier = EXTENSION_ID

    def __init__(
        self,
        tools: Mapping[str, TaskTool],
        service: Callable[[], TaskService],
        *,
        known_tool: Callable[[str], bool] | None = None,
        sync_timeout_s: float = 60.0,
        max_threads: int = 32,
        hub: Callable[[], Hub | None] | None = None,
        sealed_state: Callable[[], bool] | None = None,
    ) -> None:
        self._tools = tools
        self._service = service
        self._known_tool = known_tool
        self._sync_timeout_s = sync_timeout_s
        self._limiter = anyio.CapacityLimiter(max_threads)
        self._hub = hub
        self._sealed_state = sealed_state

    async def _run(self, fn: Callable[[], T], method: str) -> T:
        """`fn` on the bounded pool; a store outage answers -32603 with a fixed message."""
        try:
            return await anyio.to_thread.run_sync(fn, limiter=self._limiter)
        except StoreUnavailable as exc:
            raise store_unavailable(method, exc) from None

    def methods(self) -> list[MethodBinding]:
        return [
            MethodBinding("tasks/get", TaskIdParams, self.get, TASKS_VERSIONS),
            MethodBinding("tasks/update", UpdateParams, self.update, TASKS_VERSIONS),
            MethodBinding("tasks/cancel", TaskIdParams, self.cancel, TASKS_VERSIONS),
        ]

    # -- tools/call -------------------------------------------------------------------

    async def intercept_tool_call(
        self, params: CallToolRequestParams, ctx: ServerRequestContext[Any, Any], call_next: CallNext
    ) -> HandlerResult:
        tool = self._tools.get(params.name)
        if tool is None:
            if self._known_tool is not None and not self._known_tool(params.name):
                raise invalid_params(f"Unknown tool: {params.name}")
            return await call_next(ctx)

        with_tasks = declared_extension(ctx) and tool.mode != "forbidden"
        if tool.mode == "required" and not with_tasks:
            what = EXTENSION_ID
            if ctx.protocol_version not in TASKS_VERSIONS:
                what += (
                    f" (this session negotiated protocol {ctx.protocol_version}; tool {tool.name} runs only as"
                    " a task, which needs protocol 2026-07-28)"
                )
            raise missing_capability({"extensions": {EXTENSION_ID: {}}}, what)
        missing = sorted(name for name in tool.needs if not declared_capability(ctx, name))
        if missing:
            raise missing_capability({name: {} for name in missing}, ", ".join(missing))

        arguments = dict(params.arguments or {})
        try:
            tool.validate(arguments)
        except ValidationError as exc:
            raise invalid_params(
                f"Invalid arguments for tool {tool.name}: {', '.join(tool.invalid_fields(exc))}"
            ) from None

        if not with_tasks:
            resumed = await self._resume(tool, params)
            if resumed is not None:  # the retry of a synchronous call's MRTR round: answered, wait again
                return await self._call_synchronously(tool, ctx, resumed)

        seeded: dict[str, Any] = {}
        if tool.prepare is not None:
            answers = {k: _plain(v) for k, v in (params.input_responses or {}).items()}
            prepared = await tool.prepare(arguments, answers)
            if isinstance(prepared, InputRequiredResult):
                return prepared
            seeded = dict(prepared or {})

        owner = current_principal()
        create = partial(
            self._create,
            tool=tool,
            owner=owner,
            arguments=arguments,
            seeded=seeded,
            message="Queued" if with_tasks else None,
        )
        task_id, record = await self._run(create, "tools/call")
        if with_tasks:
            return render_create_result(task_id, record)
        # A cancel that arrived during the create lands at the wait's first await, which abandons the row.
        return await self._call_synchronously(tool, ctx, record)

    def _create(
        self,
        *,
        tool: TaskTool,
        owner: str | None,
        arguments: dict[str, Any],
        seeded: dict[str, Any],
        message: str | None,
    ) -> tuple[str, TaskRecord]:
        service = self._service()
        options: dict[str, Any] = {}
        if tool.ttl_ms != "default":
            options["ttl_ms"] = tool.ttl_ms
        if tool.poll_interval_ms != "default":
            options["poll_interval_ms"] = tool.poll_interval_ms
        try:
            return service.create(
                owner=owner,
                tool=tool.name,
                arguments=arguments,
                status_message=message,
                input_responses=seeded,
                **options,
            )
        except TaskLimitReached:
            raise internal("Task limit reached") from None

    async def _call_synchronously(
        self, tool: TaskTool, ctx: ServerRequestContext[Any, Any], record: TaskRecord
    ) -> HandlerResult:
        """A task tool called without the extension: wait for the hidden task's outcome, answer plainly.

        The row is an implementation detail the client never sees: whenever the
        answer can no longer be delivered (a question the client cannot answer,
        `sync_timeout_s` of silence, a cancelled request, a caller that went
        away) it is cancelled, so no job keeps running for nobody. An MRTR round
        is the one exit that leaves it waiting: for the retry.
        """
        hub = self._hub() if self._hub is not None else None
        watch = hub.watch([record.key]) if hub is not None else None
        latest = [record]
        try:
            outcome, gone = await unless_caller_leaves(ctx, lambda: self._follow(tool, ctx, latest, watch))
        except anyio.get_cancelled_exc_class():
            with anyio.CancelScope(shield=True):
                await self._abandon(latest[-1], "The synchronous caller cancelled the request")
            raise
        finally:
            if watch is not None:
                watch.close()
        if gone:
            await self._abandon(latest[-1], "The synchronous caller went away")
            raise internal(f"Tool {tool.name}: the caller disconnected")
        return outcome

    async def _follow(
        self, tool: TaskTool, ctx: ServerRequestContext[Any, Any], latest: list[TaskRecord], watch: Watch | None
    ) -> HandlerResult:
        """Wait (woken by `watch`, else polling) until the task ends, bridging its reports and questions.

        `latest` holds the last record read, for the caller to abandon on the way out.
        """
        service = self._service()
        record = latest[-1]
        idle_s = tool.sync_timeout_s or self._sync_timeout_s
        deadline = anyio.current_time() + idle_s
        reported = _reported(record)
        progress = CallProgress(ctx)
        delay = _POLL_FIRST_S
        while not record.terminal:
            if record.status is TaskStatus.INPUT_REQUIRED:
                asked = await self._ask(tool, ctx, record)
                if isinstance(asked, InputRequiredResult):
                    return asked
                latest.append(record := asked)
                deadline, reported = anyio.current_time() + idle_s, _reported(record)
                continue
            remaining = deadline - anyio.current_time()
            if remaining <= 0:
                await self._abandon(record, "Timed out waiting synchronously")
                raise internal(f"Tool {tool.name} did not finish in time; call it with the tasks extension")
            if watch is not None:
                hints = await watch.next(min(_SAFETY_REREAD_S, remaining))
                if hints and all(version is not None and version <= record.version for version in hints.values()):
                    continue  # nothing newer than what was read (the poller's first sight of the row)
            else:
                await anyio.sleep(min(delay, remaining))
                delay = min(delay * 1.5, _POLL_MAX_S)
            read = await self._run(partial(service.record, record.key), "tools/call")
            if read is None:
                raise internal(f"Tool {tool.name}: the job's task is gone")
            latest.append(record := read)
            if _reported(record) != reported:
                deadline, reported = anyio.current_time() + idle_s, _reported(record)
                if not record.terminal:
                    await progress.report(record.progress, record.progress_total, record.status_message)
        if record.status is TaskStatus.COMPLETED and record.result is not None:
            return record.result
        error = render_error(record.error, record.status_message or "The job did not complete")
        raise MCPError(code=error["code"], message=error["message"], data=error.get("data"))

    async def _ask(
        self, tool: TaskTool, ctx: ServerRequestContext[Any, Any], record: TaskRecord
    ) -> TaskRecord | InputRequiredResult:
        """The job asked: the client answers (the task resumes) or, when it cannot, the task is cancelled.

        2026-07-28: an MRTR round naming the row in its (sealed) `requestState`.
        Earlier eras: each question as a request on the call's own stream; the
        answers go into the task as `tasks/update` would put them.
        """
        requests = record.input_requests
        if can_answer(ctx, requests):
            if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
                if self._sealed_state is not None and self._sealed_state():
                    return input_required(requests, _SYNC_STATE + record.key)
            elif ctx.session.can_send_request:
                try:
                    answers = {key: await ask_client(ctx, request) for key, request in requests.items()}
                except (MCPError, ValidationError) as exc:
                    await self._abandon(record, "The client did not answer the job's question")
                    raise internal(
                        f"Tool {tool.name}: the client did not answer its input request ({type(exc).__name__})"
                    ) from None
                return await self._run(partial(self._service().answer_by_key, record.key, answers), "tools/call")
        await self._abandon(record, "The job needs input; call it as a task")
        raise internal(f"Tool {tool.name} needs input from the user; call it with the tasks extension")

    async def _resume(self, tool: TaskTool, params: CallToolRequestParams) -> TaskRecord | None:
        """The hidden task an MRTR retry names (answered with its `inputResponses`); None for any other call.

        The SDK has verified the seal (and the tool, arguments and principal it
        binds); the row must still be the caller's and this tool's.
        """
        state = params.request_state
        if not (isinstance(state, str) and state.startswith(_SYNC_STATE)):
            return None
        if self._sealed_state is None or not self._sealed_state():
            raise invalid_params("Invalid or expired requestState")  # never minted here: the key would be in clear
        key = state.removeprefix(_SYNC_STATE)
        owner = current_principal()
        responses = {k: _plain(v) for k, v in (params.input_responses or {}).items()}
        service = self._service()

        def answer() -> TaskRecord | None:
            record = service.store.get(key, owner)
            if record is None or record.tool != tool.name or record.expired(service.clock()):
                return None
            return service.answer_by_key(key, responses) if responses else record

        try:
            record = await self._run(answer, "tools/call")
        except (TaskNotFound, TaskExpired):
            record = None
        except InvalidInputResponse as exc:
            raise invalid_params(str(exc)) from None
        if record is None:
            raise invalid_params("Invalid or expired requestState")
        return record

    async def _abandon(self, record: TaskRecord, message: str) -> None:
        """Cancel a synchronous call's hidden task (a no-op once it is terminal; the service revokes its job).

        Never raises: it runs on the way out of another answer (or of a cancellation).
        With the store down the job ends on its own, or the reaper ends it.
        """
        try:
            await self._run(partial(self._service().cancel_by_key, record.key, message), "tools/call")
        except MCPError:
            pass  # the store is unavailable: already logged

    # -- tasks/get | update | cancel --------------------------------------------------------

    def _guard(self, ctx: ServerRequestContext[Any, Any], task_id: str) -> None:
        require_routing_name(ctx, task_id)
        require_extension(ctx)

    async def _lookup(self, fn: Callable[[], T], method: str) -> T:
        try:
            return await self._run(fn, method)
        except TaskNotFound:
            raise not_found() from None
        except TaskExpired:
            raise not_found(expired=True) from None

    async def get(self, ctx: ServerRequestContext[Any, Any], params: TaskIdParams) -> dict[str, Any]:
        self._guard(ctx, params.task_id)
        owner = current_principal()
        record = await self._lookup(partial(self._service().get, params.task_id, owner), "tasks/get")
        return {**_COMPLETE, **render_task(params.task_id, record)}

    async def update(self, ctx: ServerRequestContext[Any, Any], params: UpdateParams) -> dict[str, Any]:
        self._guard(ctx, params.task_id)
        responses = params.input_responses
        if not isinstance(responses, dict):
            raise invalid_params("inputResponses must be an object")
        answer = partial(self._service().answer, params.task_id, current_principal(), responses)
        try:
            await self._lookup(answer, "tasks/update")
        except InvalidInputResponse as exc:
            raise invalid_params(str(exc)) from None
        return dict(_COMPLETE)

    async def cancel(self, ctx: ServerRequestContext[Any, Any], params: TaskIdParams) -> dict[str, Any]:
        self._guard(ctx, params.task_id)
        # The service revokes the job (off this request's path) when this call cancelled it.
        await self._lookup(partial(self._service().cancel, params.task_id, current_principal()), "tasks/cancel")
        return dict(_COMPLETE)


def _reported(record: TaskRecord) -> tuple[Any, ...]:
    """What the job reports (state, message, progress, questions): a change restarts the idle bound.

    Not the version: a run's claim and other bookkeeping bump it without the job saying anything.
    """
    return (record.status, record.status_message, record.progress, record.progress_total, tuple(record.input_requests))


def _plain(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(by_alias=True, mode="json", exclude_none=True)
    return value
