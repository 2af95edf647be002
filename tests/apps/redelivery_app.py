"""A job that counts how often its body runs, on a Redis broker that redelivers within a second or two.

    celery -A tests.apps.redelivery_app worker

kombu's Redis transport hands an unacknowledged message out again once it is
older than `visibility_timeout` (normally an hour); here one second, checked every
second, so a job that runs longer is delivered a second time while it runs.
"""

from __future__ import annotations

import os
import time

from celery_mcp_tasks import McpTasks, TaskContext

tasks = McpTasks("redelivery-tests")
celery = tasks.celery
celery.conf.broker_transport_options = {
    "visibility_timeout": 1,
    "unacked_restore_interval": 1,
    "unacked_restore_throttle": 1,
}


@tasks.mcp_task
def counted(seconds: float, marker: str, ctx: TaskContext) -> str:
    """Appends its pool process id to `marker` when its body starts, then works for `seconds`."""
    with open(marker, "a") as runs:
        runs.write(f"{os.getpid()}\n")
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not ctx.cancelled():
        time.sleep(0.1)
    return f"ran in pid={os.getpid()}"
