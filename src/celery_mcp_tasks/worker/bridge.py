"""The signal bridge: Celery outcomes become task states.

Success -> `completed` with the CallToolResult the job left on the request (`job.OUTCOME`); a failure (an
exception, retries exhausted, a lost pool process) or a revoke -> `failed` (after our own cancel the store
already says `cancelled`); a retry keeps the task `working` until the next attempt; a message the worker
has no task for (it runs an older release of the app), which Celery drops -> `failed` saying to restart the
workers. Signals come from different processes and out of order (`task_retry` can land after the next
attempt started), so every write names its run and is a compare-and-swap: a late signal never moves a task
backwards. Celery swallows exceptions raised in signal handlers; ours log them loudly.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable
from datetime import datetime
from typing import Any

from celery import signals
from celery.exceptions import WorkerLostError

from celery_mcp_tasks.model import Run, TaskRecord, TerminalTask, failure, now_ms
from celery_mcp_tasks.service import TaskService
from celery_mcp_tasks.store.base import StoreUnavailable, TaskNotFound
from celery_mcp_tasks.worker import soft_limits, tracelog
from celery_mcp_tasks.worker.job import (
    FAILED_ERROR,
    FAILED_WITH,
    LAST_RECORD,
    OUTCOME,
    RUN_END,
    McpJob,
    failure_text,
    limit_left_s,
    row_key,
    run_of,
    worker_limits,
)
from celery_mcp_tasks.worker.outages import patience_s, patiently

logger = logging.getLogger("celery_mcp_tasks.worker")

_MAX_MESSAGE = 500
_installed = False
_apps: weakref.WeakKeyDictionary[Any, list[weakref.WeakMethod[Callable[[], TaskService]]]] = weakref.WeakKeyDictionary()
"""The services of each Celery app's `McpTasks` in this process (`on_unknown`), held weakly as the app is."""


def _services(celery: Any) -> list[Callable[[], TaskService]]:
    try:
        found = _apps.get(celery)
    except TypeError:  # not hashable or weakly referenceable: no `McpTasks` was built on it
        return []
    return [service for ref in found or () if (service := ref()) is not None]


Op = Callable[[TaskService, str, "Run | None", "TaskRecord | None"], object]


def _settle(sender: Any, request: Any, what: str, op: Op, *, next_attempt: bool = False, patient: bool = False) -> None:
    """Apply `op(service, key, run, expected)` for one of our jobs; anything else is not ours to touch.

    `expected`: the record the job's run last read or wrote, so the write is one conditional UPDATE while
    nothing else changed the task meanwhile. Where the job did not run (the worker's main process: a revoke,
    a lost pool process) it is read first, unlocked: most often the task is final already (our own cancel
    revoked it), and then nothing is written, and no write lock taken while the pool may be forking.

    `patient`: the run's own outcome, in the process that ran it: through a store outage (a failover, a
    restart) it is tried again for a while (`outages`), rather than dropped for the janitor to run the
    job again after the stale timeout. A try whose commit was in doubt and landed makes the next one find the
    task final, and it is left so.
    """
    if not isinstance(sender, McpJob):
        return
    key = row_key(request)
    if key is None:
        return  # a plain `.delay()` of the job: no MCP task behind it
    with soft_limits.settling():  # the body is over: a soft time limit coming now is dropped
        _settle_patiently(sender, request, key, what, op, next_attempt, patient)


def _settle_patiently(
    sender: McpJob, request: Any, key: str, what: str, op: Op, next_attempt: bool, patient: bool
) -> None:
    tool = sender.mcp_tool.name

    def waiting(exc: StoreUnavailable, left_s: float) -> None:
        logger.warning(
            "tool %r: could not record %s, the task store is unavailable (%s; MCP_TASKS_DATABASE_URL); "
            "trying again for up to %.0f s",
            tool,
            what,
            exc.reason or "no answer",
            left_s,
        )

    # Only where the run's body ran (it left its record): Celery also reports failures from the worker's main
    # process (a hard time limit, a lost pool process), whose loop must not stop for the store.
    ran_here = isinstance(getattr(request, LAST_RECORD, None), TaskRecord)
    left = limit_left_s(sender, request, soft=False)  # the hard limit still runs while the outcome waits
    within_s = patience_s(sender.mcp_runtime.stale_timeout_s, left) if patient and ran_here else 0.0
    try:
        patiently(lambda: _settle_once(sender, request, key, what, op, next_attempt), within_s, waiting)
    except StoreUnavailable as exc:  # said in one line: the cause is the database's, and the janitor recovers
        if getattr(request, OUTCOME, None) is not None:  # Celery's line says so, not "succeeded"
            setattr(request, RUN_END, f"its {what} could not be recorded, the task store is unavailable")
        logger.warning(
            "tool %r: could not record %s, the task store is unavailable (%s; MCP_TASKS_DATABASE_URL); the "
            "janitor sends the job again or fails the task after the stale timeout",
            tool,
            what,
            exc.reason or "no answer",
        )


def _settle_once(sender: McpJob, request: Any, key: str, what: str, op: Op, next_attempt: bool) -> None:
    run = run_of(request, next_attempt=next_attempt)
    expected = getattr(request, LAST_RECORD, None)
    try:
        service = sender.mcp_runtime.service()
        if not isinstance(expected, TaskRecord) or expected.key != key:
            expected = service.record(key)
            if expected is None:
                raise TaskNotFound()
            if expected.terminal:
                raise TerminalTask()
        op(service, key, run, expected)
    except (TerminalTask, TaskNotFound):
        logger.debug("tool %r: %s ignored, task final, superseded or gone", sender.mcp_tool.name, what)
    except StoreUnavailable:
        raise
    except Exception:
        logger.exception("tool %r: could not record %s; the janitor will settle the task", sender.mcp_tool.name, what)


def _fail(message: str, error: dict[str, Any] | None = None) -> Op:
    """Fail the task saying `message`, with `error` (a JSON-RPC error) or the runtime's own (-32603, `message`)."""
    error = error or failure(message)
    return lambda service, key, run, expected: service.fail(key, error, message, run=run, expected=expected)


def on_success(sender: Any = None, **_: Any) -> None:
    request = getattr(sender, "request", None)
    result = getattr(request, OUTCOME, None)
    if result is not None:  # else the run ended without an outcome: skipped, asked for input, handed off
        _settle(
            sender,
            request,
            "completion",
            lambda service, key, run, expected: service.complete(key, result, run=run, expected=expected),
            patient=True,
        )


def on_failure(sender: Any = None, exception: BaseException | None = None, **_: Any) -> None:
    request = getattr(sender, "request", None)
    said = getattr(request, FAILED_WITH, None)  # the body's own exception, before Celery made it picklable
    if said is None and exception is not None:
        said = failure_text(exception)
    message = f"Job failed: {said}" if said else "Job failed"
    _settle(
        sender, request, "failure", _fail(message[:_MAX_MESSAGE], getattr(request, FAILED_ERROR, None)), patient=True
    )


def on_retry(sender: Any = None, request: Any = None, reason: Any = None, **_: Any) -> None:
    # When the next attempt is due (Retry.when: a countdown in seconds or an ETA). After a lost pool process
    # it is due now as far as the reaper is concerned: its delay is Celery's `default_retry_delay`, not a
    # promise the job made, and its message often dies with the worker that held it.
    cause = getattr(reason, "exc", None)
    when = None if isinstance(cause, WorkerLostError) else getattr(reason, "when", None)
    # A bare `self.retry()` names none. Celery keeps a picklable stand-in for an exception that is not: its
    # wrapper says the original class (`exc_cls_name`).
    after = (getattr(cause, "exc_cls_name", None) or type(cause).__name__) if isinstance(cause, BaseException) else None
    if isinstance(when, datetime):
        start_by = int(when.timestamp() * 1000)
    else:
        start_by = now_ms() + (int(when * 1000) if isinstance(when, int | float) else 0)

    def retrying(service: TaskService, key: str, run: Run | None, expected: TaskRecord | None) -> None:
        if run is not None:
            service.retrying(key, run, start_by, after=after, expected=expected)

    _settle(sender, request, "retry", retrying, next_attempt=True)


def on_revoked(sender: Any = None, request: Any = None, expired: bool = False, **_: Any) -> None:
    message = "The job expired before a worker ran it" if expired else "The job was revoked in Celery"
    _settle(sender, request, "revoke", _fail(message))


def on_unknown(sender: Any = None, message: Any = None, name: Any = None, **_: Any) -> None:
    """`task_unknown`, in the worker's main process: a message for a task this worker does not have, which
    Celery dropped. For one of our jobs (its tool added after this worker started) the task fails at once
    saying to restart the workers, rather than waiting out the stale timeout as `working`."""
    services = _services(getattr(sender, "app", None))
    headers = getattr(message, "headers", None)
    if not services or not isinstance(headers, dict):
        return
    key, run = row_key(headers), run_of(headers)
    if key is None or run is None:
        return
    tool = str(headers.get("shadow") or name)  # the MCP tool's name: its job's message is sent shadowed so
    try:
        failed = any(service().dropped(key, run, tool=tool) for service in services)  # the one whose task it is
    except Exception:
        logger.exception("tool %r: could not fail the task of a job this worker does not know", tool)
        return
    if failed:
        logger.warning("tool %r: this worker does not know it; its task failed (restart the workers)", tool)


def on_prerun(sender: Any = None, **_: Any) -> None:
    """Before a job's first run in this process: the trace's log lines of our jobs get no result, no arguments,
    and a soft time limit waits for the store call in flight (`soft_limits`: the pool's handler is there now).

    Installed here, not with the bridge: constructing `McpTasks` puts no filter on Celery's logger.
    """
    if isinstance(sender, McpJob):
        tracelog.install()
        soft_limits.install()


def on_worker_init(sender: Any = None, **_: Any) -> None:
    """A worker starts in this process: its consumer's line for a dropped message of one of our jobs leaves the
    arguments out (`tracelog`), and its own time limits bound a job's waits for the store (`job.limit_left_s`).
    Installed here, not with the bridge: constructing `McpTasks` filters no logger."""
    if _services(getattr(sender, "app", None)):
        tracelog.install_consumer()
        worker_limits(getattr(sender, "time_limit", None), getattr(sender, "soft_time_limit", None))


def serves(celery: Any) -> bool:
    """Whether an `McpTasks` alive in this process was built on `celery`."""
    return bool(_services(celery))


def install(celery: Any, service: Callable[[], TaskService]) -> None:
    """Connect the bridge once per process (worker main process and pool children alike), and know `celery`'s
    service (a bound method) for the messages its workers drop."""
    global _installed
    _apps.setdefault(celery, []).append(weakref.WeakMethod(service))
    if _installed:
        return
    signals.task_prerun.connect(on_prerun, weak=False)
    signals.task_success.connect(on_success, weak=False)
    signals.task_failure.connect(on_failure, weak=False)
    signals.task_retry.connect(on_retry, weak=False)
    signals.task_revoked.connect(on_revoked, weak=False)
    signals.task_unknown.connect(on_unknown, weak=False)
    signals.worker_init.connect(on_worker_init, weak=False)
    _installed = True
