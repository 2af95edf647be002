"""A lean HTTP entry for `subscriptions/listen` (2026-07-28): the SDK's wire, a third of its memory.

Through the SDK's single-exchange entry an open listen stream held ~54 KB
(measured with tracemalloc, 1 000 -> 2 000 streams): three asyncio tasks, an
anyio task group, a rendezvous memory stream, a `Connection` with its exit
stack, a `ServerRunner`, an OpenTelemetry span, the decoded body, ~34
coroutine frames; ~36 KB of it the SDK's. Here the stream runs in the ASGI
task itself, with one watcher task for the client's disconnect and the SSE
keep-alive ping, and writes its events straight to the ASGI `send`.

Only a request that passes every check the SDK makes before it runs a handler
takes this path; anything else goes to the SDK's entry unchanged (the body
replayed), so every rejection keeps the SDK's status code and error. A handler
error before the stream opens is answered as the SDK answers it (JSON, the
SDK's HTTP status for the code); after, as the stream's last event. Installed by `McpTasks.asgi_app`
through `sdk_internals.wrap_modern_entry`; `MCP_TASKS_LISTEN_ENTRY=sdk` turns it off.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, Final, cast

import anyio
from mcp.server.transport_security import TransportSecurityMiddleware, TransportSecuritySettings
from mcp_types import (
    ClientCapabilities,
    JSONRPCError,
    JSONRPCNotification,
    JSONRPCRequest,
    JSONRPCResponse,
    SubscriptionsListenRequestParams,
)
from pydantic import BaseModel, ValidationError
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from celery_mcp_tasks.mcp import sdk_internals
from celery_mcp_tasks.mcp.listen import TaskListenHandler

__all__ = ["ListenEntry"]

logger = logging.getLogger("celery_mcp_tasks.mcp")

LISTEN: Final = "subscriptions/listen"
PING_INTERVAL_S: Final = 15.0  # the SDK's `_SSE_PING_INTERVAL`
MAX_BODY: Final = 256 * 1024  # a larger listen body takes the SDK's path (it owns the limit)
_PING: Final = b": ping\r\n\r\n"
_SSE_HEADERS: Final = [
    (b"content-type", b"text/event-stream"),
    (b"cache-control", b"no-cache, no-transform"),
    (b"connection", b"keep-alive"),
    (b"x-accel-buffering", b"no"),
]


def _event(message: BaseModel) -> bytes:
    """One SSE `event: message` frame, serialised as the SDK's entry does."""
    body = message.model_dump(mode="json", by_alias=True, exclude_none=True)
    return f"event: message\r\ndata: {json.dumps(body, separators=(',', ':'))}\r\n\r\n".encode()


class _Exchange:
    """One open listen response; it is also the `ctx` the handler reads (request id, version, capabilities)."""

    __slots__ = (
        "_on_commit",
        "_send",
        "client_capabilities",
        "committed",
        "gone",
        "last_write",
        "protocol_version",
        "request_id",
    )

    def __init__(
        self,
        send: Send,
        request_id: Any,
        version: str,
        capabilities: ClientCapabilities | None,
        on_commit: Callable[[], None],
    ) -> None:
        self._send = send
        self._on_commit = on_commit
        self.request_id = request_id
        self.protocol_version = version
        self.client_capabilities = capabilities
        self.committed = False
        self.gone = False
        self.last_write = time.monotonic()

    @property
    def session(self) -> _Exchange:
        return self  # the handler calls `ctx.session.send_notification` and reads `ctx.session.client_capabilities`

    async def send_notification(self, notification: BaseModel, related_request_id: Any = None) -> None:
        data = notification.model_dump(by_alias=True, mode="json", exclude_none=True)
        await self.write(_event(JSONRPCNotification(jsonrpc="2.0", method=data["method"], params=data.get("params"))))

    async def write(self, body: bytes, more: bool = True) -> None:
        if self.gone:
            return
        if not self.committed:
            self.committed = True  # set before the await: a concurrent ping must not start a second response
            self.client_capabilities = None  # read by the handler before its ack only: not kept for the stream's life
            self._on_commit()  # nor the request kept for a replay to the SDK
            await self._send({"type": "http.response.start", "status": 200, "headers": _SSE_HEADERS})
        self.last_write = time.monotonic()
        await self._send({"type": "http.response.body", "body": body, "more_body": more})

    async def watch(self, receive: Receive, scope: anyio.CancelScope) -> None:
        """Until the client goes: ping after `PING_INTERVAL_S` of silence (committing the stream, as the SDK does)."""
        while True:
            with anyio.move_on_after(max(0.0, self.last_write + PING_INTERVAL_S - time.monotonic())):
                if (await receive())["type"] == "http.disconnect":
                    self.gone = True
                    scope.cancel()
                    return
                continue
            if time.monotonic() - self.last_write >= PING_INTERVAL_S:
                await self.write(_PING)


class ListenEntry:
    """ASGI wrapper around the SDK's HTTP entry: serves a valid 2026-07-28 listen itself, passes the rest on."""

    def __init__(
        self, app: ASGIApp, server: Any, handler: TaskListenHandler, security: TransportSecuritySettings | None
    ) -> None:
        self._app = app
        self._server = server
        self._handler = handler
        self._security = TransportSecurityMiddleware(security)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not _maybe_listen(scope):
            await self._app(scope, receive, send)
            return
        read, body = await _read_body(receive)
        pending = list(read)

        async def replay() -> Message:
            return pending.pop(0) if pending else await receive()

        def forget() -> None:
            read.clear()
            pending.clear()

        opened = await self._check(scope, replay, body)
        del body  # a fallback replays `read`
        if opened is None:
            await self._app(scope, replay, send)  # the SDK answers (and rejects) it, as it would have
            return
        request_id, params, version, capabilities = opened
        exchange = _Exchange(send, request_id, version, capabilities, forget)
        del opened, capabilities  # the exchange drops the capabilities once the stream is open
        await self._serve(exchange, params, scope, receive, send)

    async def _check(
        self, scope: Scope, replay: Callable[[], Awaitable[Message]], body: bytes | None
    ) -> tuple[Any, SubscriptionsListenRequestParams, str, ClientCapabilities | None] | None:
        """The SDK's checks, in its order; None on the first that fails (the SDK then answers)."""
        if body is None or not sdk_internals.plain_server_middleware(self._server):
            return None
        request = Request(scope, replay)
        if await self._security.validate_request(request, is_post=True) is not None:
            return None
        has_json, has_sse = sdk_internals.accepts(request)
        if not (has_json and has_sse):
            return None
        try:
            decoded = json.loads(body)
            req = JSONRPCRequest.model_validate(decoded)
        except (ValueError, RecursionError, ValidationError):
            return None
        if req.method != LISTEN or not isinstance(decoded, dict) or "id" not in decoded:
            return None
        verdict = sdk_internals.modern_route(decoded, request)
        if verdict is None:
            return None
        try:
            sdk_internals.validate_listen(verdict.protocol_version, req.params)
            params = SubscriptionsListenRequestParams.model_validate(req.params or {}, by_name=False)
        except (ValidationError, KeyError):
            return None
        try:
            capabilities = ClientCapabilities.model_validate(verdict.client_capabilities, by_name=False)
        except ValidationError:
            capabilities = None
        # Only what the handler reads (the filter): the body, the envelope and its models are not kept.
        slim = SubscriptionsListenRequestParams.model_construct(notifications=params.notifications)
        return req.id, slim, verdict.protocol_version, capabilities

    async def _serve(
        self,
        exchange: _Exchange,
        params: SubscriptionsListenRequestParams,
        scope: Scope,
        receive: Receive,
        send: Send,
    ) -> None:
        """Run the stream to its end; a failure before it opened answers JSON with the SDK's status for the code."""
        request_id, version = exchange.request_id, exchange.protocol_version
        final: JSONRPCResponse | JSONRPCError | None = None
        early = False
        async with anyio.create_task_group() as tg:
            tg.start_soon(exchange.watch, receive, tg.cancel_scope)
            try:
                result = await self._handler(cast(Any, exchange), params)
                # shaped inside the try, as the SDK's runner does: a result it cannot shape is an error reply
                shaped = sdk_internals.listen_result(self._server, version, None, result)
            except Exception as exc:  # noqa: BLE001 - mapped to the wire exactly as the SDK maps it
                final = JSONRPCError(jsonrpc="2.0", id=request_id, error=sdk_internals.error_data(exc))
                if not exchange.committed:
                    exchange.gone = True  # nothing went out yet: answered as JSON below, never pinged into
                    early = True
            else:
                final = JSONRPCResponse(jsonrpc="2.0", id=request_id, result=shaped)
            tg.cancel_scope.cancel()
        if early and isinstance(final, JSONRPCError):
            await sdk_internals.write_json(final, scope, receive, send)
        elif final is not None and not exchange.gone:
            await exchange.write(_event(final), more=False)


def _maybe_listen(scope: Scope) -> bool:
    """A POST routed as `subscriptions/listen` at a modern version (headers only; the body decides the rest)."""
    if scope["type"] != "http" or scope["method"] != "POST":
        return False
    method = version = None
    for name, value in scope["headers"]:
        if name == b"mcp-method":
            method = value
        elif name == b"mcp-protocol-version":
            version = value
    return method == LISTEN.encode() and version is not None and sdk_internals.modern_version(version.decode("latin-1"))


async def _read_body(receive: Receive) -> tuple[list[Message], bytes | None]:
    """The request's messages (kept for a replay) and its body; None when it is too large or incomplete."""
    messages: list[Message] = []
    body = bytearray()
    while True:
        message = await receive()
        messages.append(message)
        if message["type"] != "http.request":
            return messages, None
        body.extend(message.get("body", b""))
        if len(body) > MAX_BODY:
            return messages, None
        if not message.get("more_body", False):
            return messages, bytes(body)
