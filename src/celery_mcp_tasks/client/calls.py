"""The requests the client sends about a task (`tasks/get`, `tasks/update`, `tasks/cancel`), and the errors a
task-following client raises besides the SDK's own `MCPError`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mcp.shared.exceptions import MCPError
from mcp_types import INVALID_PARAMS
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import ValidationError

from celery_mcp_tasks import protocol
from celery_mcp_tasks.client.models import Ack, GetTaskRequest, TaskIdParams, TaskState

if TYPE_CHECKING:
    from mcp.client.session import ClientSession

TASKS_VERSIONS = protocol.TASKS_VERSIONS & frozenset(MODERN_PROTOCOL_VERSIONS)
"""Those of the extension's protocol versions this SDK speaks."""


class TaskCancelled(Exception):
    """The task ended `cancelled` (by this client, another client, or the server)."""

    def __init__(self, state: TaskState) -> None:
        reason = f": {state.status_message}" if state.status_message else ""
        super().__init__(f"The task was cancelled{reason}")
        self.state = state

    def __reduce__(self) -> tuple[Any, ...]:  # pickled (a Celery task's exception, say) as it was made
        return type(self), (self.state,)


class TaskFailed(MCPError):
    """The task ended `failed`: the SDK's `MCPError` with the task's error (code, message, data), as the
    synchronous call would have raised it, and the task's last state in `state`."""

    def __init__(self, state: TaskState) -> None:
        error = state.error_data()
        super().__init__(error.code, error.message, error.data)
        self.state = state

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (self.state,)


class TaskNotFound(MCPError):
    """The server no longer knows the task (expired, evicted, or never this caller's)."""


class InputNotAnswered(MCPError):
    """The task asked for input this client could not give (no callback, or the callback refused).

    The task is cancelled before this is raised.
    """


async def send(session: ClientSession, request: Any) -> None:
    try:
        await session.send_request(request, Ack)
    except MCPError as exc:
        raise translate(exc) from None


async def get_task(session: ClientSession, task_id: str) -> TaskState:
    try:
        return await session.send_request(GetTaskRequest(params=TaskIdParams(task_id=task_id)), TaskState)
    except MCPError as exc:
        raise translate(exc) from None
    except ValidationError as exc:
        raise MCPError(INVALID_PARAMS, f"tasks/get returned a malformed task: {exc.error_count()} errors") from None


def translate(exc: MCPError) -> MCPError:
    message = exc.message.lower()
    if exc.code == INVALID_PARAMS and ("not found" in message or "expired" in message):
        return TaskNotFound(exc.code, exc.message, exc.data)
    return exc


def brief(exc: BaseException) -> str:
    if isinstance(exc, MCPError):
        return f"{exc.code} {exc.message}"[:200]
    return type(exc).__name__
