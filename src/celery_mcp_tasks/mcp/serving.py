"""Push in the web process: the listen handler on the server, the listener in the lifespan.

Two traps shape this module. The SDK's `MCPServer` registers its own
`subscriptions/listen` handler and offers no public way to swap it, so ours
replaces it on the low-level server with the documented
`add_request_handler` (pinned: mcp 2.3.x keeps that server at
`_lowlevel_server`). And an ASGI server runs the lifespan's shutdown only
after every connection has drained, which an open listen stream never does
(CELERY.md §8): so the streams are ended when the server *receives* SIGTERM
or SIGINT, by chaining onto the handler it installed, and each stream then
sends its listen result and closes, letting the server exit at once.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from types import FrameType
from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp.server.subscriptions import InMemorySubscriptionBus, SubscriptionBus
from mcp_types import SubscriptionsListenRequestParams

from celery_mcp_tasks.mcp.listen import TaskListenHandler
from celery_mcp_tasks.notify.push import Push
from celery_mcp_tasks.service import TaskService

__all__ = ["attach_listen", "install_listen", "listen_bus", "on_server_exit", "with_push"]

logger = logging.getLogger("celery_mcp_tasks.mcp")

LISTEN = "subscriptions/listen"
_EXIT_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def install_listen(server: MCPServer[Any], handler: TaskListenHandler) -> bool:
    """Serve `subscriptions/listen` with `handler`; False when the server does not serve listen at all."""
    lowlevel = server._lowlevel_server  # pinned: mcp 2.3.x
    if lowlevel.get_request_handler(LISTEN) is None:
        return False  # built with subscriptions=False: leave listen unserved
    lowlevel.add_request_handler(LISTEN, SubscriptionsListenRequestParams, handler)
    return True


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


def with_push(app: Any, push: Push, listen: TaskListenHandler | None) -> Any:
    """Wrap a Starlette app's lifespan: run the hint listener, end listen streams on exit."""
    inner = app.router.lifespan_context

    @asynccontextmanager
    async def lifespan(asgi_app: Any) -> AsyncIterator[Any]:
        async with inner(asgi_app) as state, push.serving():
            if listen is not None:
                listen.reopen()
            restore = on_server_exit(listen.close) if listen is not None else (lambda: None)
            try:
                yield state
            finally:
                restore()
                if listen is not None:
                    listen.close()

    app.router.lifespan_context = lifespan
    return app


def listen_bus(server_options: dict[str, Any]) -> SubscriptionBus | None:
    """The SDK subscription bus the server will publish core events on (made here so ours can read it).

    Honours a user's `subscriptions=` (their bus, or False for no listen at all).
    """
    bus = server_options.get("subscriptions")
    if bus is False:
        return None
    if bus is None:
        bus = server_options["subscriptions"] = InMemorySubscriptionBus()
    return bus


def attach_listen(server: MCPServer[Any], bus: SubscriptionBus | None, service: Callable[[], TaskService],
                  push: Push) -> TaskListenHandler | None:
    """Our listen handler on `server`, fed by `bus` (core events) and `push.hub` (task hints)."""
    if bus is None:
        return None
    handler = TaskListenHandler(bus, service, lambda: None if push.mode == "off" else push.hub)
    return handler if install_listen(server, handler) else None
