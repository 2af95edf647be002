"""Benchmark app: a task tool, and a baseline tool that only sends the same Celery message."""

from celery_mcp_tasks import McpTasks

tasks = McpTasks("bench-create")
celery = tasks.celery


@tasks.mcp_task
def noop(n: int = 0) -> str:
    """Does nothing (the benchmark measures creation, not execution)."""
    return "ok"


@tasks.server.tool()
def enqueue_only(n: int = 0) -> str:
    """Baseline: publish the Celery message a task would get, store nothing, answer at once."""
    tasks.celery.send_task(tasks.tools["noop"].celery_name, kwargs={"n": n})
    return "sent"
