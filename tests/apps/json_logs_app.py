"""Jobs for the structured-log tests (tests/integration/test_json_logs.py).

Each job echoes its argument into its result, so a test can prove that neither
reaches a log line. The lifecycle and janitor loggers are at DEBUG here so that
every task event and every sweep shows at the processes' INFO level.
"""

from __future__ import annotations

import logging
import time

from celery_mcp_tasks import McpTasks, TaskContext, elicit

logging.getLogger("celery_mcp_tasks.tasks").setLevel(logging.DEBUG)
logging.getLogger("celery_mcp_tasks.janitor").setLevel(logging.DEBUG)

tasks = McpTasks("json-logs-tests")
celery = tasks.celery


@tasks.mcp_task
def echo(secret: str, ctx: TaskContext) -> str:
    """Reports progress once, logs a line of its own, and returns its argument inside the result."""
    ctx.progress("echoing", 1, 1)
    logging.getLogger("json_logs_app").info("the job says hello")
    print("a job's print goes to the log")  # the worker redirects stdout into its logger
    return f"result-{secret[::-1]}"


@tasks.mcp_task(needs=("elicitation",))
def ask(secret: str, ctx: TaskContext) -> str:
    """One input round, then the answer and the argument in the result."""
    if "name" not in ctx.input_responses:
        ctx.require_input({"name": elicit("Name?", {"name": str})}, "Waiting for a name")
    return f"result-{ctx.input_responses['name']['content']['name']}-{secret[::-1]}"


@tasks.mcp_task
def linger(seconds: float, ctx: TaskContext) -> str:
    """Runs until cancelled (cooperatively) or `seconds` pass."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not ctx.cancelled():
        time.sleep(0.05)
    return "lingered"
