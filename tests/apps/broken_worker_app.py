"""An app whose web side loads but whose worker cannot start: `dev` must say so and exit non-zero."""

from celery_mcp_tasks import McpTasks

tasks = McpTasks("broken-worker")
celery = tasks.celery
celery.conf.imports = ("tests.apps.module_that_does_not_exist",)  # imported by the worker at start only


@tasks.mcp_task
def never_runs() -> str:
    """Never reached: no worker ever starts."""
    return "unreachable"
