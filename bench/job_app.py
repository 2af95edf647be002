"""Benchmark app: a no-op task tool and the same no-op as a plain Celery task.

The plain task keeps its result in Celery's database result backend on the
same database as the store, so both report completion with one row write.
"""

from celery_mcp_tasks import McpTasks
from celery_mcp_tasks.store.engine import normalize_url

tasks = McpTasks("bench-jobs")
celery = tasks.celery
celery.conf.result_backend = "db+" + normalize_url(tasks.settings.store_url)


@tasks.mcp_task
def noop() -> str:
    """Does nothing: what is left is the runtime's own cost."""
    return "ok"


@celery.task(name="bench.plain_noop", ignore_result=False)
def plain_noop() -> str:
    return "ok"
