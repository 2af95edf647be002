"""Every place this package reaches past the SDK's public API, in one module (pinned: mcp 2.3.x).

Each names the private thing it uses and the public hook that would remove the need;
`tests/mcp/test_sdk_internals.py` fails, naming the SDK version, as soon as one of them moves.

1. `tool_registered`: `MCPServer._tool_manager` (`list_tools()` is async). A public
   `MCPServer.get_tool(name)` or a strict-duplicates option on `add_tool` would remove it.
2. `replace_listen_handler`: `MCPServer._lowlevel_server`, to swap the stock `subscriptions/listen`
   handler (it drops `taskIds`) for ours. A public `MCPServer(listen_handler=...)`, or an `Extension`
   allowed to claim a core method, would remove it.
3. `wrap_lifespan`: reassigns the `router.lifespan_context` that `streamable_http_app()` built, to run
   our listener beside the SDK's session manager. A `lifespan=` parameter there would remove it.
4. `on_server_exit`: chains onto the SIGTERM/SIGINT handler uvicorn installed, since an open listen
   stream keeps it from ever running the lifespan's shutdown. A shutdown hook in the SDK's session
   manager that ends open SSE streams would remove it.
5. `sealed_elsewhere`: the message ("unknown key") of the SDK's `InvalidRequestState` for a state sealed
   under a key this codec does not hold, to tell another replica's state from a forged or expired one.
   A distinct exception type (or a `reason` attribute) would remove it.
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

LISTEN = "subscriptions/listen"

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


def sealed_elsewhere(error: Exception) -> bool:
    """Whether the SDK's codec refused a request state because another key sealed it."""
    return str(error) == "unknown key"


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

    for sig in (signal.SIGTERM, signal.SIGINT):
        prior = signal.getsignal(sig)
        if callable(prior):
            previous[sig] = prior
            signal.signal(sig, handler)

    def restore() -> None:
        for sig, prior in previous.items():
            if signal.getsignal(sig) is handler:
                signal.signal(sig, prior)

    return restore
