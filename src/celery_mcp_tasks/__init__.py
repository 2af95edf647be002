"""celery-mcp-tasks: the MCP Tasks extension for the official Python SDK, run by Celery, kept in SQL.

The names below load lazily, so `import celery_mcp_tasks.model` (or `.store`,
`.service`) loads neither the SDK nor Celery: the domain stays importable alone.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from celery_mcp_tasks.app import McpTasks
    from celery_mcp_tasks.config import ConfigError, Settings
    from celery_mcp_tasks.model import (
        DuplicateInputKeys,
        RunInProgress,
        Superseded,
        TaskRecord,
        TaskStatus,
        TerminalTask,
    )
    from celery_mcp_tasks.notify.base import Notifier
    from celery_mcp_tasks.protocol import InvalidInputRequest, elicit, list_roots, sample
    from celery_mcp_tasks.store.base import StoreUnavailable
    from celery_mcp_tasks.worker.context import InputTimeout, TaskContext
    from celery_mcp_tasks.worker.janitor import MetricHook, SweepReport
    from celery_mcp_tasks.worker.job import McpTaskJob

_EXPORTS = {
    "ConfigError": "celery_mcp_tasks.config",
    "DuplicateInputKeys": "celery_mcp_tasks.model",
    "InputTimeout": "celery_mcp_tasks.worker.context",
    "InvalidInputRequest": "celery_mcp_tasks.protocol",
    "McpTaskJob": "celery_mcp_tasks.worker.job",
    "McpTasks": "celery_mcp_tasks.app",
    "MetricHook": "celery_mcp_tasks.janitor",
    "Notifier": "celery_mcp_tasks.notify.base",
    "RunInProgress": "celery_mcp_tasks.model",
    "Settings": "celery_mcp_tasks.config",
    "StoreUnavailable": "celery_mcp_tasks.store.base",
    "Superseded": "celery_mcp_tasks.model",
    "SweepReport": "celery_mcp_tasks.janitor",
    "TaskContext": "celery_mcp_tasks.worker.context",
    "TaskRecord": "celery_mcp_tasks.model",
    "TaskStatus": "celery_mcp_tasks.model",
    "TerminalTask": "celery_mcp_tasks.model",
    "elicit": "celery_mcp_tasks.protocol",
    "list_roots": "celery_mcp_tasks.protocol",
    "sample": "celery_mcp_tasks.protocol",
}

# A literal list, not `sorted(_EXPORTS)`: type checkers read it to know these names are
# re-exported (mypy --strict rejects `from celery_mcp_tasks import McpTasks` otherwise).
__all__ = [
    "ConfigError",
    "DuplicateInputKeys",
    "InputTimeout",
    "InvalidInputRequest",
    "McpTaskJob",
    "McpTasks",
    "MetricHook",
    "Notifier",
    "RunInProgress",
    "Settings",
    "StoreUnavailable",
    "Superseded",
    "SweepReport",
    "TaskContext",
    "TaskRecord",
    "TaskStatus",
    "TerminalTask",
    "elicit",
    "list_roots",
    "sample",
]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'celery_mcp_tasks' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
