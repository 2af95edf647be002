"""The signal bridge: Celery outcomes become task states.

success -> `completed` with the CallToolResult; failure (an exception in the
body, or the worker process lost) -> `failed` with -32603; a retry keeps the
task `working` and says which attempt is next; a revoke after our own cancel
is a no-op (the store already says `cancelled`), any other revoke fails the
task. Every write is a compare-and-swap that refuses to leave a final state,
so signals that arrive late or out of order never move a task backwards.

Celery swallows exceptions raised in signal handlers; ours log them loudly.
"""

from __future__ import annotations

import logging
from typing import Any

from celery import signals

from celery_mcp_tasks.model import TerminalTask
from celery_mcp_tasks.service import internal_error
from celery_mcp_tasks.store.base import TaskNotFound
from celery_mcp_tasks.worker.job import McpJob, row_key

logger = logging.getLogger("celery_mcp_tasks.worker")

_MAX_MESSAGE = 500
_installed = False


def _ours(sender: Any) -> bool:
    return isinstance(sender, McpJob)


def _settle(sender: McpJob, key: str, what: str, op: Any) -> None:
    try:
        op(sender.mcp_runtime.service())
    except (TerminalTask, TaskNotFound):
        logger.debug("tool %r: %s ignored, task already final or gone", sender.mcp_tool.name, what)
    except Exception:
        logger.exception("tool %r: could not record %s; the reaper will settle the task", sender.mcp_tool.name, what)


def describe_failure(exc: BaseException | None) -> str:
    if exc is None:
        return "Job failed"
    text = str(exc).strip()
    name = type(exc).__name__
    message = f"Job failed: {name}: {text}" if text else f"Job failed: {name}"
    return message[:_MAX_MESSAGE]


def on_success(sender: Any = None, result: Any = None, **_: Any) -> None:
    if not _ours(sender) or result is None:
        return
    key = row_key(sender.request)
    if key is None:
        return
    _settle(sender, key, "completion", lambda s: s.complete(key, result))


def on_failure(sender: Any = None, exception: BaseException | None = None, **_: Any) -> None:
    if not _ours(sender):
        return
    key = row_key(sender.request)
    if key is None:
        return
    message = describe_failure(exception)
    _settle(sender, key, "failure", lambda s: s.fail(key, internal_error(message), message))


def on_retry(sender: Any = None, request: Any = None, reason: Any = None, **_: Any) -> None:
    if not _ours(sender):
        return
    key = row_key(request)
    if key is None:
        return
    attempt = (getattr(request, "retries", 0) or 0) + 2
    message = f"Retrying (attempt {attempt})"
    _settle(sender, key, "retry", lambda s: s.progress(key, message))


def on_revoked(sender: Any = None, request: Any = None, terminated: bool = False, expired: bool = False,
               **_: Any) -> None:
    if not _ours(sender):
        return
    key = row_key(request)
    if key is None:
        return
    message = "The job expired before a worker ran it" if expired else "The job was revoked in Celery"
    _settle(sender, key, "revoke", lambda s: s.fail(key, internal_error(message), message))


def install() -> None:
    """Connect the bridge once per process (worker main process and pool children alike)."""
    global _installed
    if _installed:
        return
    signals.task_success.connect(on_success, weak=False)
    signals.task_failure.connect(on_failure, weak=False)
    signals.task_retry.connect(on_retry, weak=False)
    signals.task_revoked.connect(on_revoked, weak=False)
    _installed = True
