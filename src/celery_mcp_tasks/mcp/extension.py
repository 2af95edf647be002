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
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any, TypeVar

import anyio
import anyio.to_thread
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.extension import Extension, MethodBinding
from mcp.shared.exceptions import MCPError
from mcp_types import CallToolRequestParams, InputRequiredResult
from pydantic import BaseModel, ValidationError

from celery_mcp_tasks.mcp.principal import current_principal
from celery_mcp_tasks.mcp.toolspec import TaskTool
from celery_mcp_tasks.mcp.wire import (
    TASKS_VERSIONS,
    TaskIdParams,
    UpdateParams,
    declared_capability,
    declared_extension,
    internal,
    invalid_params,
    missing_capability,
    not_found,
    require_extension,
    require_routing_name,
    store_unavailable,
)
from celery_mcp_tasks.model import InvalidInputResponse, TaskRecord, TaskStatus
from celery_mcp_tasks.protocol import EXTENSION_ID, render_create_result, render_error, render_task
from celery_mcp_tasks.service import TaskExpired, TaskService
from celery_mcp_tasks.store.base import StoreUnavailable, TaskLimitReached, TaskNotFound

logger = logging.getLogger("celery_mcp_tasks.mcp")

T = TypeVar("T")
_COMPLETE = {"resultType": "complete"}


class TasksExtension(Extension):
    identifier = EXTENSION_ID

    def __init__(
        self,
        tools: Mapping[str, TaskTool],
        service: Callable[[], TaskService],
        *,
        known_tool: Callable[[str], bool] | None = None,
        sync_timeout_s: float = 60.0,
        max_threads: int = 32,
    ) -> None:
        self._tools = tools
        self._service = service
        self._known_tool = known_tool
        self._sync_timeout_s = sync_timeout_s
        self._limiter = anyio.CapacityLimiter(max_threads)

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
        if with_tasks:
            task_id, record = await self._run(create, "tools/call")
            return render_create_result(task_id, record)
        return await self._call_synchronously(tool, create)

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

    async def _call_synchronously(self, tool: TaskTool, create: Callable[[], tuple[str, TaskRecord]]) -> HandlerResult:
        """A task tool called without the extension: run the job, wait for its outcome, answer plainly.

        The row is an implementation detail the client never sees: whenever the
        answer can no longer be delivered (the job needs input, the wait timed
        out, the caller cancelled the request) it is cancelled, so no job keeps
        running for nobody.
        """
        # Not abandoned on cancel: a cancel lands at the next await.
        _, record = await self._run(create, "tools/call")
        service = self._service()
        deadline = time.monotonic() + (tool.sync_timeout_s or self._sync_timeout_s)
        delay = 0.02
        try:
            while not record.terminal:
                if record.status is TaskStatus.INPUT_REQUIRED:
                    await self._abandon(record, "The job needs input; call it as a task")
                    raise internal(f"Tool {tool.name} needs input from the user; call it with the tasks extension")
                if time.monotonic() >= deadline:
                    await self._abandon(record, "Timed out waiting synchronously")
                    raise internal(f"Tool {tool.name} did not finish in time; call it with the tasks extension")
                await anyio.sleep(delay)
                delay = min(delay * 1.5, 0.25)
                latest = await self._run(partial(service.record, record.key), "tools/call")
                record = latest or record
        except anyio.get_cancelled_exc_class():
            with anyio.CancelScope(shield=True):
                await self._abandon(record, "The synchronous caller cancelled the request")
            raise
        if record.status is TaskStatus.COMPLETED and record.result is not None:
            return record.result
        error = render_error(record.error, record.status_message or "The job did not complete")
        raise MCPError(code=error["code"], message=error["message"], data=error.get("data"))

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


def _plain(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(by_alias=True, mode="json", exclude_none=True)
    return value
