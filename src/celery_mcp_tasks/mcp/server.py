"""`TasksServer`: the SDK's `MCPServer`, refusing a tool name twice.

The SDK's tool manager only logs a warning for a second tool of the same name
and keeps the first, so `@tasks.mcp_task` and `tasks.server.tool()` on one
name would leave one of the two silently unreachable. Every registration
(the `tool()` decorator included) goes through the public `add_tool`, so
overriding it catches both orders at registration time.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from mcp.server.mcpserver import MCPServer

from celery_mcp_tasks.mcp.sdk_internals import tool_registered
from celery_mcp_tasks.ops.root_handler import ROOT_HANDLER

__all__ = ["TasksServer"]


class TasksServer(MCPServer[Any]):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        plain_root_logging(kwargs.get("log_level", "INFO"))
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


def plain_root_logging(level: str) -> None:
    """One plain line per record on stderr, unless the process configured logging already.

    The SDK's `MCPServer` calls `logging.basicConfig` with rich's handler whenever
    `rich` is importable (it is: `celery-mcp-tasks call` renders with it), and that
    handler pads and wraps every line to the terminal's width, 80 columns in a
    container: log lines a collector cannot parse. Configured first, the SDK's
    `basicConfig` is a no-op. The handler is named (`ROOT_HANDLER`) so that the
    JSON log format (`ops.logs`) restyles this default and never a handler the
    application configured itself.
    """
    if not logging.getLogger().handlers:
        handler = logging.StreamHandler()
        handler.set_name(ROOT_HANDLER)
        logging.basicConfig(level=level, format="%(message)s", handlers=[handler])
