"""An app whose web processes were upgraded before its workers: `added` exists only where UPGRADE_APP_ADDED=1."""

import os

from celery_mcp_tasks import McpTasks

tasks = McpTasks("upgrade")
celery = tasks.celery


@tasks.mcp_task
def kept() -> str:
    """In every release."""
    return "kept"


if os.environ.get("UPGRADE_APP_ADDED") == "1":

    @tasks.mcp_task
    def added(note: str = "") -> str:
        """Only in the newer release."""
        return f"added {note}"
