"""celery-mcp-tasks: the MCP Tasks extension for the official Python SDK, run by Celery, kept in SQL."""

from celery_mcp_tasks.app import McpTasks
from celery_mcp_tasks.config import ConfigError, Settings
from celery_mcp_tasks.context import InputTimeout, TaskContext
from celery_mcp_tasks.inputs import elicit, list_roots, sample
from celery_mcp_tasks.model import DuplicateInputKeys, Superseded, TaskStatus, TerminalTask

__all__ = [
    "ConfigError",
    "DuplicateInputKeys",
    "InputTimeout",
    "McpTasks",
    "Settings",
    "Superseded",
    "TaskContext",
    "TaskStatus",
    "TerminalTask",
    "elicit",
    "list_roots",
    "sample",
]
__version__ = "0.1.0"
