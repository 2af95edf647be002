"""`TaskContext`: what a job sees of its task.

It talks to the store through the service, never to Celery, so the same
handle drives a task from inside a Celery job, from a webhook that finishes
work elsewhere, or from a test. After a final state every write raises
`TerminalTask`; inside a job that simply ends the run (the worker treats it
as "the task was settled elsewhere", e.g. cancelled).
"""

from __future__ import annotations

import time
from typing import Any, NoReturn

from celery_mcp_tasks.inputs import validate_input_requests
from celery_mcp_tasks.model import TaskRecord, TaskStatus, TerminalTask
from celery_mcp_tasks.service import TaskService, internal_error

__all__ = ["InputRequested", "TaskContext", "TerminalTask"]


class InputRequested(BaseException):
    """Ends the current run: the task now waits in `input_required`.

    A `BaseException` on purpose, like `GeneratorExit`: it is control flow, and
    a job's own `except Exception` must not swallow it.
    """


class TaskContext:
    """The job's handle on its task. Cheap to create; holds only the row key."""

    #: How long `cancelled()` may answer from its last read (keeps tight loops cheap).
    cancel_check_interval: float = 0.05

    def __init__(self, service: TaskService | None, key: str | None, *, record: TaskRecord | None = None,
                 attempt: int = 0) -> None:
        self._service = service
        self._key = key
        self._record = record
        self._checked_at = time.monotonic() if record is not None else 0.0
        self.attempt = attempt

    @classmethod
    def detached(cls) -> TaskContext:
        """For a job called without an MCP task (`.delay()`, a plain call): every report is a no-op."""
        return cls(None, None)

    @property
    def attached(self) -> bool:
        return self._service is not None and self._key is not None

    @property
    def input_responses(self) -> dict[str, Any]:
        """Every answer the client gave so far, by input request key."""
        return dict(self._record.input_responses) if self._record is not None else {}

    def status(self) -> TaskRecord | None:
        """A fresh read of the task (None when detached or evicted)."""
        if not self.attached:
            return None
        assert self._service is not None and self._key is not None
        self._record = self._service.status(self._key) or self._record
        self._checked_at = time.monotonic()
        return self._record

    def cancelled(self) -> bool:
        """True once the client cancelled (or the task ended elsewhere). Safe to call in a loop."""
        if not self.attached:
            return False
        if time.monotonic() - self._checked_at >= self.cancel_check_interval:
            self.status()
        return self._record is None or self._record.status is TaskStatus.CANCELLED

    def progress(self, message: str) -> None:
        """Show `message` as the task's statusMessage. Raises `TerminalTask` once the task is final."""
        self._write(lambda s, k: s.progress(k, message))

    def complete(self, result: dict[str, Any] | str, message: str | None = None) -> None:
        """Finish with a CallToolResult (a str becomes one text block). For work that ends outside a job."""
        if isinstance(result, str):
            result = {"content": [{"type": "text", "text": result}], "isError": False}
        self._write(lambda s, k: s.complete(k, result, message))

    def fail(self, error: dict[str, Any] | str, message: str | None = None) -> None:
        """Fail with a JSON-RPC error (`{"code", "message"}`, or a message for -32603)."""
        if isinstance(error, str):
            error = internal_error(error)
        self._write(lambda s, k: s.fail(k, error, message))

    def require_input(self, requests: dict[str, Any], message: str | None = None) -> NoReturn:
        """Ask the client for input and end this run; the job runs again once every key is answered.

        Keys must be new for this task (a reused key raises `DuplicateInputKeys`).
        """
        checked = validate_input_requests(requests)
        if not self.attached:
            raise RuntimeError("require_input needs an MCP task; this job was called without one")
        self._write(lambda s, k: s.require_input(k, checked, message))
        raise InputRequested()

    def _write(self, op: Any) -> None:
        if not self.attached:
            return
        try:
            self._record = op(self._service, self._key)
        except TerminalTask:
            self._record = self._service.status(self._key) if self._service and self._key else None
            raise
        self._checked_at = time.monotonic()
