"""Task tools using what a Celery user already relies on: a base class of their own, a result backend,
`bind=True` retries in detached runs.

    CELERY_RESULT_BACKEND=redis://... celery -A tests.apps.celery_options_app worker
"""

from __future__ import annotations

import logging
from typing import Any

from celery import Task

from celery_mcp_tasks import McpTasks, TaskContext

tasks = McpTasks("celery-options-tests")
celery = tasks.celery


class Audited(Task):  # type: ignore[misc]  # Celery ships no types
    """A base class of the user's: its hook runs before every run of its jobs."""

    audited = True

    def before_start(self, task_id: str, args: Any, kwargs: Any) -> None:
        logging.getLogger("audit").warning("audited run of %s", self.name)


@tasks.mcp_task(base=Audited)
def double(x: int) -> int:
    """Twice x."""
    return 2 * x


@tasks.mcp_task(bind=True, max_retries=2)
def second_try(self: Any, ctx: TaskContext) -> int:
    """Fails its first attempt, then says which attempt it is."""
    if ctx.attempt == 0:
        raise self.retry(countdown=0)
    return ctx.attempt


@tasks.mcp_task(rate_limit="6/m")
def limited(i: int) -> int:
    """At most one run every ten seconds in a worker: the second call waits in the worker for its slot."""
    return i
