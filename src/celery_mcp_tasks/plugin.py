"""The one seam an operations concern (metrics, health, logs, traces, the janitor watch) attaches through.

A plugin knows the app only through `Runtime`, never `app.py`'s module; the built-in plugins live in
`celery_mcp_tasks.ops`.
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Callable, Collection, Sequence
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any, Protocol, cast

from celery_mcp_tasks.config import Settings
from celery_mcp_tasks.model import TaskRecord

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine
    from starlette.routing import BaseRoute

    from celery_mcp_tasks.service import TaskService
    from celery_mcp_tasks.store.base import Store

__all__ = ["Plugin", "Runtime", "overrides", "store_built_hook"]


class Runtime(Protocol):
    """What a plugin may know of the app it serves (read in `Plugin.setup`)."""

    @property
    def name(self) -> str: ...

    @property
    def settings(self) -> Settings: ...

    @property
    def celery(self) -> Any:
        """The app's `celery.Celery` (its signals and configuration are this app's)."""

    @property
    def tools(self) -> Collection[str]:
        """The names of the app's task tools, live (tools declared later are in it)."""

    def service(self) -> TaskService:
        """This process's task service (built on first use, rebuilt after a fork)."""


class Plugin:
    """One operations concern; override the hooks you need. A hook must be cheap and must not
    raise into the caller: the app logs and swallows what `task_changed`, `swept` and the
    stream hooks raise (the write, the sweep, the stream go on)."""

    def setup(self, runtime: Runtime) -> None:
        """Once, while `McpTasks` is constructed: register (Celery signals, settings checks), connect nothing.

        Raise `ConfigError` for a setting this plugin cannot honour: the process stops with one line.
        """

    def store_built(self, store: Store, engine: Engine) -> None:
        """A process built its store (once per process, after a fork too), before any write: the `Store`
        and the SQLAlchemy engine it runs on (that process's own, e.g. for an event listener). On PostgreSQL
        its pool is in autocommit and takes a connection back as it is, without a rollback: a transaction
        opened on one of its connections must be ended before the connection is closed."""

    def task_changed(self, before: TaskRecord | None, after: TaskRecord) -> None:
        """`after` was committed, replacing `before` (None: created), in the process that wrote it."""

    def creation_refused(self, tool: str, limit: str) -> None:
        """A caller's quota, or the store's row cap, refused a creation of `tool`; `limit` says which ("active",
        "active_tool", "creations", "max_rows"). Never told who the caller was."""

    def swept(self, name: str, counts: dict[str, int]) -> None:
        """A janitor sweep reported `counts` under `name` (the `MetricHook` contract)."""

    def stream_opened(self) -> None:
        """A `subscriptions/listen` stream opened in this web process."""

    def stream_closed(self) -> None:
        """A listen stream closed."""

    def stream_notified(self, latency_s: float) -> None:
        """A listen stream sent a notification `latency_s` after a hint woke it."""

    def serving(self) -> AbstractAsyncContextManager[Any] | None:
        """A context entered for the served MCP app's whole life (its lifespan), or None."""
        return None

    def routes(self) -> Sequence[BaseRoute]:
        """Routes for the separate operations app (`McpTasks.ops_app()`), never the MCP app's."""
        return ()


def overrides(plugin: Plugin, hook: str) -> bool:
    """Whether `plugin` overrides `hook`: the app calls only those (a default hook costs nothing)."""
    return getattr(type(plugin), hook) is not getattr(Plugin, hook)


def store_built_hook(plugin: Plugin) -> Callable[[Store, Engine], None]:
    """`plugin.store_built`, called as `(store, engine)`. A hook written as the docs first showed it,
    `store_built(self, store)`, still works: it gets the store alone, with a DeprecationWarning."""
    hook = plugin.store_built
    try:
        parameters = inspect.signature(hook).parameters.values()
    except (TypeError, ValueError):  # no signature to read (e.g. a builtin): call it as documented
        return hook
    positional = [p for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if len(positional) != 1 or any(p.kind is p.VAR_POSITIONAL for p in parameters):
        return hook
    warnings.warn(
        f"{type(plugin).__name__}.store_built(store) is deprecated: the hook takes (store, engine)",
        DeprecationWarning,
        stacklevel=2,
    )
    one = cast("Callable[[Store], None]", hook)
    return lambda store, _engine: one(store)
