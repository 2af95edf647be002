"""What Celery's task trace logs about our jobs: the outcome's fact, never its content.

Celery logs every return value at INFO and puts the arguments in each record's `data`; a tool's result
and arguments are often more sensitive than its ids. For an MCP task's run this filter on Celery's trace
logger drops the return value, hides the arguments, and says how a run without an outcome ended instead
of "succeeded: None". Any other task keeps Celery's lines. It runs while the trace still has the task
pushed, so `current_task.request` is the request the line is about (checked by id).
"""

from __future__ import annotations

import logging
from typing import Any

from celery import current_task

from celery_mcp_tasks.worker.celery_internals import TRACE_LOGGER, trace_templates
from celery_mcp_tasks.worker.job import HIDDEN_ARGS, RUN_END, McpJob, row_key

_HIDDEN = "<not logged>"
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


_installed = False


def install() -> None:
    """Once per process, before the first run of one of our jobs there (`bridge.on_prerun`)."""
    global _installed
    if not _installed:
        logging.getLogger(TRACE_LOGGER).addFilter(JobTraceFilter())
        _installed = True
