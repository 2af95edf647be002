"""The name of the root handler `mcp.server.plain_root_logging` installs in the web process.

`ops.logs` restyles that handler (JSON, task-id redaction) and never one the application
configured itself. A module of its own, importing nothing: `mcp/` and `ops.logs` share the
name without `ops.logs` (which reads Celery's and the worker's logging) being an adapter's import.
"""

from __future__ import annotations

__all__ = ["ROOT_HANDLER"]

ROOT_HANDLER = "celery-mcp-tasks"
