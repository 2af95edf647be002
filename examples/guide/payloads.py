"""What "Payload limits and encryption" (docs/payloads.md) shows: a tool with payload limits of its own."""

# --8<-- [start:limits]
from celery_mcp_tasks import McpTasks

tasks = McpTasks("reports")
celery = tasks.celery


@tasks.mcp_task(max_arguments_bytes=64 * 1024, max_result_bytes=256 * 1024)
def summarize(text: str) -> str:
    """Summarize up to 64 KiB of text."""
    return text[:200]


# --8<-- [end:limits]
