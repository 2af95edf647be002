"""Every place this package reaches past the SDK's public API, in one module (pinned: mcp 2.3.x).

Each function names the private thing it uses and the public hook that would
remove the need; `tests/mcp/test_sdk_internals.py` fails with the SDK version
in its message as soon as one of them moves.

1. `tool_registered`: `MCPServer._tool_manager`. There is no synchronous public
   lookup (`list_tools()` is async); a public `MCPServer.get_tool(name)` or a
   strict-duplicates option on `add_tool` would remove it.
2. `replace_listen_handler`: `MCPServer._lowlevel_server`, to swap the stock
   `subscriptions/listen` handler for ours (it drops the Tasks extension's
   `taskIds`). A public `MCPServer(listen_handler=...)`, or letting an
   `Extension` claim a core method, would remove it.
3. `wrap_lifespan`: reassigns the Starlette app's `router.lifespan_context` that
   `streamable_http_app()` built, to run our listener beside the SDK's session
   manager. A `lifespan=` parameter on `streamable_http_app()` would remove it.
4. `on_server_exit`: chains onto the SIGTERM/SIGINT handler the ASGI server
   (uvicorn) installed, because an open listen stream keeps uvicorn from ever
   running the lifespan's shutdown. A shutdown hook in the SDK's session manager
   that ends open SSE streams would remove it.
"""

from __future__ import annotations

import asyncio
import signal
import threading
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from types import FrameType
from typing import Any

from mcp.server.mcpserver import MCPServer

__all__ = [
    "accepts",
    "error_data",
    "listen_result",
    "modern_route",
    "modern_version",
    "on_server_exit",
    "plain_server_middleware",
    "replace_listen_handler",
    "tool_registered",
    "validate_listen",
    "wrap_lifespan",
    "wrap_modern_entry",
    "write_json",
]

LISTEN = "subscriptions/listen"
_EXIT_SIGNALS = (signal.SIGTERM, signal.SIGINT)

Lifespan = Callable[[Any], AbstractAsyncContextManager[Any]]


def tool_registered(server: MCPServer[Any], name: str) -> bool:
    """Whether `server` already has a tool called `name` (any kind)."""
    return server._tool_manager.get_tool(name) is not None


def replace_listen_handler(server: MCPServer[Any], params_type: type, handler: Any) -> bool:
    """Serve `subscriptions/listen` with `handler`; False when the server does not serve listen at all."""
    lowlevel = server._lowlevel_server
    if lowlevel.get_request_handler(LISTEN) is None:
        return False  # built with subscriptions=False: leave listen unserved
    lowlevel.add_request_handler(LISTEN, params_type, handler)
    return True


def wrap_lifespan(app: Any, wrap: Callable[[Lifespan], Lifespan]) -> None:
    """Replace the Starlette app's lifespan with `wrap(current lifespan)`."""
    app.router.lifespan_context = wrap(app.router.lifespan_context)


def on_server_exit(callback: Callable[[], None]) -> Callable[[], None]:
    """Run `callback` on the loop when the server is told to exit; returns the undo.

    Chains onto a handler the server installed (uvicorn's `handle_exit`), and
    only from the main thread, where signal handlers live; otherwise a no-op.
    """
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return lambda: None
    previous: dict[int, Callable[[int, FrameType | None], Any]] = {}

    def handler(signum: int, frame: FrameType | None) -> None:
        loop.call_soon_threadsafe(callback)  # never touch the loop's state from inside a signal handler
        prior = previous.get(signum)
        if prior is not None:
            prior(signum, frame)

    for sig in _EXIT_SIGNALS:
        prior = signal.getsignal(sig)
        if callable(prior):
            previous[sig] = prior
            signal.signal(sig, handler)

    def restore() -> None:
        for sig, prior in previous.items():
            if signal.getsignal(sig) is handler:
                signal.signal(sig, prior)

    return restore


# -- the lean listen entry (mcp/listen_entry.py) ------------------------------------------
# 5. `wrap_modern_entry`: wraps `StreamableHTTPSessionManager.asgi_app.app` (the
#    manager's `_handle_request`, inside its body limit and behind the route's
#    auth) so a listen request can be served without the per-request machinery of
#    `handle_modern_request`. The checks it must repeat use the SDK's own
#    functions: `mcp.shared.inbound` (the ladder), `check_accept_headers`,
#    `mcp_types.methods.validate_client_request`, `runner.modern_error_data` and
#    `ServerRunner._serialize` (the result's envelope). A leaner single-exchange
#    SSE path in the SDK (no sibling handler task, no memory stream, lazy events)
#    would remove the need.


def wrap_modern_entry(server: MCPServer[Any], wrap: Callable[[Any, Any], Any]) -> bool:
    """Wrap the HTTP entry of `server`'s session manager (after `streamable_http_app()`); False when absent."""
    manager = getattr(server._lowlevel_server, "_session_manager", None)
    limiter = getattr(manager, "asgi_app", None)
    if manager is None or limiter is None or not hasattr(limiter, "app"):
        return False
    limiter.app = wrap(limiter.app, manager.security_settings)
    return True


def plain_server_middleware(server: MCPServer[Any]) -> bool:
    """Only the SDK's own server middleware, which lets a listen request through untouched (bar its span)."""
    from mcp.server._otel import OpenTelemetryMiddleware
    from mcp.server.request_state import RequestStateBoundary

    return all(
        isinstance(m, OpenTelemetryMiddleware | RequestStateBoundary) for m in server._lowlevel_server.middleware
    )


def modern_version(version: str) -> bool:
    from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS

    return version not in HANDSHAKE_PROTOCOL_VERSIONS


def accepts(request: Any) -> tuple[bool, bool]:
    from mcp.server.streamable_http import check_accept_headers

    return check_accept_headers(request)


def modern_route(decoded: dict[str, Any], request: Any) -> Any | None:
    """The SDK's modern ladder (duplicated routing headers, envelope, header/body agreement, version)."""
    from mcp.shared.inbound import InboundModernRoute, classify_inbound_request, find_duplicated_routing_header

    if find_duplicated_routing_header(request.headers.items()) is not None:
        return None
    verdict = classify_inbound_request(decoded, headers=dict(request.headers))
    return verdict if isinstance(verdict, InboundModernRoute) else None


def validate_listen(version: str, params: Any) -> None:
    """The kernel's per-version surface validation of the listen params (raises as the SDK's would)."""
    from mcp_types import methods

    methods.validate_client_request(LISTEN, version, params)


def error_data(exc: Exception) -> Any:
    from mcp.server.runner import modern_error_data

    return modern_error_data(exc)


def listen_result(server: MCPServer[Any], version: str, capabilities: Any, result: Any) -> dict[str, Any]:
    """The listen result as the SDK's runner shapes it for the wire (cache hints, surface, `serverInfo` stamp)."""
    from mcp.server.connection import Connection
    from mcp.server.runner import ServerRunner

    lowlevel = server._lowlevel_server
    runner = ServerRunner(lowlevel, Connection.from_envelope(version, None, capabilities), None)
    return runner._serialize(LISTEN, version, result)


async def write_json(message: Any, scope: Any, receive: Any, send: Any) -> None:
    """A JSON-RPC error as the SDK's entry writes it before a stream opens (its HTTP status for the code)."""
    import json

    from mcp.shared.inbound import ERROR_CODE_HTTP_STATUS
    from starlette.responses import Response

    status = ERROR_CODE_HTTP_STATUS.get(message.error.code, 200)
    body = json.dumps(message.model_dump(mode="json", by_alias=True, exclude_none=True), separators=(",", ":"))
    await Response(body, status_code=status, media_type="application/json")(scope, receive, send)
