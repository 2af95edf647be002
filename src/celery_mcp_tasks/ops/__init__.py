"""Operations, each an opt-in plugin: metrics, traces, health and readiness, structured logs.

This `__init__` imports none of its modules: each plugin is a "module:Attr" string imported on
first use, so `app.py` can ask for the plugins the settings turn on without importing any.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from celery_mcp_tasks.config import Settings
    from celery_mcp_tasks.plugin import Plugin

__all__ = ["Health", "JanitorWatcher", "Logs", "Prometheus", "Tracing"]  # what a user lists; the rest is the app's

BUILT_IN: dict[str, str] = {
    "Health": "celery_mcp_tasks.ops.health:Health",
    "JanitorWatcher": "celery_mcp_tasks.ops.janitor_watch:JanitorWatcher",
    "Logs": "celery_mcp_tasks.ops.logs:Logs",
    "Prometheus": "celery_mcp_tasks.ops.metrics:Prometheus",
    "Tracing": "celery_mcp_tasks.ops.tracing:Tracing",
}


def _load(name: str) -> Any:
    module, _, attribute = BUILT_IN[name].partition(":")
    return getattr(importlib.import_module(module), attribute)


def __getattr__(name: str) -> Any:
    if name in BUILT_IN:
        return _load(name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def plugins_from_settings(settings: Settings) -> list[Plugin]:
    """The built-in plugins the settings turn on, in the order they install (logs first: they style what follows)."""
    found: list[Plugin] = []
    if settings.log_format == "json":
        found.append(_load("Logs")(json=True))
    if settings.tracing != "off":
        found.append(_load("Tracing")(exporter=None if settings.tracing == "on" else settings.tracing))
    if settings.health:
        found.append(_load("Health")())
    if settings.metrics:
        found.append(_load("Prometheus")())
    if settings.janitor_watch:
        found.append(_load("JanitorWatcher")())
    return found
