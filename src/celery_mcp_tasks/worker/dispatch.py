"""Sending jobs: the `Dispatcher` the service calls after a row is committed.

The Celery message gets its own id (derived from the row key and the dispatch
number, so a cancel can revoke it without storing anything more); the row key
travels in a header, which survives retries and redelivery and reaches every
signal. Neither the id nor the body holds the MCP task id. The message is
shadowed with the tool's name, which is what worker logs, `celery events` and
Flower show.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping

from celery import Celery

from celery_mcp_tasks.model import TaskRecord
from celery_mcp_tasks.worker.job import DISPATCH_HEADER, HIDDEN_ARGS, KEY_HEADER, JobTool

logger = logging.getLogger("celery_mcp_tasks.worker")

_NAMESPACE = uuid.UUID("4f0b5a8e-9c1d-4e57-8a43-6d2c1e0f7b19")
# Fail fast when the broker is down: the caller is an HTTP request, and the task
# is marked failed (readable by the client) instead of hanging.
_RETRY_POLICY = {"max_retries": 2, "interval_start": 0, "interval_step": 0.2, "interval_max": 0.5}


def celery_id(record: TaskRecord) -> str:
    return str(uuid.uuid5(_NAMESPACE, f"{record.key}:{record.dispatches}"))


class CeleryDispatcher:
    def __init__(self, app: Celery, tools: Mapping[str, JobTool]) -> None:
        self.app = app
        self.tools = tools

    def __call__(self, record: TaskRecord) -> None:
        tool = self.tools[record.tool]
        self.app.send_task(
            tool.celery_name,
            kwargs=record.arguments,
            task_id=celery_id(record),
            headers={KEY_HEADER: record.key, DISPATCH_HEADER: record.dispatches},
            shadow=tool.name,
            **HIDDEN_ARGS,  # what worker logs and events show instead of the arguments
            retry=True,
            retry_policy=_RETRY_POLICY,
        )

    def revoke(self, record: TaskRecord, *, terminate: bool | None = None) -> None:
        """Best effort: a revoke is lost when no worker is up; the store's cancel is what counts.

        `terminate` (default: the tool's `terminate=` option) also kills a running
        job's pool process with SIGTERM; only prefork pools honour it.
        """
        tool = self.tools.get(record.tool)
        if terminate is None:
            terminate = tool.terminate if tool is not None else False
        try:
            self.app.control.revoke(celery_id(record), terminate=terminate, signal="SIGTERM")
        except Exception as exc:  # best effort by design
            logger.info("revoke not delivered for tool %r: %s", record.tool, type(exc).__name__)
