"""The client side: the Tasks extension for the official SDK's `Client`.

    from mcp import Client
    from celery_mcp_tasks.client import TasksClient

    async with Client("http://127.0.0.1:8000/mcp", extensions=[TasksClient()]) as client:
        result = await client.call_tool("write_report", {"topic": "tides"})

It imports the SDK's client side and the shared wire constants only: no
server code, no Celery, no SQLAlchemy.
"""

from celery_mcp_tasks.client.calls import InputNotAnswered, TaskCancelled, TaskFailed, TaskNotFound
from celery_mcp_tasks.client.extension import TasksClient
from celery_mcp_tasks.client.handle import TaskHandle
from celery_mcp_tasks.client.models import CreateTaskResult, TaskState

__all__ = [
    "CreateTaskResult",
    "InputNotAnswered",
    "TaskCancelled",
    "TaskFailed",
    "TaskHandle",
    "TaskNotFound",
    "TaskState",
    "TasksClient",
]
