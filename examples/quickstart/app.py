"""The README's app: one tool that takes a few seconds, run as an MCP task.

celery-mcp-tasks dev examples.quickstart.app      # web + worker, SQLite, no servers
celery -A examples.quickstart.app worker          # or run the pieces yourself
celery-mcp-tasks serve examples.quickstart.app
"""

import time

from celery_mcp_tasks import McpTasks, TaskContext

tasks = McpTasks("quickstart")
celery = tasks.celery  # what `celery -A examples.quickstart.app worker` finds


@tasks.mcp_task
def write_report(topic: str, ctx: TaskContext, sections: int = 3) -> str:
    """Write a short report on a topic, one section at a time."""
    time.sleep(1)  # read up on the topic (the task says "Started" meanwhile)
    for n in range(1, sections + 1):
        ctx.progress(f"Writing section {n} of {sections}", current=n - 1, total=sections)
        time.sleep(1)
    return f"A {sections}-section report on {topic}."
