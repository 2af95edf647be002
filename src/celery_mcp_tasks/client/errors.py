"""What a task-following client raises besides the SDK's own `MCPError`."""

from __future__ import annotations

from mcp.shared.exceptions import MCPError

from celery_mcp_tasks.client.models import TaskState


class TaskCancelled(Exception):
    """The task ended `cancelled` (by this client, another client, or the server)."""

    def __init__(self, state: TaskState) -> None:
        reason = f": {state.status_message}" if state.status_message else ""
        super().__init__(f"The task was cancelled{reason}")
        self.state = state


class TaskNotFound(MCPError):
    """The server no longer knows the task (expired, evicted, or never this caller's)."""


class InputNotAnswered(MCPError):
    """The task asked for input this client could not give (no callback, or the callback refused).

    The task is cancelled before this is raised.
    """
