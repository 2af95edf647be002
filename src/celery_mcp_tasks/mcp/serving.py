"""Push in the web process: the listen handler on the server, the listener in the lifespan.

Two traps shape this module. The SDK's `MCPServer` registers its own
`subscriptions/listen` handler and offers no public way to swap it, so ours
replaces it (`sdk_internals.replace_listen_handler`). And an ASGI server runs
the lifespan's shutdown only after every connection has drained, which an open
listen stream never does: so the streams are ended when the
server *receives* SIGTERM or SIGINT (`sdk_internals.on_server_exit`), and each
stream then sends its listen result and closes, letting the server exit at once.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp.server.request_state import RequestStateBoundary
from mcp.server.subscriptions import InMemorySubscriptionBus, SubscriptionBus
from mcp_types import SubscriptionsListenRequestParams

from celery_mcp_tasks.mcp.listen import TaskListenHandler
from celery_mcp_tasks.mcp.sdk_internals import (
    Lifespan,
    on_server_exit,
    replace_listen_handler,
    wrap_lifespan,
)
from celery_mcp_tasks.notify.hub import Hub
from celery_mcp_tasks.notify.push import Push
from celery_mcp_tasks.service import TaskService

__all__ = [
    "attach_listen",
    "listen_bus",
    "push_hub",
    "request_state_sealed",
    "with_push",
    "with_serving_contexts",
]

logger = logging.getLogger("celery_mcp_tasks.mcp")


def with_push(app: Any, push: Push, listen: TaskListenHandler | None, service: Callable[[], TaskService]) -> Any:
    """Wrap a Starlette app's lifespan: run the hint listener, end listen streams on exit.

    The wrapped lifespan is the app's whole life (the SDK's session manager
    included), so an application that mounts this app inside its own runs it
    as its lifespan (`McpTasks.lifespan`).
    """

    def wrap(inner: Lifespan) -> Lifespan:
        @asynccontextmanager
        async def lifespan(asgi_app: Any) -> AsyncIterator[Any]:
            service()  # this process's store and service exist (and push is bound to them) before it listens
            async with inner(app) as state, push.serving():
                if listen is not None:
                    listen.reopen()
                restore = on_server_exit(listen.close) if listen is not None else (lambda: None)
                try:
                    yield state
                finally:
                    restore()
                    if listen is not None:
                        listen.close()

        return lifespan

    wrap_lifespan(app, wrap)
    return app


def with_serving_contexts(app: Any, contexts: Sequence[Callable[[], AbstractAsyncContextManager[Any]]]) -> Any:
    """Wrap a Starlette app's lifespan so each of `contexts` (read when it starts) lives as long as the app."""

    def wrap(inner: Lifespan) -> Lifespan:
        @asynccontextmanager
        async def lifespan(asgi_app: Any) -> AsyncIterator[Any]:
            async with inner(asgi_app) as state, AsyncExitStack() as stack:
                for context in contexts:
                    await stack.enter_async_context(context())
                yield state

        return lifespan

    wrap_lifespan(app, wrap)
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


def push_hub(push: Push) -> Callable[[], Hub | None]:
    """This process's hub for streams and synchronous calls to watch; None when push is off."""
    return lambda: None if push.mode == "off" else push.hub


def request_state_sealed(server: MCPServer[Any]) -> bool:
    """Whether the SDK's `RequestStateBoundary` seals `requestState` on `server` (`MCPServer` installs
    one by default, under a process-local key unless `request_state_security=` shares one)."""
    return any(isinstance(middleware, RequestStateBoundary) for middleware in server.middleware)


def attach_listen(
    server: MCPServer[Any], bus: SubscriptionBus | None, service: Callable[[], TaskService], push: Push
) -> TaskListenHandler | None:
    """Our listen handler on `server`, fed by `bus` (core events) and `push.hub` (task hints)."""
    if bus is None:
        return None
    handler = TaskListenHandler(bus, service, push_hub(push))
    return handler if replace_listen_handler(server, SubscriptionsListenRequestParams, handler) else None
