"""`TasksClient`: the Tasks extension for the SDK's `Client` (the guide is docs/clients.md)."""

from __future__ import annotations

import contextvars
import logging
import weakref
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

import anyio
from mcp.client.extension import ClaimContext, ClientExtension, NotificationBinding, ResultClaim
from mcp.shared.exceptions import MCPError
from mcp_types import INVALID_REQUEST, REQUEST_TIMEOUT, CallToolResult, RequestParamsMeta, TextContent
from pydantic import BaseModel, ConfigDict, ValidationError

from celery_mcp_tasks.client import calls
from celery_mcp_tasks.client.calls import TASKS_VERSIONS
from celery_mcp_tasks.client.following import Follower
from celery_mcp_tasks.client.handle import TaskHandle
from celery_mcp_tasks.client.models import CreateTaskResult, TaskState
from celery_mcp_tasks.protocol import EXTENSION_ID

if TYPE_CHECKING:
    from mcp.client.client import Client
    from mcp.client.session import ClientSession
    from mcp.shared.dispatcher import ProgressFnT

logger = logging.getLogger("celery_mcp_tasks.client")


class _TasksNotificationParams(BaseModel):
    model_config = ConfigDict(extra="allow")


class TasksClient(ClientExtension):
    """The Tasks extension for `mcp.Client(extensions=[...])`.

    A plain `call_tool` on a task tool follows the task to its end and returns the `CallToolResult`
    the synchronous call would have; a `failed` task raises `MCPError` with the task's error, a
    `cancelled` one `TaskCancelled`, a task the server no longer knows `TaskNotFound`. Questions are
    answered with the client's own callbacks; cancelling the awaiting coroutine cancels the task.

    poll_floor_s / poll_ceiling_s: the bounds of the polling interval when the server
    does not follow tasks on listen (the server's `pollIntervalMs` inside them, growing
    by `backoff` while nothing changes).
    timeout: the longest a plain `call_tool` waits for a task (None: as long as it runs);
    past it the task is cancelled and `TimeoutError` raised. A call's own `read_timeout_seconds`
    bounds its task too (the smaller of the two applies): past it the task is cancelled and the
    SDK's `MCPError` (-32001, request timeout) raised, as without the extension. The client's
    `Client(read_timeout_seconds=)` bounds each request, not a task.
    cancel_timeout: how long a `tasks/cancel` on the way out may take.
    listen: follow tasks on `subscriptions/listen` when the server offers it.
    """

    identifier = EXTENSION_ID

    def __init__(
        self,
        *,
        poll_floor_s: float = 0.1,
        poll_ceiling_s: float = 5.0,
        backoff: float = 1.5,
        timeout: float | None = None,
        cancel_timeout: float = 5.0,
        listen: bool = True,
    ) -> None:
        if poll_floor_s <= 0 or poll_ceiling_s < poll_floor_s or backoff < 1:
            raise ValueError("TasksClient: need 0 < poll_floor_s <= poll_ceiling_s and backoff >= 1")
        self.poll_floor_s = poll_floor_s
        self.poll_ceiling_s = poll_ceiling_s
        self.backoff = backoff
        self.timeout = timeout
        self.cancel_timeout = cancel_timeout
        self.listen = listen
        self._followers: weakref.WeakKeyDictionary[ClientSession, Follower] = weakref.WeakKeyDictionary()
        self._capture: contextvars.ContextVar[list[TaskHandle] | None] = contextvars.ContextVar(
            "celery_mcp_tasks_capture", default=None
        )

    # -- the SDK's extension surface --------------------------------------------------

    def claims(self) -> Sequence[ResultClaim[Any]]:
        return [
            ResultClaim(
                result_type="task",
                model=CreateTaskResult,
                resolve=self._resolve,
                protocol_versions=TASKS_VERSIONS,
            )
        ]

    def notifications(self) -> Sequence[NotificationBinding[Any]]:
        return [
            NotificationBinding(
                method="notifications/tasks", params_type=_TasksNotificationParams, handler=self._on_notification
            )
        ]

    async def _on_notification(self, params: _TasksNotificationParams) -> None:
        try:
            state = TaskState.model_validate(params.model_dump(by_alias=True), by_name=False)
        except ValidationError:
            logger.warning("ignored a malformed notifications/tasks")
            return
        for follower in list(self._followers.values()):
            follower.offer(state)

    async def _resolve(self, created: CreateTaskResult, ctx: ClaimContext) -> CallToolResult:
        handle = self._handle(ctx.session, created.state(), ctx.tool_name)
        capture = self._capture.get()
        if capture is not None:  # start(): the caller wants the handle, not the wait
            capture.append(handle)
            return CallToolResult(content=[TextContent(type="text", text="(task started)")], is_error=True)
        per_call = ctx.read_timeout_seconds  # `call_tool(..., read_timeout_seconds=)`: this call's own bound
        limit = min((bound for bound in (self.timeout, per_call) if bound is not None), default=None)
        scope: anyio.CancelScope | None = None
        try:
            with anyio.fail_after(limit) as scope:
                return await handle.result()
        except BaseException:
            if not handle.finished:
                await handle._cancel_on_the_way_out()
            if scope is not None and scope.cancelled_caught and limit == per_call:  # as the SDK says it without us
                raise MCPError(code=REQUEST_TIMEOUT, message="Request 'tools/call' timed out") from None
            raise
        finally:
            handle.close()

    # -- the explicit API -------------------------------------------------------------

    async def start(
        self,
        client: Client | ClientSession,
        name: str,
        arguments: dict[str, Any] | None = None,
        *,
        meta: Mapping[str, Any] | None = None,
        progress_callback: ProgressFnT | None = None,
    ) -> TaskHandle:
        """Call `name` and return its task's handle without waiting.

        A tool that answers at once (a plain tool, or a server that chose not to
        make a task) gives a handle that is already finished: `id` is None and
        `result()` returns that answer. Such a call returns only once the tool
        answered; `progress_callback` (the SDK's) hears its progress meanwhile. A
        task reports progress through its states instead.
        """
        from mcp.client.client import Client

        request_meta = cast(RequestParamsMeta, dict(meta)) if meta else None
        captured: list[TaskHandle] = []
        token = self._capture.set(captured)
        try:
            if isinstance(client, Client):
                result: Any = await client.call_tool(
                    name, arguments, meta=request_meta, progress_callback=progress_callback
                )
            else:
                result = await client.call_tool(
                    name, arguments, meta=request_meta, progress_callback=progress_callback, allow_claimed=True
                )
                if isinstance(result, CreateTaskResult):
                    return self._handle(client, result.state(), name)
        finally:
            self._capture.reset(token)
        if captured:
            return captured[0]
        if not isinstance(result, CallToolResult):
            raise MCPError(INVALID_REQUEST, f"tools/call returned an unexpected result: {type(result).__name__}")
        return TaskHandle(self, _session(client), None, name, immediate=result)

    async def attach(self, client: Client | ClientSession, task_id: str) -> TaskHandle:
        """A handle for a task created earlier (by this process or another); reads it once."""
        session = _session(client)
        return self._handle(session, await calls.get_task(session, task_id), None)

    async def stop_following(self, client: Client | ClientSession) -> None:
        """Stop following this connection's tasks and wait until that is done; call it before the
        `Client` closes while handles are still open (the tasks go on; `attach` again later).

        The listen stream is ended and no read is left in flight, so closing the connection
        cannot catch one of them half-way. An open handle's `result()` then raises `MCPError`.
        """
        follower = self._followers.get(_session(client))
        if follower is not None:
            await follower.stop()

    # -- internals --------------------------------------------------------------------

    def _handle(self, session: ClientSession, state: TaskState, tool: str | None) -> TaskHandle:
        follower = self._followers.get(session)
        if follower is None:
            follower = self._followers[session] = Follower(self, session)
        return TaskHandle(self, session, follower.track(state), tool)


def _session(client: Client | ClientSession) -> ClientSession:
    from mcp.client.client import Client

    return client.session if isinstance(client, Client) else client
