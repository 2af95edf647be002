"""Serving the MCP app: its lifespan (push, the listen handler, plugins) and its answers to requests refused
before the SDK reads them (a body over the limit, a malformed `Mcp-Name`).

An ASGI server runs the lifespan's shutdown only once every connection drained, which an open listen
stream never does: so the streams end when the server *receives* SIGTERM or SIGINT
(`uvicorn_internals.on_server_exit`), each sending its listen result, and the server exits at once.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from typing import Any

import anyio
import anyio.to_thread
from mcp.server.mcpserver import MCPServer
from mcp.server.request_state import RequestStateBoundary
from mcp.server.subscriptions import InMemorySubscriptionBus, SubscriptionBus
from mcp_types import HEADER_MISMATCH, INTERNAL_ERROR, INVALID_REQUEST, SubscriptionsListenRequestParams
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from celery_mcp_tasks.mcp.listen import TaskListenHandler
from celery_mcp_tasks.mcp.principal import VerifierFailed
from celery_mcp_tasks.notify.hub import Hub
from celery_mcp_tasks.notify.push import Push
from celery_mcp_tasks.sdk_internals import Lifespan, decode_routing_name, replace_listen_handler, wrap_lifespan
from celery_mcp_tasks.service import TaskService
from celery_mcp_tasks.uvicorn_internals import on_server_exit

logger = logging.getLogger(__name__)

STOPPED = "The server stopped before the job finished"
"""The status message of a synchronous call's hidden task cancelled because its server is exiting."""
_ABANDON_S = 5.0  # how long an exiting server waits for those cancels (a hung store is left to the reaper)
DRAIN_S = 2.0
"""How long a synchronous call may still finish after the server is told to stop, before its hidden task is
cancelled and its caller answered: within `serve`'s (5 s) and `dev`'s (3 s) graceful shutdown."""


@asynccontextmanager
async def serving(
    push: Push,
    listen: TaskListenHandler | None,
    service: Callable[[], TaskService],
    contexts: Sequence[Callable[[], AbstractAsyncContextManager[Any]]],
    *,
    abandon: Callable[[str], object] | None = None,
    exit_signals: bool = True,
) -> AsyncIterator[None]:
    """The served app's whole life, over HTTP (its lifespan) or stdio: the service (push binds to it), the
    hint listener, then `contexts` (the plugins'). The streams end with it, or with `exit_signals` as
    soon as the ASGI server is told to exit; a synchronous call still running `DRAIN_S` later is abandoned
    (`abandon`: its hidden task cancelled), so its caller gets an answer before the server's graceful
    timeout cuts it off, and its job stops instead of running on for nobody."""
    service()
    async with push.serving():
        if listen is not None:
            listen.reopen()
        drain: list[threading.Timer] = []

        def exiting() -> None:
            if listen is not None:
                listen.close()
            if abandon is not None and not drain:  # store writes, later: not on the loop
                drain.append(threading.Timer(DRAIN_S, abandon, (STOPPED,)))
                drain[0].daemon = True
                drain[0].start()

        restore = on_server_exit(exiting) if exit_signals else (lambda: None)
        try:
            async with AsyncExitStack() as stack:
                for context in contexts:
                    await stack.enter_async_context(context())
                yield
        finally:
            restore()
            for timer in drain:
                timer.cancel()  # every call has ended, or the abandon below takes what is left
            if listen is not None:
                listen.close()
            if abandon is not None:  # calls left (an exit without a signal, a call the server cancelled)
                with anyio.CancelScope(shield=True), anyio.move_on_after(_ABANDON_S):
                    await anyio.to_thread.run_sync(abandon, STOPPED, abandon_on_cancel=True)


def with_serving(app: Any, run: Callable[[], AbstractAsyncContextManager[None]], path: str) -> Any:
    """Wrap a Starlette app's lifespan (the SDK's session manager) in `run()` (`serving`): the app's whole
    life, so an application mounting this app runs it as its own lifespan (`McpTasks.lifespan`). `run()` is
    called first: it runs the start-up checks, whose refusal then ends the start-up as one `ConfigError`.
    Until it runs, the MCP endpoint (`path`) answers `NoLifespan`'s 503."""

    running = threading.Event()  # the lifespan runs: the SDK's session manager can take requests

    def wrap(inner: Lifespan) -> Lifespan:
        @asynccontextmanager
        async def lifespan(asgi_app: Any) -> AsyncIterator[Any]:
            serving_app = run()  # the start-up checks refuse here, as themselves: not inside the SDK's task group
            async with inner(asgi_app) as state, serving_app:
                running.set()
                try:
                    yield state
                finally:
                    running.clear()

        return lifespan

    wrap_lifespan(app, wrap)
    app.add_middleware(NoLifespan, running=running, path=path)
    return app


NO_LIFESPAN = (
    "the MCP app is mounted, but the host app does not run its lifespan: pass lifespan=tasks.lifespan to your "
    "Starlette or FastAPI app (a mounted app's own lifespan never runs)"
)


class NoLifespan:
    """ASGI middleware: while the app's lifespan is not running (mounted in a host app not given
    `lifespan=tasks.lifespan`, or an ASGI server run with `--lifespan off`), every request to the MCP endpoint
    (`path`) answered 503 with a JSON-RPC error saying what to pass, logged once, instead of the SDK's 500
    and traceback ("Task group is not initialized"). Its other routes (OAuth metadata) need no lifespan."""

    def __init__(self, app: ASGIApp, running: threading.Event, path: str) -> None:
        self.app = app
        self.running = running
        self.path = path.rstrip("/")
        self.warned = False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self.running.is_set() or not self._endpoint(scope):
            await self.app(scope, receive, send)
            return
        if not self.warned:
            self.warned = True
            logger.error("celery-mcp-tasks: %s", NO_LIFESPAN)
        await _send_json(send, 503, _error_body({"code": INTERNAL_ERROR, "message": NO_LIFESPAN}))

    def _endpoint(self, scope: Scope) -> bool:
        """Whether the request is for the MCP endpoint (its path inside this app: a mount's prefix, in
        `root_path`, is also at the start of `path`)."""
        path, root = str(scope["path"]), str(scope.get("root_path", ""))
        inside = path[len(root) :] if root and path.startswith(root) else path
        return inside.rstrip("/") == self.path


def listen_bus(server_options: dict[str, Any]) -> SubscriptionBus | None:
    """The SDK subscription bus the server will publish core events on (made here so ours can read it);
    a user's `subscriptions=` wins (their bus, or False for no listen at all)."""
    bus = server_options.get("subscriptions")
    if bus is False:
        return None
    if bus is None:
        bus = server_options["subscriptions"] = InMemorySubscriptionBus()
    return bus


def push_hub(push: Push) -> Callable[[], Hub | None]:
    """This process's hub for streams and synchronous calls to watch; None when push is off."""
    return lambda: None if push.mode == "off" else push.hub


def request_state_sealed(server: MCPServer[Any]) -> bool:
    """Whether the SDK's `RequestStateBoundary` seals `requestState` on `server` (`MCPServer` installs
    one by default, under a process-local key unless `request_state_security=` shares one)."""
    return any(isinstance(middleware, RequestStateBoundary) for middleware in server.middleware)


def attach_listen(
    server: MCPServer[Any],
    bus: SubscriptionBus | None,
    service: Callable[[], TaskService],
    push: Push,
    *,
    max_streams_per_caller: int | None = None,
    per_client: bool = False,
) -> TaskListenHandler | None:
    """Our listen handler on `server`, fed by `bus` (core events) and `push.hub` (task hints)."""
    if bus is None:
        return None
    handler = TaskListenHandler(
        bus, service, push_hub(push), max_streams_per_caller=max_streams_per_caller, per_client=per_client
    )
    return handler if replace_listen_handler(server, SubscriptionsListenRequestParams, handler) else None


def _error_body(error: dict[str, Any]) -> bytes:
    """A JSON-RPC error response for a request the SDK never read (`id` null: it was never read)."""
    return json.dumps({"jsonrpc": "2.0", "id": None, "error": error}).encode()


async def _send_json(send: Send, status: int, body: bytes, *extra: tuple[bytes, bytes]) -> None:
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body)), *extra]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class PlainRefusals:
    """ASGI middleware: the SDK's plain-text refusals re-said as JSON-RPC errors naming the setting to change: a
    body over the limit (413), and a `Host` (421) or an `Origin` (403) its DNS-rebinding protection refuses.

    The SDK's own client (so `TasksClient` and `call`) shows a plain-text refusal only as `-32603 Server returned
    an error response`; these are shown as they are. A 403 of another kind (an OAuth scope) goes on untouched.
    """

    HOSTS = "MCP_TASKS_ALLOWED_HOSTS"

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        too_large = (
            f"Request body too large: this server reads at most {limit} bytes "
            f"({limit / 1024 / 1024:.3g} MiB; set by MCP_TASKS_MAX_REQUEST_BYTES)"
        )
        self.too_large = _error_body(
            {"code": INVALID_REQUEST, "message": too_large, "data": {"maxRequestBytes": limit}}
        )
        self.bodies: dict[tuple[int, bytes], bytes] = {  # (status, the SDK's text): what to say instead
            (421, b"Invalid Host header"): _error_body(
                {
                    "code": INVALID_REQUEST,
                    "message": f"This server does not answer for the Host this request names (DNS-rebinding "
                    f"protection): add that host name to {self.HOSTS} on the server",
                }
            ),
            (403, b"Invalid Origin header"): _error_body(
                {
                    "code": INVALID_REQUEST,
                    "message": f"This server does not answer requests from this Origin (DNS-rebinding "
                    f"protection): add its host name to {self.HOSTS} on the server",
                }
            ),
        }
        self.statuses = {status for status, _ in self.bodies}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        held: Message | None = None  # a refusal's start, until its body says which it is
        replaced = False

        async def restate(message: Message) -> None:
            nonlocal held, replaced
            if replaced:  # the plain body's rest
                return
            if message["type"] == "http.response.start" and message["status"] == 413:  # always the body limit
                replaced = True
                await _send_json(send, 413, self.too_large)
                return
            if message["type"] == "http.response.start" and message["status"] in self.statuses:
                held = message
                return
            if held is not None and message["type"] == "http.response.body":
                status, text = held["status"], message.get("body", b"")
                body = self.bodies.get((status, text))
                if body is not None:
                    replaced, held = True, None
                    await _send_json(send, status, body)
                    return
                await send(held)
                held = None
            await send(message)

        await self.app(scope, receive, restate)
        if held is not None:  # a start that no body followed: as it was
            await send(held)


class MalformedRoutingName:
    """ASGI middleware: a request (any method) with an `Mcp-Name` or `Mcp-Param-*` header that makes the SDK's
    decoder raise (a non-ASCII byte inside the base64 form, `sdk_internals.decode_routing_name`) answered 400
    with -32020, as the SDK answers any other malformed routing header, instead of its 500. A request whose
    headers are ASCII, as every valid one's are, goes on untouched."""

    BODY = _error_body({"code": HEADER_MISMATCH, "message": "Malformed Mcp-Name or Mcp-Param-* header"})

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            for name, value in scope["headers"]:
                routing = name == b"mcp-name" or name.startswith(b"mcp-param-")
                if routing and not value.isascii() and decode_routing_name(value.decode("latin-1")) is None:
                    await _send_json(send, 400, self.BODY)
                    return
        await self.app(scope, receive, send)


class VerifierOutage:
    """ASGI middleware, outside the SDK's authentication: a request whose token the application's verifier
    failed to check (`principal.GuardedVerifier`) answered 503, `Retry-After: 5`, with a JSON-RPC error the
    SDK's client shows as it is. Authentication runs before any response starts, so nothing was sent yet."""

    BODY = _error_body(
        {"code": INTERNAL_ERROR, "message": "The server cannot verify access tokens right now; try again shortly"}
    )

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":  # a websocket is refused otherwise
            await self.app(scope, receive, send)
            return
        try:
            await self.app(scope, receive, send)
        except VerifierFailed:
            await _send_json(send, 503, self.BODY, (b"retry-after", b"5"))


def with_request_guards(app: Any, limit: int) -> Any:
    """`app` (the SDK's Starlette app, built with `max_request_body_size=limit`) answering 413 and its
    DNS-rebinding refusals as JSON-RPC, a malformed `Mcp-Name` as -32020, and a token verifier's failure as 503."""
    app.add_middleware(PlainRefusals, limit=limit)
    app.add_middleware(MalformedRoutingName)
    app.add_middleware(VerifierOutage)
    return app
