"""Fixture jobs for payload limits and encryption at rest (tests/integration/test_payloads.py).

    celery -A tests.apps.payload_app worker
    celery-mcp-tasks serve tests.apps.payload_app

The limits of `bounded` are its own (`@mcp_task` options); `secret_echo` runs under the settings'.
"""

from __future__ import annotations

from typing import Any

from celery_mcp_tasks import McpTasks, TaskContext, elicit

tasks = McpTasks("payload-tests")
celery = tasks.celery


@tasks.mcp_task(max_arguments_bytes=200, max_answer_bytes=300, max_result_bytes=500, needs=("elicitation",))
def bounded(text: str, result_size: int, ctx: TaskContext) -> str:
    """Asks for a word, then returns `result_size` characters."""
    if "word" not in ctx.input_responses:
        ctx.require_input({"word": elicit("A word?", {"word": str})}, "Waiting for a word")
    return "r" * result_size


@tasks.mcp_task(needs=("elicitation",))
def secret_echo(secret: str, ctx: TaskContext) -> dict[str, Any]:
    """Asks a question that carries the secret, and returns the secret with the answer."""
    if "confirm" not in ctx.input_responses:
        ctx.require_input({"confirm": elicit(f"Store {secret}?", {"answer": str})}, "Waiting")
    answer = (ctx.input_responses["confirm"].get("content") or {}).get("answer")
    return {"secret": secret, "answer": answer}
