"""The SDK's `MCPServer` calls `logging.basicConfig` when it is constructed; ours leaves the root logger as it was."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

from celery_mcp_tasks.mcp.server import TasksServer


@contextmanager
def bare_root() -> Iterator[logging.Logger]:
    """The root logger as an application that configured no logging has it (pytest's own handlers set aside)."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    for handler in handlers:
        root.removeHandler(handler)
    root.setLevel(logging.WARNING)
    try:
        yield root
    finally:
        for handler in list(root.handlers):
            root.removeHandler(handler)
        for handler in handlers:
            root.addHandler(handler)
        root.setLevel(level)


def test_constructing_the_server_adds_no_root_handler_and_keeps_the_level() -> None:
    with bare_root() as root:
        TasksServer("guest", log_level="DEBUG")
        assert root.handlers == [] and root.level == logging.WARNING


def test_the_applications_own_root_configuration_is_kept() -> None:
    mine = logging.StreamHandler()
    with bare_root() as root:
        root.addHandler(mine)
        root.setLevel(logging.ERROR)
        TasksServer("guest", log_level="DEBUG")
        assert root.handlers == [mine] and root.level == logging.ERROR


def test_the_sdks_own_server_still_configures_the_root_logger() -> None:
    """Why `root_logger_kept` exists: the day this fails, the SDK stopped, and the workaround can go."""
    import importlib.metadata

    from mcp.server.mcpserver import MCPServer

    with bare_root() as root:
        MCPServer("plain", log_level="DEBUG")
        assert root.handlers or root.level != logging.WARNING, (
            f"mcp {importlib.metadata.version('mcp')} no longer calls logging.basicConfig: remove root_logger_kept"
        )
