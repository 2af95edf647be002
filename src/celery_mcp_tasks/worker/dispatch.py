"""The service's `Dispatcher` on Celery: sends a committed dispatch, revokes a cancelled job.

The message id derives from the row key and the dispatch number (a cancel can revoke it without storing
more); the row key rides in a header, which survives retries and redelivery and reaches every signal.
Neither holds the MCP task id. The message is shadowed with the tool's name (what logs and Flower show).

Revokes go off the request path: `tasks/cancel` must answer at once whatever the broker does, and Celery's
`control.revoke` retries a lost broker forever (kombu's default policy): on request threads an outage
would hold them all. So a revoke is only queued (dropped with a log line when too many wait); one thread
publishes what is pending as one broadcast on its own connection, with a few short retries, and gives up
after a few seconds. The store's cancel has happened before: a revoke only stops a running job sooner.
Tools' names in logs, never ids.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from amqp.exceptions import AccessRefused
from amqp.exceptions import ConnectionError as AmqpConnectionError
from celery import Celery, signals
from kombu.exceptions import OperationalError

from celery_mcp_tasks.config import redact_url
from celery_mcp_tasks.model import TaskRecord, celery_message_id
from celery_mcp_tasks.outage_log import OutageLog
from celery_mcp_tasks.propagation import sending
from celery_mcp_tasks.service import DispatchUnavailable
from celery_mcp_tasks.worker.celery_internals import pool_terminates
from celery_mcp_tasks.worker.fairness import routed_queue, shard_queue
from celery_mcp_tasks.worker.job import (
    BORN_HEADER,
    DISPATCH_HEADER,
    HIDDEN_ARGS,
    KEY_HEADER,
    RECORD_HEADER,
    JobTool,
    record_header,
)
from celery_mcp_tasks.worker.kombu_internals import PIDBOX_LOGGER, bound_publish_retries
from celery_mcp_tasks.worker.termination import start_thread

logger = logging.getLogger("celery_mcp_tasks.worker")

_BROKER_REFUSALS = (OperationalError, AmqpConnectionError, AccessRefused)
"""A send's errors that mean the broker is down or refuses this app: what kombu retried, then gave up on, and
RabbitMQ refusing the login or the vhost (not retried: the AMQP client's own errors reach the caller)."""
# Fail fast when the broker is down: the caller is an HTTP request, and the task
# is marked failed (readable by the client) instead of hanging.
_SEND_RETRY = {"max_retries": 2, "interval_start": 0, "interval_step": 0.2, "interval_max": 0.5}


def message_headers(record: TaskRecord, *, with_arguments: bool = True) -> dict[str, Any]:
    """The headers of the message sending `record`'s dispatch: the row key, the dispatch, its task's creation
    time (`Run.born`), and the record the
    job's claim is computed on (`job.RECORD_HEADER`, when it carries no payload besides the arguments, and
    the message carries those: without them the job reads the row, so a carried record would be no use)."""
    headers: dict[str, Any] = {
        KEY_HEADER: record.key,
        DISPATCH_HEADER: record.dispatches,
        BORN_HEADER: record.created_at,
    }
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
        self._outage = OutageLog(logger, first=logging.ERROR)  # the broker refusing sends: said once an outage
        self._receivers = warn_unless_pool_terminates(
            app,
            lambda: sorted(t.name for t in self.tools.values() if t.terminate),
            lambda: {t.name: _time_limits(app, t.celery_name) for t in self.tools.values()},
        )

    def send(self, record: TaskRecord) -> None:
        tool = self.tools[record.tool]
        headers = message_headers(record, with_arguments=self.send_arguments)
        shard = self._shard(record, tool.celery_name)
        route: dict[str, Any] = {} if shard is None else {"queue": shard}
        try:
            with sending(record.trace_context, headers):  # the task's trace context, in the message headers
                self.app.send_task(
                    tool.celery_name,
                    kwargs=record.arguments if self.send_arguments else {},
                    task_id=celery_message_id(record),
                    headers=headers,
                    shadow=tool.name,
                    ignore_result=True,  # the outcome is the store's; nor does this process await a result
                    **HIDDEN_ARGS,  # what worker logs and events show instead of the arguments
                    retry=True,
                    retry_policy=_SEND_RETRY,
                    **route,
                )
        except _BROKER_REFUSALS as exc:  # the broker is down or refuses us: say which, and what to do (once)
            self._outage.failed(
                "cannot reach the broker %s (%s); the tasks created meanwhile fail as not enqueued: start the "
                "broker or fix CELERY_BROKER_URL",
                redact_url(str(self.app.conf.broker_url)),
                str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__,
            )
            raise DispatchUnavailable(type(exc).__name__) from exc
        if self._outage.failing:  # the line's URL is built only when there is an outage to end
            self._outage.answered("the broker %s takes jobs again", redact_url(str(self.app.conf.broker_url)))

    def queue_of(self, record: TaskRecord) -> str | None:
        """The queue `send` sends `record`'s job to: its routing (`queue=`, `task_routes`), else the default
        queue, or the owner's shard of it with fair queues; None for a route by exchange alone. A router of the
        user's may raise."""
        celery_name = self.tools[record.tool].celery_name
        return self._shard(record, celery_name) or routed_queue(self.app, celery_name)

    def _shard(self, record: TaskRecord, celery_name: str) -> str | None:
        """The shard of the default queue `record`'s job goes to with fair queues (None: its routing decides)."""
        if self.fair_queues is None or not self._on_default_queue(celery_name):
            return None
        return shard_queue(str(self.app.conf.task_default_queue), record.owner, self.fair_queues, record.caller)

    def _on_default_queue(self, celery_name: str) -> bool:
        """Whether the job goes to the default queue (then it is sharded); decided once per tool."""
        sharded = self._sharded.get(celery_name)
        if sharded is None:
            sharded = self._sharded[celery_name] = routed_queue(self.app, celery_name) == str(
                self.app.conf.task_default_queue
            )
        return sharded

    def revoke(self, record: TaskRecord) -> None:
        """Terminate the cancelled task's running job, best effort (`BackgroundRevoker`), when its tool has
        `terminate=True`: any other job checks `ctx.cancelled()`, and a message not yet started is skipped
        at its start anyway, so a broadcast would buy nothing."""
        tool = self.tools.get(record.tool)
        if tool is not None and tool.terminate:
            self.revoker.submit(celery_message_id(record), tool.name, terminate=True)


# -- revokes off the request path -----------------------------------------------------------------

# Connecting: ~0.2 + 0.5 + 0.5 s of pauses between three tries, each try bounded by
# the connect timeout; publishing: two more tries at most. A few seconds in all.
_CONNECT_TIMEOUT_S = 1.0
_REVOKE_RETRY: dict[str, Any] = {"max_retries": 2, "interval_start": 0.2, "interval_step": 0.3, "interval_max": 0.5}
_REVOKE_BATCH = 100

Publish = Callable[[list[str], bool], None]


class BackgroundRevoker:
    """Queues revokes and publishes them from one daemon thread (started on first use, again after a fork)."""

    def __init__(
        self, app: Celery, *, max_pending: int = 1000, deadline_s: float = 3.0, publish: Publish | None = None
    ) -> None:
        self.app = app
        self.max_pending = max_pending
        self.deadline_s = deadline_s
        self._publish = publish or self._broadcast
        self._lock = threading.Lock()
        self._pid: int | None = None
        self._queue: queue.Queue[tuple[str, str, bool]] = queue.Queue(max_pending)

    def submit(self, celery_id: str, tool: str, *, terminate: bool) -> None:
        """Queue one revoke; returns at once."""
        pending = self._started()
        try:
            pending.put_nowait((celery_id, tool, terminate))
        except queue.Full:
            logger.warning("revoke for tool %r dropped: %d revokes already wait for the broker", tool, self.max_pending)

    def _started(self) -> queue.Queue[tuple[str, str, bool]]:
        pid = os.getpid()
        if self._pid != pid:
            with self._lock:
                if self._pid != pid:  # first use, or a forked child: neither the queue nor the thread crossed
                    self._queue = queue.Queue(self.max_pending)
                    start_thread(self._drain, "mcp-task-revoke", (self._queue,))  # never takes a SIGTERM
                    self._pid = pid
        return self._queue

    def _drain(self, pending: queue.Queue[tuple[str, str, bool]]) -> None:
        while True:
            batch = [pending.get()]
            while len(batch) < _REVOKE_BATCH:
                try:
                    batch.append(pending.get_nowait())
                except queue.Empty:
                    break
            for terminate in (True, False):
                group = [(celery_id, tool) for celery_id, tool, kill in batch if kill is terminate]
                if group:
                    self._send(group, terminate)

    def _send(self, group: list[tuple[str, str]], terminate: bool) -> None:
        started = time.monotonic()
        try:
            self._publish([celery_id for celery_id, _ in group], terminate)
        except Exception as exc:  # noqa: BLE001 - best effort by design: the task is already cancelled
            tools = ", ".join(sorted({repr(tool) for _, tool in group}))
            logger.warning(
                "revoke of %d job(s) of tool %s given up after %.1fs (%s); the tasks stay cancelled",
                len(group),
                tools,
                time.monotonic() - started,
                type(exc).__name__,
            )

    def _broadcast(self, celery_ids: list[str], terminate: bool) -> None:
        """One `revoke` broadcast for every id, with a bounded retry policy on a connection of its own."""
        with self.app.connection_for_write(connect_timeout=_CONNECT_TIMEOUT_S) as conn:
            conn.ensure_connection(timeout=self.deadline_s, **_REVOKE_RETRY)
            bound_publish_retries(conn, _REVOKE_RETRY)  # kombu's mailbox would retry a lost broker forever
            self.app.control.revoke(celery_ids, terminate=terminate, signal="SIGTERM", connection=conn)


class _CannotKillJob(logging.Filter):
    """Drops kombu's `pidbox command error: NotImplementedError(... does not implement kill_job)` tracebacks."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not (isinstance(exc, NotImplementedError) and "kill_job" in str(exc))


def _time_limits(app: Celery, celery_name: str) -> tuple[bool, bool]:
    """Whether the job has a hard and a soft time limit (its own or the app's)."""
    job = app.tasks.get(celery_name)
    hard = getattr(job, "time_limit", None) or app.conf.task_time_limit
    soft = getattr(job, "soft_time_limit", None) or app.conf.task_soft_time_limit
    return bool(hard), bool(soft)


_IGNORED_LIMITS: dict[str, tuple[bool, bool]] = {
    "thread": (True, True),
    "solo": (True, True),
    "eventlet": (True, True),
    "gevent": (False, True),  # its greenlets run under a gevent Timeout for the hard limit only
}
"""The (hard, soft) time limits each of Celery's pools ignores (prefork enforces both)."""


def warn_unless_pool_terminates(
    app: Celery,
    terminating_tools: Callable[[], list[str]],
    time_limits: Callable[[], dict[str, tuple[bool, bool]]],
) -> list[Callable[..., None]]:
    """At `worker_ready` of `app`'s worker: one warning when its pool cannot terminate the tools that ask for it
    (prefork, gevent and eventlet can; threads and solo cannot), instead of Celery's logged traceback on each
    such revoke; and one when its pool would silently ignore the tools' time limits (all but prefork's)."""

    def ready(sender: Any = None, **_: Any) -> None:
        if getattr(sender, "app", None) is not app:
            return
        pool = getattr(sender, "pool", None)
        if pool is None:
            return
        kind = type(pool).__module__.rpartition(".")[2]
        if kind == "eventlet":  # psycopg yields to gevent's hub only; sqlite3 to none
            logger.warning(
                "this worker's eventlet pool cannot run other jobs while one waits on the task store: a slow "
                "store call stalls every job, heartbeat and revoke of this worker (a threads or prefork worker does "
                "not; on PostgreSQL, a gevent one neither)"
            )
        ignores = _IGNORED_LIMITS.get(kind)
        if ignores is not None:
            limited = time_limits()
            names = sorted(
                name for name, has in limited.items() if any(i and h for i, h in zip(ignores, has, strict=True))
            )
            if names and all(ignores):
                logger.warning(
                    "this worker's %s pool enforces no time limit: time_limit and soft_time_limit of %s are "
                    "ignored (a prefork worker enforces them)",
                    kind,
                    ", ".join(repr(name) for name in names),
                )
            elif names:
                logger.warning(
                    "this worker's %s pool enforces no soft time limit: soft_time_limit of %s is ignored (their "
                    "time_limit holds; a prefork worker enforces both)",
                    kind,
                    ", ".join(repr(name) for name in names),
                )
        if pool_terminates(pool):
            return
        names = terminating_tools()
        if not names:
            return
        logger.warning(
            "this worker's %s pool cannot terminate a running job: tasks/cancel of %s cancels the task, "
            "and the job runs on until it checks ctx.cancelled() (a prefork worker terminates it)",
            kind,
            ", ".join(repr(name) for name in names),
        )
        logging.getLogger(PIDBOX_LOGGER).addFilter(_CannotKillJob())  # in this worker only: it has explained them

    signals.worker_ready.connect(ready)  # weakly, and returned: the dispatcher keeps it
    return [ready]
