"""Jobs for the TypeScript interop tests (tests/integration/test_ts_clients.py).

    celery -A tests.apps.interop_app worker
    celery-mcp-tasks serve tests.apps.interop_app

One job a scenario: progress reported several times, a question for the user,
and a long job that stops cooperatively (it checks `ctx.cancelled()`; nothing
is terminated).
"""

from __future__ import annotations

import time

from celery_mcp_tasks import McpTasks, TaskContext, elicit

tasks = McpTasks("interop-tests")
celery = tasks.celery


def _count(steps: int, ctx: TaskContext, pause: float) -> str:
    for step in range(1, steps + 1):
        ctx.progress(f"step {step} of {steps}", step, steps)
        time.sleep(pause)
    return f"counted to {steps}"


@tasks.mcp_task
def count_up(steps: int, ctx: TaskContext, pause: float = 0.4) -> str:
    """Reports progress `steps` times (step i of `steps`), pausing between steps."""
    return _count(steps, ctx, pause)


@tasks.mcp_task(poll_interval_ms=600_000)
def count_up_pushed(steps: int, ctx: TaskContext, pause: float = 0.4) -> str:
    """`count_up` whose tasks ask pollers to wait ten minutes: a client that sees it finish was told by a push."""
    return _count(steps, ctx, pause)


@tasks.mcp_task(needs=("elicitation",))
def ask_name(greeting: str, ctx: TaskContext) -> str:
    """Asks the user for a name (one input round), then greets them."""
    return _ask_name(greeting, ctx)


def _ask_name(greeting: str, ctx: TaskContext) -> str:
    if "name" not in ctx.input_responses:
        ctx.require_input({"name": elicit("What is your name?", {"name": str})}, "Waiting for a name")
    answer = ctx.input_responses["name"]
    if answer.get("action") != "accept":
        return f"{greeting}, stranger! ({answer.get('action')})"
    return f"{greeting}, {answer['content']['name']}!"


@tasks.mcp_task(needs=("elicitation",), poll_interval_ms=600_000)
def ask_name_pushed(greeting: str, ctx: TaskContext) -> str:
    """`ask_name` whose tasks ask pollers to wait ten minutes: a client that answers it heard the question pushed."""
    return _ask_name(greeting, ctx)


@tasks.mcp_task
def stay_busy(seconds: float, ctx: TaskContext) -> str:
    """Works up to `seconds`, stopping early once the task is cancelled (cooperative: never terminated)."""
    ctx.progress("busy", 0, seconds)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if ctx.cancelled():
            return "stopped early"
        time.sleep(0.05)
    return f"busy for {seconds:g}s"


@tasks.mcp_task
def fail_saying(words: str) -> str:
    """Fails with `words` as its error (the console's test of long and odd text)."""
    raise ValueError(words)
