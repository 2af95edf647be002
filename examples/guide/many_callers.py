"""The examples of docs/many-callers.md, run by tests/test_docs_many_callers.py.

    MCP_TASKS_IDEMPOTENCY_SECRET=$(openssl rand -base64 48) MCP_TASKS_QUOTA_CREATIONS=100 \
        celery-mcp-tasks dev examples.guide.many_callers
"""

from __future__ import annotations

# --8<-- [start:app]
from celery_mcp_tasks import McpTasks

tasks = McpTasks("shop")  # MCP_TASKS_QUOTA_* and MCP_TASKS_IDEMPOTENCY_SECRET come from the environment
celery = tasks.celery  # for `celery -A examples.guide.many_callers worker`


@tasks.mcp_task(idempotency_key=lambda arguments: arguments["order_id"])
def charge(order_id: str, cents: int) -> str:
    """Charge an order: once, however often the call is retried."""
    return f"charged {cents} cents for {order_id}"


@tasks.mcp_task(max_active=2)
def export(report: str) -> str:
    """Build a report; each caller may have two unfinished at a time."""
    return f"{report}.csv"


# --8<-- [end:app]

# --8<-- [start:client]
from mcp import Client  # noqa: E402 - the page shows the client apart from the app
from mcp.shared.exceptions import MCPError  # noqa: E402

from celery_mcp_tasks.client import TasksClient  # noqa: E402
from celery_mcp_tasks.protocol import IDEMPOTENCY_META_KEY, QUOTA_EXCEEDED  # noqa: E402

extension = TasksClient()


async def start_export(url: str, request_id: str) -> str | None:
    """Start an export. Call it again with the same `request_id` (after a timeout, a dropped
    connection, a crash) and you get the same task back, not a second export."""
    async with Client(url, extensions=[extension]) as client:
        handle = await extension.start(client, "export", {"report": "sales"}, meta={IDEMPOTENCY_META_KEY: request_id})
        return handle.id


async def export_when_allowed(url: str) -> float | None:
    """Start an export, or say in how many seconds the server will take one again."""
    async with Client(url, extensions=[extension]) as client:
        try:
            await extension.start(client, "export", {"report": "sales"})
        except MCPError as exc:
            if exc.code != QUOTA_EXCEEDED:
                raise
            retry_after_ms = exc.data["retryAfterMs"]  # None: once one of your tasks has finished
            return None if retry_after_ms is None else retry_after_ms / 1000
        return 0.0


# --8<-- [end:client]
