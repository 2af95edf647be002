"""Writing task tools, "Your Celery app" (docs/writing-tools.md): task tools joining an app you already run.

celery -A examples.guide.existing_app worker -Q celery,mcp
celery-mcp-tasks serve examples.guide.existing_app
celery-mcp-tasks dev examples.guide.existing_app --call double '{"x": 21}'    # dev consumes both queues
"""

# --8<-- [start:existing]
from celery import Celery

from celery_mcp_tasks import McpTasks, TaskContext

app = Celery("proj")  # your Celery app, configured as it is today: broker, queues, routes
app.conf.task_routes = {"*.double": {"queue": "mcp"}}  # task tools are routed like any task

tasks = McpTasks("proj", celery=app)  # the task tools join it; nothing else of it changes


@app.task
def plain(x: int) -> int:  # your existing tasks stay as they are
    return x * 2


@tasks.mcp_task  # Celery's task options work too: @tasks.mcp_task(autoretry_for=..., ...)
def double(x: int, ctx: TaskContext) -> int:
    """Double a number."""
    ctx.progress("Doubling")
    return plain(x)  # a task called directly runs here, in this job


# --8<-- [end:existing]
