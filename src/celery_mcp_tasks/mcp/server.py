"""`TasksServer`: the SDK's `MCPServer`, refusing a tool name twice, and a guest in the process.

The SDK's tool manager only warns about a second tool of the same name and keeps the first; every
registration goes through the public `add_tool`, so overriding it catches both orders. The SDK's
`MCPServer.__init__` also calls `logging.basicConfig`; ours leaves the root logger as it found it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from mcp.server.mcpserver import MCPServer

from celery_mcp_tasks.sdk_internals import tool_registered


class TasksServer(MCPServer[Any]):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        with root_logger_kept():
            super().__init__(*args, **kwargs)

    def has_tool(self, name: str) -> bool:
        return tool_registered(self, name)

    def add_tool(self, fn: Callable[..., Any], name: str | None = None, *args: Any, **kwargs: Any) -> None:
        tool_name = name or getattr(fn, "__name__", None)
        if tool_name is not None and self.has_tool(tool_name):
            raise ValueError(
                f"tool {tool_name!r} is already registered on this server; give one of the two "
                f"another name (a task tool and a plain tool cannot share one)"
            )
        super().add_tool(fn, name, *args, **kwargs)


@contextmanager
def root_logger_kept() -> Iterator[None]:
    """The root logger's handlers and level as they were before the block, whatever it configured.

    `logging.basicConfig` does nothing while the root logger has a handler, so an unconfigured root gets
    a `NullHandler` for the block's length; anything added all the same is removed, the level put back.
    """
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    placeholder = None if handlers else logging.NullHandler()
    if placeholder is not None:
        root.addHandler(placeholder)
    try:
        yield
    finally:
        for handler in list(root.handlers):
            if handler not in handlers:
                root.removeHandler(handler)
        root.setLevel(level)
