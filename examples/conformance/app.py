"""The conformance suite's fixture server: core 2026-07-28 fixtures plus the
tasks fixtures, the latter running as real Celery jobs through `@mcp_task`.

    celery-mcp-tasks serve examples.conformance.app --port 8000
    celery -A examples.conformance.app worker
"""

from __future__ import annotations

import time
from typing import Annotated, Any

from mcp_types import CallToolResult, ElicitRequest, InputRequiredResult, TextContent
from pydantic import Field

from celery_mcp_tasks import McpTasks, TaskContext, elicit
from examples.conformance.core_fixtures import register_core_fixtures
from examples.conformance.replica_bus import ReplicaBus

# Core list-changed events cross web replicas (a round-robin proxy in front of several `serve`s).
bus = ReplicaBus()
tasks = McpTasks("celery-mcp-tasks-conformance", subscriptions=bus, plugins=[bus])
celery = tasks.celery
server = tasks.server

# tools/list order: the core fixtures first (`test_simple_text` leads), then these.
register_core_fixtures(server)


@server.tool()
def greet(name: str) -> str:
    """Greets someone by name (always synchronous)."""
    return f"Hello, {name}!"


@tasks.mcp_task
def slow_compute(seconds: Annotated[int, Field(ge=0)], ctx: TaskContext, label: str | None = None) -> str:
    """Works for `seconds` seconds, checking for cancellation every 100 ms."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if ctx.cancelled():
            return "cancelled"
        time.sleep(0.1)
    return f"Computed {label or 'result'} after {seconds} second(s)"


@tasks.mcp_task(mode="required")
def failing_job() -> CallToolResult:
    """Finishes after about a second with a tool error (isError: true)."""
    time.sleep(1)
    return CallToolResult(content=[TextContent(type="text", text="The job failed as designed")], is_error=True)


@tasks.mcp_task(mode="required")
def protocol_error_job() -> str:
    """Raises in the worker after half a second: the task ends `failed`."""
    time.sleep(0.5)
    raise RuntimeError("protocol_error_job raised on purpose")


def _accepted(answer: Any) -> dict[str, Any] | None:
    if isinstance(answer, dict) and answer.get("action") == "accept" and isinstance(answer.get("content"), dict):
        return answer["content"]
    return None


@tasks.mcp_task(mode="required", needs=("elicitation",))
def confirm_delete(filename: str, ctx: TaskContext) -> str:
    """Asks the user to confirm before deleting `filename`."""
    if "confirm" not in ctx.input_responses:
        ctx.require_input({"confirm": elicit(f"Delete {filename}?", {"confirm": bool})}, "Waiting for confirmation")
    content = _accepted(ctx.input_responses["confirm"])
    if content and content.get("confirm") is True:
        return f"Deleted {filename}"
    return f"Kept {filename}"


@tasks.mcp_task(mode="required", needs=("elicitation",))
def multi_input(ctx: TaskContext) -> str:
    """Asks two questions at once; answers may come one at a time."""
    answers = ctx.input_responses
    if "first" not in answers:
        ctx.require_input(
            {
                "first": elicit("First value?", {"name": str}),
                "second": elicit("Second value?", {"name": str}),
            },
            "Waiting for two answers",
        )
    values = [(_accepted(answers.get(key)) or {}).get("name", "?") for key in ("first", "second")]
    return f"Received first={values[0]} and second={values[1]}"


async def _ask_name(arguments: dict[str, Any], answers: dict[str, Any]) -> InputRequiredResult | dict[str, Any]:
    content = _accepted(answers.get("user_name"))
    if content and isinstance(content.get("name"), str):
        return {"user_name": answers["user_name"]}
    request = elicit("What is your name?", {"name": str})
    return InputRequiredResult(input_requests={"user_name": ElicitRequest.model_validate(request)})


@tasks.mcp_task(mode="required", needs=("elicitation",), prepare=_ask_name)
def test_tool_with_task(ctx: TaskContext) -> str:
    """Asks for a name before the task exists (MRTR), then greets in a task."""
    name = (_accepted(ctx.input_responses.get("user_name")) or {}).get("name", "stranger")
    return f"Hello, {name}!"
