"""An app module that forgot `celery = tasks.celery`: `celery -A` cannot find its worker app."""

from celery_mcp_tasks import McpTasks

jobs = McpTasks("no-celery-attribute")


@jobs.mcp_task
def noop() -> str:
    """Does nothing."""
    return "ok"
