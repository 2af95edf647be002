"""Where the composition root hands an `McpTasks` to each operations concern, in one order.

Each `install` only registers (routes, Celery signals, observers): nothing
connects to a database, a broker or a collector here, so importing an app
stays cheap and a process that never serves or works pays nothing. A concern
refuses a setting with `ConfigError` (e.g. MCP_TASKS_TRACING=otlp without the
otel extra); like a bad setting in `McpTasks`'s own `_settings_from_env`, it
stops the process with that one line, not `celery -A`'s traceback around it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from celery_mcp_tasks.config import ConfigError
from celery_mcp_tasks.ops import health, janitor_watch, logs, metrics, tracing

if TYPE_CHECKING:
    from celery_mcp_tasks.app import McpTasks


def install_operations(tasks: McpTasks) -> None:
    try:
        _install_each(tasks)
    except ConfigError as exc:
        raise SystemExit(f"celery-mcp-tasks: configuration error: {exc}") from None


def _install_each(tasks: McpTasks) -> None:
    # Filled in by each concern as it lands: logs, metrics, tracing, health, janitor watch.
    logs.install(tasks)  # first: JSON lines and the lifecycle events before anything logs
    tracing.install(tasks)  # spans for each task's creation, sends and runs; a provider if MCP_TASKS_TRACING asks
    health.install(tasks)  # /healthz and /readyz
    metrics.install(tasks)  # /metrics, the task observer, the worker's multiprocess exporter
    janitor_watch.install(tasks)  # the web process warns when nobody sweeps
    return None
