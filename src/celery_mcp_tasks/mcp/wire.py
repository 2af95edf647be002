"""Wire helpers for the tasks methods: errors with the right codes, the
`Mcp-Name` routing-header rule the SDK does not know for `tasks/*`, and what the
synchronous path needs of the calling request (its input capabilities, its
back-channel, whether its HTTP caller is still there)."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

import anyio
from mcp.server.context import ServerRequestContext
from mcp.shared.exceptions import MCPError
from mcp.shared.inbound import decode_header_value
from mcp.shared.message import ServerMessageMetadata
from mcp_types import (
    HEADER_MISMATCH,
    INTERNAL_ERROR,
    INVALID_PARAMS,
    MISSING_REQUIRED_CLIENT_CAPABILITY,
    CreateMessageResult,
    CreateMessageResultWithTools,
    ElicitResult,
    InputRequest,
    InputRequiredResult,
    ListRootsResult,
    RequestParams,
    Result,
)
from pydantic import Field, TypeAdapter

from celery_mcp_tasks.protocol import EXTENSION_ID
from celery_mcp_tasks.store.base import StoreUnavailable

logger = logging.getLogger("celery_mcp_tasks.mcp")

T = TypeVar("T")

TASKS_VERSIONS = frozenset({"2026-07-28"})
"""Protocol versions on which a task can be returned: the extension is defined for these only."""
NOT_FOUND = "Failed to retrieve task: Task not found"
EXPIRED = "Failed to retrieve task: Task has expired"


class TaskIdParams(RequestParams):
    task_id: str = Field(alias="taskId")


class UpdateParams(TaskIdParams):
    # Any JSON here: a non-object must be answered with our -32602, not a generic one.
    input_responses: Any = Field(default=None, alias="inputResponses")


def declared_extension(ctx: ServerRequestContext[Any, Any]) -> bool:
    """The request may be answered with a task: a 2026-07-28 request that declared the extension.

    An earlier-era session (2025-06-18, 2025-11-25) can name the extension in its
    `initialize` capabilities, but its `tools/call` result schema has no task
    shape (the SDK rejects a `CreateTaskResult` there): the era decides.
    """
    if ctx.protocol_version not in TASKS_VERSIONS:
        return False
    capabilities = ctx.session.client_capabilities
    extensions = capabilities.extensions if capabilities else None
    return extensions is not None and EXTENSION_ID in extensions


def declared_capability(ctx: ServerRequestContext[Any, Any], name: str) -> bool:
    capabilities = ctx.session.client_capabilities
    return capabilities is not None and getattr(capabilities, name, None) is not None


INPUT_CAPABILITIES = {"elicitation/create": "elicitation", "sampling/createMessage": "sampling", "roots/list": "roots"}
"""The client capability each kind of input request needs (the Tasks extension's three)."""
_INPUT_REQUEST: TypeAdapter[InputRequest] = TypeAdapter(InputRequest)
_CALLER_CHECK_S = 0.5


def can_answer(ctx: ServerRequestContext[Any, Any], requests: Mapping[str, Any]) -> bool:
    """The client declared the capability for every one of `requests` (wire shapes, by key)."""
    methods = [request.get("method") if isinstance(request, Mapping) else None for request in requests.values()]
    return bool(methods) and all(
        method in INPUT_CAPABILITIES and declared_capability(ctx, INPUT_CAPABILITIES[method]) for method in methods
    )


def input_required(requests: Mapping[str, Any], request_state: str) -> InputRequiredResult:
    """An MRTR round (2026-07-28) asking `requests`; the SDK's `RequestStateBoundary` seals the state."""
    return InputRequiredResult(
        input_requests={
            key: _INPUT_REQUEST.validate_python(request, by_alias=True, by_name=False)
            for key, request in requests.items()
        },
        request_state=request_state,
    )


async def ask_client(ctx: ServerRequestContext[Any, Any], request: Mapping[str, Any]) -> dict[str, Any]:
    """Ask one input request (a wire shape) on the calling request's own stream (earlier eras).

    Returns the client's answer as `tasks/update` would carry it. Raises `MCPError`
    (the client answered with an error) or `ValidationError` (a malformed request or answer).
    """
    typed = _INPUT_REQUEST.validate_python(request, by_alias=True, by_name=False)
    params = request.get("params") or {}
    result_type: type[Result] = ElicitResult
    if typed.method == "roots/list":
        result_type = ListRootsResult
    elif typed.method == "sampling/createMessage":
        with_tools = "tools" in params or "toolChoice" in params
        result_type = CreateMessageResultWithTools if with_tools else CreateMessageResult
    answer = await ctx.session.send_request(
        typed, result_type, metadata=ServerMessageMetadata(related_request_id=ctx.request_id)
    )
    return answer.model_dump(by_alias=True, mode="json", exclude_none=True)


class CallProgress:
    """`notifications/progress` for the calling request (a no-op without a progressToken), strictly increasing.

    The job's own numbers when it reports them, else a count of the changes seen
    from 0 (the runtime's own "Started" is the first), so a job that reports from 1
    keeps its numbers; a number that does not exceed the last one sent is skipped.
    """

    def __init__(self, ctx: ServerRequestContext[Any, Any]) -> None:
        self._session = ctx.session
        self._last: float | None = None

    async def report(self, current: float | None, total: float | None, message: str | None) -> None:
        value = current if current is not None else 0 if self._last is None else self._last + 1
        if self._last is not None and value <= self._last:
            return  # a message without a step forward: progress must never repeat or go back
        self._last = value
        try:
            await self._session.report_progress(value, total if current is not None else None, message)
        except Exception as exc:  # noqa: BLE001 - progress is best effort; the answer still goes out
            logger.debug("could not send progress for a synchronous call: %s", type(exc).__name__)


async def unless_caller_leaves(
    ctx: ServerRequestContext[Any, Any], fn: Callable[[], Awaitable[T]]
) -> tuple[T | None, bool]:
    """Run `fn`: `(its result, False)`, or `(None, True)` once the HTTP caller disconnected (`fn` is then cancelled).

    Needed on the earlier eras' Streamable HTTP, where a closed response stream does
    not cancel the handler (the session outlives the POST). Without an HTTP request
    (stdio, in-process) `fn` simply runs.
    """
    disconnected: Callable[[], Awaitable[bool]] | None = getattr(ctx.request, "is_disconnected", None)
    if disconnected is None:
        return await fn(), False
    results: list[T] = []
    failures: list[Exception] = []
    gone = False
    async with anyio.create_task_group() as tg:

        async def body() -> None:
            try:
                results.append(await fn())
            except Exception as exc:  # noqa: BLE001 - re-raised below, outside the task group (no ExceptionGroup)
                failures.append(exc)
            finally:
                tg.cancel_scope.cancel()

        tg.start_soon(body)
        while not await disconnected():  # noqa: ASYNC110 - a Request offers no disconnect event, only this check
            await anyio.sleep(_CALLER_CHECK_S)
        gone = True
        tg.cancel_scope.cancel()
    if failures:
        raise failures[0]
    if results:
        return results[0], False
    return None, gone


def missing_capability(required: dict[str, Any], what: str) -> MCPError:
    return MCPError(
        code=MISSING_REQUIRED_CLIENT_CAPABILITY,
        message=f"Missing required client capability: {what}",
        data={"requiredCapabilities": required},
    )


def require_extension(ctx: ServerRequestContext[Any, Any]) -> None:
    if not declared_extension(ctx):
        raise missing_capability({"extensions": {EXTENSION_ID: {}}}, EXTENSION_ID)


def require_routing_name(ctx: ServerRequestContext[Any, Any], task_id: str) -> None:
    """`Mcp-Name` must be present and equal `params.taskId` on HTTP (-32020 otherwise)."""
    request = ctx.request
    headers = getattr(request, "headers", None)
    if headers is None:
        return  # not HTTP (in-process or stdio): there are no routing headers to check
    raw = headers.get("mcp-name")
    if raw is None:
        raise MCPError(code=HEADER_MISMATCH, message="Missing Mcp-Name header; it must equal params.taskId")
    if decode_header_value(raw.strip(" \t")) != task_id:
        raise MCPError(code=HEADER_MISMATCH, message="Mcp-Name header does not match params.taskId")


def not_found(expired: bool = False) -> MCPError:
    return MCPError(code=INVALID_PARAMS, message=EXPIRED if expired else NOT_FOUND)


def invalid_params(message: str) -> MCPError:
    return MCPError(code=INVALID_PARAMS, message=message)


def internal(message: str) -> MCPError:
    return MCPError(code=INTERNAL_ERROR, message=message)


def store_unavailable(method: str, exc: StoreUnavailable) -> MCPError:
    """-32603 with a fixed message, and one log line naming the method and the store operation.

    Never the database's text on the wire (it quotes SQL), and never the SDK's own
    fallback for an unexpected exception, which on earlier-era sessions sends `str(exc)`.
    """
    cause = exc.__cause__
    logger.error(
        "%s: the task store is unavailable (%s failed: %s)",
        method,
        exc.operation or "store",
        type(cause).__name__ if cause is not None else "unknown",
    )
    return MCPError(code=INTERNAL_ERROR, message=StoreUnavailable.MESSAGE)
