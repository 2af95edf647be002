"""The service's `Dispatcher` on Celery: sends a committed dispatch, revokes a cancelled job.

The message id derives from the row key and the dispatch number (a cancel can revoke it without storing
more); the row key rides in a header, which survives retries and redelivery and reaches every signal.
Neither holds the MCP task id. The message is shadowed with the tool's name (what logs and Flower show).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from celery import Celery
from kombu.exceptions import OperationalError

from celery_mcp_tasks.config import redact_url
from celery_mcp_tasks.model import TaskRecord, celery_message_id
from celery_mcp_tasks.ops.propagation import sending
from celery_mcp_tasks.worker.fairness import routed_queue, shard_queue
from celery_mcp_tasks.worker.job import DISPATCH_HEADER, HIDDEN_ARGS, KEY_HEADER, RECORD_HEADER, JobTool, record_header
from celery_mcp_tasks.worker.revoker import BackgroundRevoker, warn_unless_pool_terminates

logger = logging.getLogger("celery_mcp_tasks.worker")

# Fail fast when the broker is down: the caller is an HTTP request, and the task
# is marked failed (readable by the client) instead of hanging.
_RETRY_POLICY = {"max_retries": 2, "interval_start": 0, "interval_step": 0.2, "interval_max": 0.5}


def celery_id(record: TaskRecord) -> str:
    """The Celery message id of the record's current dispatch (`model.celery_message_id`)."""
    return celery_message_id(record.key, record.dispatches)


def message_headers(record: TaskRecord, *, with_arguments: bool = True) -> dict[str, Any]:
    """The headers of the message sending `record`'s dispatch: the row key, the dispatch, and the record the
    job's claim is computed on (`job.RECORD_HEADER`, when it carries no payload besides the arguments, and
    the message carries those: without them the job reads the row, so a carried record would be no use)."""
    headers: dict[str, Any] = {KEY_HEADER: record.key, DISPATCH_HEADER: record.dispatches}
    carried = record_header(record) if with_arguments else None
    if carried is not None:
        headers[RECORD_HEADER] = carried
    return headers


class CeleryDispatcher:
    def __init__(
        self,
        app: Celery,
        tools: Mapping[str, JobTool],
        *,
        revoker: BackgroundRevoker | None = None,
        fair_queues: int | None = None,
        send_arguments: bool = True,
    ) -> None:
        self.app = app
        self.tools = tools
        self.fair_queues = fair_queues  # shards of the default queue, by owner (`worker.fairness`); None: off
        self._sharded: dict[str, bool] = {}
        self.send_arguments = send_arguments  # False (encryption at rest): the job reads them from the row
        self.revoker = revoker or BackgroundRevoker(app)
        warn_unless_pool_terminates(app, lambda: sorted(t.name for t in self.tools.values() if t.terminate))

    def send(self, record: TaskRecord) -> None:
        tool = self.tools[record.tool]
        headers = message_headers(record, with_arguments=self.send_arguments)
        route: dict[str, Any] = {}
        if self.fair_queues is not None and self._on_default_queue(tool.celery_name):
            route["queue"] = shard_queue(str(self.app.conf.task_default_queue), record.owner, self.fair_queues)
        try:
            with sending(record.trace_context, headers):  # the task's trace context, in the message headers
                self.app.send_task(
                    tool.celery_name,
                    kwargs=record.arguments if self.send_arguments else {},
                    task_id=celery_id(record),
                    headers=headers,
                    shadow=tool.name,
                    **HIDDEN_ARGS,  # what worker logs and events show instead of the arguments
                    retry=True,
                    retry_policy=_RETRY_POLICY,
                    **route,
                )
        except OperationalError as exc:  # the broker is down or refuses us: say which, and what to do
            logger.error(
                "cannot reach the broker %s (%s); the task fails as not enqueued: start the broker or fix "
                "CELERY_BROKER_URL",
                redact_url(str(self.app.conf.broker_url)),
                str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__,
            )
            raise

    def _on_default_queue(self, celery_name: str) -> bool:
        """Whether the job goes to the default queue (then it is sharded); decided once per tool."""
        sharded = self._sharded.get(celery_name)
        if sharded is None:
            sharded = self._sharded[celery_name] = routed_queue(self.app, celery_name) == str(
                self.app.conf.task_default_queue
            )
        return sharded

    def revoke(self, record: TaskRecord) -> None:
        """Terminate the cancelled task's running job, best effort (`worker.revoker`), when its tool has
        `terminate=True`: any other job checks `ctx.cancelled()`, and a message not yet started is skipped
        at its start anyway, so a broadcast would buy nothing."""
        tool = self.tools.get(record.tool)
        if tool is not None and tool.terminate:
            self.revoker.submit(celery_id(record), tool.name, terminate=True)
