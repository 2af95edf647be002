"""The root handler this package installs where it owns logging: its commands, and a process with the logs plugin on.

`McpTasks` itself leaves root logging to the application (`mcp.server.TasksServer`).
The package's commands (`serve`, `dev`, `stdio`, `doctor`) are the application in
their processes, and the logs plugin (`ops.logs.Logs`, e.g. MCP_TASKS_LOG_FORMAT=json)
is the application asking for the package's log lines: each installs this handler
when the process has configured none. `ops.logs` restyles it (JSON, task-id
redaction) and never a handler the application configured itself, which is why it is
named. A module of its own, importing only the standard library: `cli/` and
`ops.logs` share it without either importing the other.
"""

from __future__ import annotations

import logging

__all__ = ["ROOT_HANDLER", "plain_root_logging"]

ROOT_HANDLER = "celery-mcp-tasks"


def plain_root_logging(level: str = "INFO") -> None:
    """One plain line per record on stderr, unless the process configured logging already.

    Plain on purpose: rich's handler (which the SDK's `MCPServer` would install) pads and
    wraps every line to the terminal's width, 80 columns in a container: log lines a
    collector cannot parse.
    """
    if not logging.getLogger().handlers:
        handler = logging.StreamHandler()
        handler.set_name(ROOT_HANDLER)
        logging.basicConfig(level=level, format="%(message)s", handlers=[handler])
