"""The Celery side of a task tool: the job class every `@mcp_task` becomes.

A job is a normal Celery task: `.delay(...)` runs the function with a
detached context. When the message carries our row-key header it is an MCP
task: the body is skipped if the task is already final (cancelled before it
started, or a duplicate delivery), the stored arguments are validated the
way the SDK would, the function runs with a live `TaskContext`, and the
return value becomes the CallToolResult. Recording the outcome is the signal
bridge's job (`worker.bridge`), so every path through Celery, including a
worker killed mid-job, ends in the store.
"""

from __future__ import annotations

import contextvars
import logging
import threading
from collections.abc import Callable
from typing import Any, Protocol

from celery import Task
from mcp.server.mcpserver.exceptions import ToolError

from celery_mcp_tasks.context import InputRequested, TaskContext
from celery_mcp_tasks.model import TaskStatus, TerminalTask
from celery_mcp_tasks.service import TaskService
from celery_mcp_tasks.toolspec import TaskTool

logger = logging.getLogger("celery_mcp_tasks.worker")

KEY_HEADER = "mcp_task_key"
"""Celery message header carrying the row key (a hash; never the task id)."""
DISPATCH_HEADER = "mcp_task_dispatch"
"""Which dispatch of the task this message is; an older message than the row's is superseded."""

_current: contextvars.ContextVar[TaskContext | None] = contextvars.ContextVar("mcp_task_context", default=None)


class WorkerRuntime(Protocol):
    heartbeat_interval_s: float

    def service(self) -> TaskService: ...


def row_key(request: Any) -> str | None:
    """Our header from a Celery request context, a request dict, or None."""
    if request is None:
        return None
    if isinstance(request, dict):
        return request.get(KEY_HEADER) or (request.get("headers") or {}).get(KEY_HEADER)
    return getattr(request, KEY_HEADER, None) or (getattr(request, "headers", None) or {}).get(KEY_HEADER)


def dispatch_number(request: Any) -> int | None:
    value = getattr(request, DISPATCH_HEADER, None) or (getattr(request, "headers", None) or {}).get(DISPATCH_HEADER)
    return int(value) if value is not None else None


def current_context() -> TaskContext:
    return _current.get() or TaskContext.detached()


class _Heartbeat:
    """Marks the task alive while its job runs, so the janitor's reaper can tell a dead job."""

    def __init__(self, beat: Callable[[], Any], interval: float) -> None:
        self._beat = beat
        self._interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="mcp-task-heartbeat", daemon=True)

    def __enter__(self) -> _Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *_: Any) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                self._beat()
            except TerminalTask:
                return
            except Exception:  # a missed beat is only a later reap; never kill the job for it
                logger.warning("task heartbeat failed; will retry", exc_info=True)


class McpJob(Task):
    """Base class of every `@mcp_task` job."""

    mcp_tool: TaskTool
    mcp_runtime: WorkerRuntime
    typing = True

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        key = row_key(self.request)
        if key is None:
            return super().__call__(*args, **kwargs)
        return self._run_for_task(key)

    def _run_for_task(self, key: str) -> dict[str, Any] | None:
        service = self.mcp_runtime.service()
        record = service.status(key)
        if record is None or record.status is not TaskStatus.WORKING:
            # Cancelled before it started, evicted, or a late duplicate delivery.
            logger.info("job for tool %r skipped: its task is not working", self.mcp_tool.name)
            return None
        dispatch = dispatch_number(self.request)
        if dispatch is not None and dispatch != record.dispatches:
            logger.info("job for tool %r skipped: superseded by a newer dispatch", self.mcp_tool.name)
            return None
        ctx = TaskContext(service, key, record=record, attempt=self.request.retries or 0)
        token = _current.set(ctx)
        try:
            with _Heartbeat(lambda: service.heartbeat(key), self.mcp_runtime.heartbeat_interval_s):
                value = self.mcp_tool.call(record.arguments, ctx)
        except ToolError as exc:
            # As a synchronous MCP tool: a deliberate tool error is a result with isError.
            return {"content": [{"type": "text", "text": str(exc)}], "isError": True}
        except InputRequested:
            return None
        except TerminalTask:
            logger.info("job for tool %r stopped: its task was settled elsewhere", self.mcp_tool.name)
            return None
        finally:
            _current.reset(token)
        return self.mcp_tool.to_result(value)


def make_run(tool: TaskTool) -> Callable[..., Any]:
    """The Celery `run` for a tool: the user's function with the context injected."""
    fn = tool.fn

    def run(*args: Any, **kwargs: Any) -> Any:
        if tool.context_param is not None:
            kwargs[tool.context_param] = current_context()
        return fn(*args, **kwargs)

    run.__name__ = fn.__name__
    run.__qualname__ = fn.__qualname__
    run.__module__ = fn.__module__
    run.__doc__ = fn.__doc__
    run.__signature__ = tool.schema_function().__signature__  # type: ignore[attr-defined]
    return run
