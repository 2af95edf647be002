"""Where the composition root hands an `McpTasks` to each operations concern, in one order.

Each `install` only registers (routes, Celery signals, observers): nothing
connects to a database, a broker or a collector here, so importing an app
stays cheap and a process that never serves or works pays nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from celery_mcp_tasks.ops import health, janitor_watch, logs, metrics, tracing

if TYPE_CHECKING:
    from celery_mcp_tasks.app import McpTasks


def install_operations(tasks: McpTasks) -> None:
    # Filled in by each concern as it lands: logs, metrics, tracing, health, janitor watch.
    logs.install(tasks)  # first: JSON lines and the lifecycle events before anything logs
    tracing.install(tasks)  # spans for each task's creation, sends and runs; a provider if MCP_TASKS_TRACING asks
    health.install(tasks)  # /healthz and /readyz
    metrics.install(tasks)  # /metrics, the task observer, the worker's multiprocess exporter
    janitor_watch.install(tasks)  # the web process warns when nobody sweeps
    return None
