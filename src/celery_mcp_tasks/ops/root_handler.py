"""The name of the root handler `cli.shared.plain_root_logging` installs in the package's commands.

`ops.logs` restyles that handler (JSON, task-id redaction) and never one the application
configured itself. A module of its own, importing nothing: `cli/` and `ops.logs` share the
name without either importing the other.
"""

from __future__ import annotations

__all__ = ["ROOT_HANDLER"]

ROOT_HANDLER = "celery-mcp-tasks"
