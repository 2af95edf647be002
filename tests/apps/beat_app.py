"""A user's app that replaces the whole beat schedule after configuring Celery.

It must not lose the janitor: `celery -A tests.apps.beat_app beat` still sends it.
"""

from __future__ import annotations

from celery_mcp_tasks import McpTasks

tasks = McpTasks("beat-tests")
celery = tasks.celery


@celery.task(name="user.job")
def user_job() -> str:
    return "ok"


# Assigned after configure: on_after_configure alone would lose the janitor here.
celery.conf.beat_schedule = {"user.job": {"task": "user.job", "schedule": 0.5}}
