"""The Tasks extension's shapes as the client reads them (pydantic over `mcp_types`): a created task, a
task's state, the requests."""

from __future__ import annotations

from typing import Any, Literal

from mcp_types import INTERNAL_ERROR, CallToolResult, ErrorData, Request, RequestParams, Result
from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from celery_mcp_tasks.model import TERMINAL_VALUES
from celery_mcp_tasks.protocol import PROGRESS_META_KEY

TaskStatus = Literal["working", "input_required", "completed", "failed", "cancelled"]
TERMINAL: frozenset[str] = frozenset(TERMINAL_VALUES)


class _TaskFields(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="allow")

    task_id: str
    status: TaskStatus
    status_message: str | None = None
    created_at: str
    last_updated_at: str
    ttl_ms: int | None = None
    poll_interval_ms: int | None = None


class CreateTaskResult(Result, _TaskFields):
    """`tools/call` answered with a task (`resultType: "task"`): the flat task fields, nothing else."""

    result_type: Literal["task"] = "task"

    def state(self) -> TaskState:
        return TaskState.model_validate(self.model_dump(by_alias=True, exclude={"result_type", "meta"}))


class TaskState(_TaskFields):
    """A task as `tasks/get` or `notifications/tasks` renders it.

    `result` (completed) is the `CallToolResult` the synchronous call would have
    returned, `error` (failed) the JSON-RPC error, `input_requests`
    (input_required) the outstanding requests keyed as the server chose.
    """

    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    input_requests: dict[str, Any] | None = None
    meta: dict[str, Any] | None = Field(default=None, alias="_meta")

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL

    def call_tool_result(self) -> CallToolResult:
        """The completed task's result as the SDK's `CallToolResult`."""
        return CallToolResult.model_validate(self.result or {}, by_name=False)

    def error_data(self) -> ErrorData:
        raw = self.error or {}
        return ErrorData(
            code=int(raw.get("code", INTERNAL_ERROR)),
            message=str(raw.get("message") or self.status_message or "The task failed"),
            data=raw.get("data"),
        )

    def progress(self) -> tuple[float, float | None] | None:
        """`(current, total)` when the job reported numbers (this server's `_meta` progress key),
        as the job gave them: a whole number stays an `int`."""
        found = (self.meta or {}).get(PROGRESS_META_KEY)
        if not isinstance(found, dict) or not _number(found.get("progress")):
            return None
        total = found.get("total")
        return found["progress"], total if _number(total) else None

    def seen_as(self) -> dict[str, Any]:
        """What a follower sees of this state: its fields but `lastUpdatedAt`, and `_meta` but the
        protocol's own keys (the session's server info, the listen subscription's id); neither they nor
        the envelope's extra fields (`resultType` of a `tasks/get` answer) are news."""
        seen = self.model_dump(include=set(_TaskFields.model_fields) - {"last_updated_at"})
        seen.update(self.model_dump(include={"result", "error", "input_requests"}))
        seen["meta"] = {k: v for k, v in (self.meta or {}).items() if not k.startswith(_PROTOCOL_META_PREFIX)}
        return seen


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


_PROTOCOL_META_PREFIX = "io.modelcontextprotocol/"


class TaskIdParams(RequestParams):
    task_id: str


class UpdateParams(TaskIdParams):
    input_responses: dict[str, Any]


class GetTaskRequest(Request[TaskIdParams, Literal["tasks/get"]]):
    method: Literal["tasks/get"] = "tasks/get"
    params: TaskIdParams
    name_param = "taskId"  # the SDK mirrors it into the Mcp-Name header


class UpdateTaskRequest(Request[UpdateParams, Literal["tasks/update"]]):
    method: Literal["tasks/update"] = "tasks/update"
    params: UpdateParams
    name_param = "taskId"


class CancelTaskRequest(Request[TaskIdParams, Literal["tasks/cancel"]]):
    method: Literal["tasks/cancel"] = "tasks/cancel"
    params: TaskIdParams
    name_param = "taskId"


class Ack(Result):
    """`{"resultType": "complete"}`: the answer to tasks/update and tasks/cancel."""

    model_config = ConfigDict(extra="allow")
