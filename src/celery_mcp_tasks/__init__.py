"""celery-mcp-tasks: the MCP Tasks extension for the official Python SDK, run by Celery, kept in SQL.

What a user writes is exported here, once: `McpTasks` (declare tools, serve, run
workers), `TaskContext` (what a job is given), the input-request builders, and
the exceptions a job or a caller catches. Everything else lives in its
submodule. The names load lazily, so `import celery_mcp_tasks.model` (or
`.store`, `.service`) loads neither the SDK nor Celery.
"""

from __future__ import annotations

import warnings
from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from celery_mcp_tasks.app import McpTasks
    from celery_mcp_tasks.config import ConfigError
    from celery_mcp_tasks.model import DuplicateInputKeys, TerminalTask
    from celery_mcp_tasks.protocol import InvalidInputRequest, elicit, elicit_url, list_roots, sample
    from celery_mcp_tasks.store.base import StoreUnavailable
    from celery_mcp_tasks.worker.context import InputTimeout, TaskContext

_EXPORTS = {
    "ConfigError": "celery_mcp_tasks.config",
    "DuplicateInputKeys": "celery_mcp_tasks.model",
    "InputTimeout": "celery_mcp_tasks.worker.context",
    "InvalidInputRequest": "celery_mcp_tasks.protocol",
    "McpTasks": "celery_mcp_tasks.app",
    "StoreUnavailable": "celery_mcp_tasks.store.base",
    "TaskContext": "celery_mcp_tasks.worker.context",
    "TerminalTask": "celery_mcp_tasks.model",
    "elicit": "celery_mcp_tasks.protocol",
    "elicit_url": "celery_mcp_tasks.protocol",
    "list_roots": "celery_mcp_tasks.protocol",
    "sample": "celery_mcp_tasks.protocol",
}

_MOVED = {
    "Superseded": "celery_mcp_tasks.model",
    "TaskRecord": "celery_mcp_tasks.model",
}
"""Names the README once showed at the top level: still importable here, with a DeprecationWarning."""

# A literal list, not `sorted(_EXPORTS)`: type checkers read it to know these names are
# re-exported (mypy --strict rejects `from celery_mcp_tasks import McpTasks` otherwise).
__all__ = [
    "ConfigError",
    "DuplicateInputKeys",
    "InputTimeout",
    "InvalidInputRequest",
    "McpTasks",
    "StoreUnavailable",
    "TaskContext",
    "TerminalTask",
    "elicit",
    "elicit_url",
    "list_roots",
    "sample",
]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        moved = _MOVED.get(name)
        if moved is None:
            raise AttributeError(f"module 'celery_mcp_tasks' has no attribute {name!r}")
        warnings.warn(
            f"celery_mcp_tasks.{name} is deprecated; import it from {moved}", DeprecationWarning, stacklevel=2
        )
        return getattr(import_module(moved), name)
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
