"""Operations, each an opt-in plugin: metrics, traces, health and readiness, structured logs; and the doctor.

They read the domain and never change it; each failure (an exporter down, a
collector unreachable, a store that hangs during a scrape) degrades to a log
line and a metric, never to a failed request or job. None is on until the
application lists it (`McpTasks(..., plugins=[Prometheus(), Health()])`) or a
setting turns it on (`celery_mcp_tasks.plugin.plugins_from_settings`). Each is
imported here on first use only.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["Health", "JanitorWatcher", "Logs", "Prometheus", "Tracing"]

_WHERE = {
    "Health": "celery_mcp_tasks.ops.health",
    "JanitorWatcher": "celery_mcp_tasks.ops.janitor_watch",
    "Logs": "celery_mcp_tasks.ops.logs",
    "Prometheus": "celery_mcp_tasks.ops.metrics",
    "Tracing": "celery_mcp_tasks.ops.tracing",
}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
