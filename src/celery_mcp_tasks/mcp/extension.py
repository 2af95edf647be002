"""`TasksExtension`: intercepts `tools/call` for task tools and serves `tasks/get`, `tasks/update`, `tasks/cancel`.

The store and the Celery publish are synchronous, so every call to the service runs on a bounded
thread pool. Check order on `tasks/*`: the routing header (-32020), the client's opt-in (-32021,
before any lookup), then the owner-scoped lookup (-32602, the same for a missing, evicted or
foreign task; the id is never echoed). A store outage is -32603 on every path and era.
A client without the extension gets the synchronous path (`mcp.sync`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from functools import partial
from typing import Any, TypeVar

import anyio
import anyio.to_thread
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.extension import Extension, MethodBinding
from mcp_types import CallToolRequestParams, InputRequiredResult
from pydantic import ValidationError

from celery_mcp_tasks.mcp.principal import anonymous_caller, current_principal
from celery_mcp_tasks.mcp.sync import SyncCalls
from celery_mcp_tasks.mcp.toolspec import TaskTool
from celery_mcp_tasks.mcp.wire import (
    TaskIdParams,
    UpdateParams,
    check_task_fields,
    declared_capability,
    declared_extension,
    idempotency_key_of,
    internal,
    invalid_params,
    missing_capability,
    missing_extension,
    plain_responses,
    quota_exceeded,
    require_routing_name,
    required_capabilities,
    row_cap_reached,
    store_unavailable,
    task_id_of,
)
from celery_mcp_tasks.model import DEFAULT, InvalidInputResponse, TaskRecord, TaskUnreadable
from celery_mcp_tasks.notify.hub import Hub
from celery_mcp_tasks.propagation import creating
from celery_mcp_tasks.protocol import (
    EXTENSION_ID,
    IDEMPOTENCY_META_KEY,
    TASKS_VERSIONS,
    render_create_result,
    render_task,
)
from celery_mcp_tasks.service import IdempotencyKeyReused, PayloadTooLarge, TaskExpired, TaskService
from celery_mcp_tasks.store.base import Quota, QuotaExceeded, StoreUnavailable, TaskLimitReached, TaskNotFound

T = TypeVar("T")
_COMPLETE = {"resultType": "complete"}
_MAX_THREADS = 32  # the service calls of tools/call and tasks/* running at once in this process


class TasksExtension(Extension):
    """The Tasks extension for `MCPServer(extensions=[...])` (`McpTasks` builds and wires it).

    `sync_timeout_s`: the bound on a synchronous call's silence (`SyncCalls`). `hub`: this process's
    push hub (`hub()` None: push is off). `sealed_state`: whether the SDK seals `requestState` here.
    `quota`: each principal's limits (a tool's `max_active` replaces `active_tool`; None: no quota).
    `refused(tool, limit)`: told of each creation a quota or the row cap refused (metrics). `anonymous_per_client`:
    anonymous callers' quotas count per client address (`principal.anonymous_caller`), not as one.
    """

    identifier = EXTENSION_ID

    def __init__(
        self,
        tools: Mapping[str, TaskTool],
        service: Callable[[], TaskService],
        *,
        known_tool: Callable[[str], bool],
        sync_timeout_s: float,
        hub: Callable[[], Hub | None],
        sealed_state: Callable[[], bool],
        quota: Quota | None = None,
        refused: Callable[[str, str], None] | None = None,
        anonymous_per_client: bool = False,
    ) -> None:
        self._tools = tools
        self._quota = quota
        self._per_client = anonymous_per_client
        self._refused = refused
        self._service = service
        self._known_tool = known_tool
        self._limiter = anyio.CapacityLimiter(_MAX_THREADS)
        self._sync = SyncCalls(service, self._run, sync_timeout_s=sync_timeout_s, hub=hub, sealed_state=sealed_state)

    def abandon_synchronous_calls(self, message: str) -> None:
        """Cancel the hidden task of every synchronous call in flight (`SyncCalls.abandon_all`)."""
        self._sync.abandon_all(message)

    async def _run(self, fn: Callable[[], T], method: str, *, logged: bool = True) -> T:
        """`fn` on the bounded pool; a store outage answers -32603 with a fixed message (and a log line unless not
        `logged`: a re-read that already said so), and an answer or a cancel for a row this process cannot open
        -32603 saying why (not an acknowledgement of a write that was dropped)."""
        try:
            return await anyio.to_thread.run_sync(fn, limiter=self._limiter)
        except StoreUnavailable as exc:
            raise store_unavailable(method, exc, logged=logged) from None
        except TaskUnreadable as exc:
            raise internal(str(exc)) from None

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
            if not self._known_tool(params.name):
                raise invalid_params(f"Unknown tool: {params.name}")
            return await call_next(ctx)

        # Before anything is asked of the client or created for it.
        check_task_fields(ctx.params, legacy_task=ctx.protocol_version not in TASKS_VERSIONS)
        sent_key = idempotency_key_of(ctx.params)
        if sent_key is not None and self._service().idempotency_secret is None:
            raise invalid_params(f"Invalid _meta: this server does not accept {IDEMPOTENCY_META_KEY}")
        with_tasks = declared_extension(ctx) and tool.mode != "forbidden"
        if tool.mode == "required" and not with_tasks:
            what = EXTENSION_ID
            if ctx.protocol_version not in TASKS_VERSIONS:
                what += (
                    f" (this session negotiated protocol {ctx.protocol_version}; tool {tool.name} runs only as"
                    " a task, which needs protocol 2026-07-28)"
                )
            raise missing_extension(what)
        missing = sorted(name for name in tool.needs if not declared_capability(ctx, name))
        if missing:
            raise missing_capability(required_capabilities(missing), ", ".join(missing))

        arguments = dict(params.arguments or {})
        try:
            tool.validate(arguments)
        except ValidationError:
            # The model's mistake, for it to read and correct: the SDK answers it for the
            # tool's registered stand-in exactly as for a plain tool of the same signature
            # (a CallToolResult with isError and pydantic's field-level reasons, long values
            # cut, on every era and path). Nothing is created.
            return await call_next(ctx)

        owner = current_principal()  # a token naming nobody is refused before the tool's own code runs
        if not with_tasks:
            resumed = await self._sync.resume(tool, params)
            if resumed is not None:  # the retry of a synchronous call's MRTR round: answered, wait again
                idempotent = sent_key is not None or tool.derived_idempotency_key(arguments) is not None
                return await self._sync.call(tool, ctx, resumed, idempotent=idempotent)

        seeded: dict[str, Any] = {}
        if tool.prepare is not None:
            answers = plain_responses(params.input_responses)
            prepared = await tool.prepare(arguments, answers)
            if isinstance(prepared, InputRequiredResult):
                return prepared
            if prepared is not None and not isinstance(prepared, dict):  # the server's mistake: its log says which
                raise TypeError(f"task tool {tool.name!r}: prepare returned {type(prepared).__name__}, not a dict")
            seeded = dict(prepared or {})

        idempotency_key = sent_key if sent_key is not None else tool.derived_idempotency_key(arguments)
        if idempotency_key is not None and sent_key is None and self._service().idempotency_secret is None:
            # `serve` refuses to start so; a server started otherwise must not run the job twice either
            raise internal(f"Tool {tool.name} derives idempotency keys, and this server has no secret to derive ids")
        create = partial(
            self._create,
            tool=tool,
            owner=owner,
            arguments=arguments,
            seeded=seeded,
            message="Queued" if with_tasks else None,
            idempotency_key=idempotency_key,
            key_sent=sent_key is not None,
            caller=anonymous_caller(ctx.request) if owner is None and self._per_client else None,
            # A synchronous call's hidden task: nothing of it reaches the caller before a later durable write
            # (the outcome, a question), which flushes the creation too. An idempotent call's stays durable:
            # its key promises one job, and a lost row would let a retry run it again.
            durable=with_tasks or idempotency_key is not None,
        )
        task_id, record = await self._run(create, "tools/call")
        if with_tasks:
            return render_create_result(task_id, record)
        # A cancel that arrived during the create lands at the wait's first await, which abandons the row.
        return await self._sync.call(tool, ctx, record, idempotent=idempotency_key is not None)

    def _create(
        self,
        *,
        tool: TaskTool,
        owner: str | None,
        arguments: dict[str, Any],
        seeded: dict[str, Any],
        message: str | None,
        idempotency_key: str | None,
        key_sent: bool,
        caller: str | None,
        durable: bool,
    ) -> tuple[str, TaskRecord]:
        quota = self._quota_of(tool)
        try:
            with creating(tool.name) as trace_context:  # a child of the SDK's tools/call span
                return self._service().create(
                    owner=owner,
                    tool=tool.name,
                    arguments=arguments,
                    ttl_ms=DEFAULT if tool.ttl_ms == "default" else tool.ttl_ms,
                    poll_interval_ms=DEFAULT if tool.poll_interval_ms == "default" else tool.poll_interval_ms,
                    status_message=message,
                    input_responses=seeded,
                    trace_context=trace_context,
                    quota=quota,
                    idempotency_key=idempotency_key,
                    caller=caller,  # an anonymous client's hash (per_client): its quotas and fair queue by it
                    durable=durable,
                )
        except TaskLimitReached:  # the service logged it (a line a minute at most)
            if self._refused is not None:
                self._refused(tool.name, "max_rows")
            raise row_cap_reached(self._service().max_rows) from None
        except QuotaExceeded as exc:
            if self._refused is not None:
                self._refused(tool.name, exc.limit)
            raise quota_exceeded(exc, tool.name) from None
        except IdempotencyKeyReused as exc:
            field = f"_meta {IDEMPOTENCY_META_KEY}" if key_sent else f"the idempotency key tool {tool.name} derives"
            raise invalid_params(
                f"Invalid params: {field} was already used {exc.how}; use a new key for a new call"
            ) from None
        except PayloadTooLarge as exc:  # nothing was created
            raise invalid_params(str(exc)) from None

    def _quota_of(self, tool: TaskTool) -> Quota | None:
        """The principal's limits for a creation of `tool`: the settings', the tool's `max_active` first."""
        base = self._quota
        if tool.max_active is None:
            return base
        if base is None:
            return Quota(active_tool=tool.max_active)
        return replace(base, active_tool=tool.max_active)

    # -- tasks/get | update | cancel --------------------------------------------------------

    def _guard(self, ctx: ServerRequestContext[Any, Any], params: TaskIdParams) -> str:
        """The request's task id, once its routing name and the extension are checked."""
        task_id = task_id_of(params)
        require_routing_name(ctx, task_id)
        if not declared_extension(ctx):
            raise missing_extension()
        return task_id

    async def _lookup(self, fn: Callable[[], T], method: str) -> T:
        """`fn` on the bounded pool (`_run`); a missing, foreign or expired task answers "not found"."""
        try:
            return await self._run(fn, method)
        except TaskNotFound:
            raise invalid_params("Failed to retrieve task: Task not found") from None
        except TaskExpired:
            raise invalid_params("Failed to retrieve task: Task has expired") from None

    async def get(self, ctx: ServerRequestContext[Any, Any], params: TaskIdParams) -> dict[str, Any]:
        task_id = self._guard(ctx, params)
        record = await self._lookup(partial(self._service().get, task_id, current_principal()), "tasks/get")
        return {**_COMPLETE, **render_task(task_id, record)}

    async def update(self, ctx: ServerRequestContext[Any, Any], params: UpdateParams) -> dict[str, Any]:
        task_id = self._guard(ctx, params)
        responses = params.input_responses
        if not isinstance(responses, dict):
            raise invalid_params("inputResponses must be an object")
        answer = partial(self._service().answer, task_id, current_principal(), responses)
        try:
            await self._lookup(answer, "tasks/update")
        except (InvalidInputResponse, PayloadTooLarge) as exc:  # nothing was changed
            raise invalid_params(str(exc)) from None
        return dict(_COMPLETE)

    async def cancel(self, ctx: ServerRequestContext[Any, Any], params: TaskIdParams) -> dict[str, Any]:
        task_id = self._guard(ctx, params)
        # The service revokes the job (off this request's path) when this call cancelled it.
        await self._lookup(partial(self._service().cancel, task_id, current_principal()), "tasks/cancel")
        return dict(_COMPLETE)
