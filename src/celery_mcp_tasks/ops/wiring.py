"""Where the composition root hands an `McpTasks` to each operations concern, in one order.

Each `install` only registers (routes, Celery signals, observers): nothing
connects to a database, a broker or a collector here, so importing an app
stays cheap and a process that never serves or works pays nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from celery_mcp_tasks.app import McpTasks


def install_operations(tasks: McpTasks) -> None:
    # Filled in by each concern as it lands: logs, metrics, tracing, health, janitor watch.
    return None
