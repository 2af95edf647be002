"""What Celery logs about our jobs: the outcome's fact, never its content.

Celery logs every return value at INFO and puts the arguments in each record's `data`; a tool's result
and arguments are often more sensitive than its ids. For an MCP task's run this filter on Celery's trace
logger drops the return value, hides the arguments, and says how a run without an outcome ended instead
of "succeeded: None". Any other task keeps Celery's lines. It runs while the trace still has the task
pushed, so `current_task.request` is the request the line is about (checked by id).

A worker that gets a message of a task it does not have logs the message's body and headers whole
(the arguments, and the task's record our header carries): for one of our jobs the consumer's filter
leaves them out and keeps the rest of the line (the task's name, its Celery id, the delivery info).
"""

from __future__ import annotations

import logging
from typing import Any

from celery import current_task

from celery_mcp_tasks.worker.celery_internals import (
    CONSUMER_LOGGER,
    TRACE_LOGGER,
    trace_templates,
    unknown_task_template,
)
from celery_mcp_tasks.worker.job import HIDDEN_ARGS, RUN_END, McpJob, row_key

_HIDDEN = "<not logged>"
_MAX_EXC = 500
"""How much of a failed run's exception (its repr) the line shows."""
SUCCEEDED = "Task %(name)s[%(id)s] succeeded in %(runtime)ss"
ENDED = "Task %(name)s[%(id)s] ended its run in %(runtime)ss: %(run_end)s"


class JobTraceFilter(logging.Filter):
    def __init__(self) -> None:
        super().__init__()
        self._succeeded = trace_templates()["succeeded"]

    def filter(self, record: logging.LogRecord) -> bool:
        context = record.args
        if not isinstance(context, dict) or "id" not in context:
            return True
        # The proxy forwards isinstance (None outside a task); a run of an MCP task carries our row-key header.
        request = current_task.request if isinstance(current_task, McpJob) else None
        if getattr(request, "id", None) != context["id"] or row_key(request) is None:
            return True
        scrubbed: dict[str, Any] = dict(context)
        for field in ("args", "kwargs"):
            if field in scrubbed:
                scrubbed[field] = HIDDEN_ARGS[f"{field}repr"]
        said = scrubbed.get("exc")
        if isinstance(said, str) and len(said) > _MAX_EXC:  # an MCPError's repr carries its data whole
            scrubbed["exc"] = said[:_MAX_EXC] + "…"
        if record.msg == self._succeeded:
            scrubbed["return_value"] = _HIDDEN
            run_end = getattr(request, RUN_END, None)
            if run_end is not None:
                scrubbed["run_end"] = run_end
                record.msg = ENDED
            else:
                record.msg = SUCCEEDED
        record.args = scrubbed
        if isinstance(getattr(record, "data", None), dict):
            record.data = scrubbed  # what custom (e.g. JSON) handlers read
        return True


_KEPT_HEADERS = ("id", "task", "shadow", "retries")
"""What the dropped-message line keeps of one of our jobs' headers: Celery's names for it, nothing of the task."""


class DroppedJobFilter(logging.Filter):
    """On the consumer's logger: the line for a message of a task the worker does not have, for one of our
    jobs, without the message's body (the arguments) and with only Celery's own headers."""

    def __init__(self) -> None:
        super().__init__()
        self._template = unknown_task_template()

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if record.msg != self._template or not isinstance(args, tuple) or len(args) < 3:
            return True
        headers = args[2]
        if not isinstance(headers, dict) or row_key(headers) is None:
            return True
        kept = {name: headers[name] for name in _KEPT_HEADERS if name in headers}
        record.args = (args[0], "<an MCP task's arguments are not logged>", kept, *args[3:])
        return True


def install_consumer() -> None:
    """Once per worker main process, at the worker's start (`bridge`): never at import or construction."""
    global _consumer_installed
    if not _consumer_installed:
        logging.getLogger(CONSUMER_LOGGER).addFilter(DroppedJobFilter())
        _consumer_installed = True


_consumer_installed = False
_installed = False


def install() -> None:
    """Once per process, before the first run of one of our jobs there (`bridge.on_prerun`)."""
    global _installed
    if not _installed:
        logging.getLogger(TRACE_LOGGER).addFilter(JobTraceFilter())
        _installed = True
