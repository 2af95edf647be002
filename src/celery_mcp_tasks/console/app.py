"""The console's Starlette app: the JSON API, the pages, the operator check, and the live-update loop.

Built by `McpTasks.console_app()` (mounted in the user's app) or `celery-mcp-tasks console APP` (standalone).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

import anyio
from starlette.applications import Starlette
from starlette.middleware import Middleware

from celery_mcp_tasks.config import ConfigError
from celery_mcp_tasks.console import api, pages
from celery_mcp_tasks.console.auth import AuthConfig, ConsoleAuth, json_error
from celery_mcp_tasks.console.context import Console

logger = logging.getLogger(__name__)


def check_mount_path(path: str, mcp_path: str) -> str:
    """The normalised mount path; `ConfigError` for the MCP endpoint's path (or one above or below it)."""
    normalised = "/" + path.strip("/")
    if normalised == "/":
        raise ConfigError("console_app(path=...): mount the console under a path of its own, e.g. /console, not /")
    mcp = "/" + mcp_path.strip("/")
    if normalised == mcp or normalised.startswith(mcp + "/") or mcp.startswith(normalised + "/"):
        raise ConfigError(f"console_app(path={path!r}): the console is never served on the MCP endpoint's path ({mcp})")
    return normalised


@asynccontextmanager
async def serving(console: Console) -> AsyncIterator[None]:
    """Run the console's live-update loop for the duration (a lifespan, or `McpTasks.serving_contexts`)."""
    async with anyio.create_task_group() as tg:
        tg.start_soon(console.run)
        console.serving = True
        try:
            yield
        finally:
            console.serving = False
            tg.cancel_scope.cancel()


def create_app(
    console: Console,
    auth: AuthConfig,
    *,
    lifespan_contexts: Sequence[Callable[[], AbstractAsyncContextManager[Any]]] = (),
    mount_path: str | None = None,
) -> Starlette:
    """The console app. `lifespan_contexts`: entered for its life (the push listener, when standalone)
    around the live-update loop. `mount_path`: where it is mounted (checked on each request)."""

    @asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        async with contextlib.AsyncExitStack() as stack:
            for context in lifespan_contexts:
                await stack.enter_async_context(context())
            await stack.enter_async_context(serving(console))
            yield

    app = Starlette(
        routes=[*api.routes(console), *pages.routes(console)],
        middleware=[
            *([] if mount_path is None else [Middleware(_MountGuard, path=mount_path, console=console)]),
            Middleware(ConsoleAuth, config=auth, signed_out=console.signed_out),
        ],
        lifespan=lifespan,
    )
    app.state.console_auth = auth
    return app


NO_LIFESPAN = (
    "the console is mounted, but the host app does not run its lifespan: pass lifespan=tasks.lifespan "
    "to your Starlette or FastAPI app (a mounted app's own lifespan never runs, and the console's live "
    "updates run in it)"
)


class _MountGuard:
    """A mounted console answers only at the path `console_app(path=...)` checked (so never on the MCP path),
    and only while its live-update loop runs (without `lifespan=tasks.lifespan` its pages would never update)."""

    def __init__(self, app: Any, path: str, console: Console) -> None:
        self.app = app
        self.path = path
        self.console = console
        self.warned = False

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        # Where it is mounted inside the application: the ASGI server's own root path (`uvicorn --root-path`
        # behind a proxy that strips a prefix) is outside it (Starlette's `app_root_path`).
        root = str(scope.get("root_path", "")).rstrip("/")
        outside = str(scope.get("app_root_path", "")).rstrip("/")
        if outside and root.startswith(outside):
            root = root[len(outside) :]
            root = "/" + root.lstrip("/") if root else ""  # a root path given with its slash: `/api/` + `/console`
        if scope["type"] != "http":
            await self.app(scope, receive, send)
        elif not self.console.serving:
            if not self.warned:
                self.warned = True
                logger.error("celery-mcp-tasks console: %s", NO_LIFESPAN)
            await json_error(503, "no_lifespan", NO_LIFESPAN)(scope, receive, send)
        elif root != self.path:
            message = (
                f"the console is mounted at {root or '/'!r}, not at console_app(path={self.path!r}): "
                "mount it where console_app says"
            )
            await json_error(404, "misplaced", message)(scope, receive, send)
        else:
            await self.app(scope, receive, send)
