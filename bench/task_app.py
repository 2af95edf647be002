"""Ours in bench/bench_task.py: a no-op task tool, served and run as a user runs it.

    celery-mcp-tasks serve bench.task_app      celery -A bench.task_app worker      celery-mcp-tasks dev bench.task_app

BENCH_MAX_STREAMS raises the listen handler's per-process stream bound (`--streams`).
"""

from __future__ import annotations

import os

from celery_mcp_tasks import McpTasks
from celery_mcp_tasks.app import internals

tasks = McpTasks("bench-task")
celery = tasks.celery

listen = internals(tasks).listen
if os.environ.get("BENCH_MAX_STREAMS") and listen is not None:
    listen.max_streams = int(os.environ["BENCH_MAX_STREAMS"])


@tasks.mcp_task
def noop(n: int = 0) -> str:
    """Does nothing: what is measured is the runtime around it."""
    return "ok"
