"""The job class every `@mcp_task` becomes: a normal Celery task (`.delay(...)` runs it detached) that, when
its message carries our row-key header, runs the body only as the task's current run (`service.begin`),
with validated stored arguments, a live `TaskContext` and the process's heartbeat. Recording the outcome
is the signal bridge's (`worker.bridge`), so every path through Celery ends in the store.
"""

from __future__ import annotations

import contextvars
import inspect
import json
import logging
import re
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import fields
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, cast

from celery import Task, current_task
from celery.exceptions import SoftTimeLimitExceeded, TimeLimitExceeded, WorkerLostError
from mcp.server.mcpserver.exceptions import ResourceError, ToolError
from mcp.shared.exceptions import MCPError
from mcp_types import CallToolResult, TextContent
from pydantic import ValidationError

from celery_mcp_tasks.model import (
    PastTtl,
    Run,
    RunInProgress,
    Superseded,
    TaskRecord,
    TaskStatus,
    TerminalTask,
    now_ms,
    stale_cutoff,
)
from celery_mcp_tasks.service import TaskService
from celery_mcp_tasks.store.base import StoreUnavailable, TaskNotFound
from celery_mcp_tasks.worker.context import EndRun, HandedOff, InputRequested, TaskContext
from celery_mcp_tasks.worker.heartbeats import heartbeats
from celery_mcp_tasks.worker.outages import patience_s, patiently
from celery_mcp_tasks.worker.soft_limits import shielded

if TYPE_CHECKING:
    from celery.result import AsyncResult

logger = logging.getLogger("celery_mcp_tasks.worker")

KEY_HEADER = "mcp_task_key"
"""Celery message header carrying the row key (a hash; never the task id)."""
DISPATCH_HEADER = "mcp_task_dispatch"
"""Which dispatch of the task this message is; an older message than the row's is superseded."""
BORN_HEADER = "mcp_task_born"
"""When the task this message was sent for was created (`Run.born`): a later task under the same key is not it."""
RECORD_HEADER = "mcp_task_record"
"""The task's record as its dispatch left it, but for the payloads (the arguments are the message's kwargs):
what the job's claim is computed on, so starting a run is one conditional UPDATE on that version and no
read. A row that moved since (a redelivered copy, a retry, a cancel) makes the UPDATE miss, and the claim
is decided on the row as it is then. Only for a dispatch with no input requests or answers (`record_header`)."""
_PAYLOADS = frozenset({"key", "arguments", "input_requests", "input_responses", "result", "error"})
_CARRIED = tuple(f.name for f in fields(TaskRecord) if f.name not in _PAYLOADS)
HIDDEN_ARGS = {"argsrepr": "()", "kwargsrepr": "<tool arguments are not logged>"}
"""What Celery's logs and events (Flower) show instead of an MCP task's arguments."""
RUN_END = "mcp_run_end"
"""Request attribute: why a run ended without an outcome (the log line says it instead of "succeeded: None")."""
RUN_CLOCK = "mcp_run_clock"
"""Request attribute: when this process began the run (`time.monotonic()`): its time limits count from there."""
LAST_RECORD = "mcp_last_record"
"""Request attribute: the task's record as the run last read or wrote it, so the signal bridge's final
write is one conditional UPDATE on it (`Store.update(expected=...)`) instead of a locked read and write."""

FAILED_WITH = "mcp_failed_with"
"""Request attribute: the exception the body raised, as the task's error names it (`failure_text`), taken
before Celery makes it picklable for its signal (a base class of it, or a wrapper naming another class)."""
FAILED_ERROR = "mcp_failed_error"
"""Request attribute: the JSON-RPC error of an `MCPError` the body raised, which the task fails with as is (its
code, message and data), as the SDK answers one raised by a synchronous tool."""

OUTCOME = "mcp_outcome"
"""Request attribute: the CallToolResult of a run that produced one, for the signal bridge to record. The job
returns None to Celery: an MCP run's outcome belongs to the task store, not to Celery's return value,
which Celery would repr on every success (a tenth of a no-op run's work) and store in a result backend."""

# Why a job skips its body (first match), what its log line adds, and at which level: a WARNING only for what
# an operator must see at a worker's default level (one deployment's job taken by another's worker).
_SKIPS: tuple[tuple[type[Exception], str, str, int], ...] = (
    (
        TaskNotFound,
        "its task no longer exists",
        " (deleted before its job ran; if every job says so, this worker's store is not the web processes'"
        " (MCP_TASKS_DATABASE_URL), or a deployment with another database shares this queue and loses its"
        " jobs to this worker: give each deployment its own MCP_TASKS_QUEUE)",
        logging.WARNING,
    ),
    # e.g. Redis redelivered the message after its visibility timeout
    (
        RunInProgress,
        "another copy of this run is already running",
        " (a redelivered message; that copy's last heartbeat is recent: if it stopped, the janitor sends the"
        " job again once the heartbeat is stale)",
        logging.INFO,
    ),
    (Superseded, "superseded by a newer dispatch or attempt", "", logging.INFO),
    (PastTtl, "its task expired", " (its client was told so; the janitor removes it)", logging.INFO),
    # a record this process cannot open reads as failed too (a line before this one says why)
    (TerminalTask, "its task is already final, or cannot be read in this process", "", logging.INFO),
)
_SKIPPED = tuple(skip[0] for skip in _SKIPS)  # what `begin` raises that skips the body: the table decides

_current: contextvars.ContextVar[TaskContext | None] = contextvars.ContextVar("mcp_task_context", default=None)


class JobTool(Protocol):
    """What the Celery side reads of a task tool (the SDK adapter's `TaskTool`): a protocol, not an import,
    so the worker adapter never imports the SDK adapter. Properties: a dataclass field satisfies one."""

    @property
    def name(self) -> str: ...
    @property
    def fn(self) -> Callable[..., Any]: ...
    @property
    def celery_name(self) -> str: ...
    @property
    def terminate(self) -> bool: ...
    @property
    def context_param(self) -> str | None: ...
    def validate(self, arguments: Mapping[str, Any]) -> dict[str, Any]: ...
    def invalid_fields(self, exc: ValidationError) -> list[str]: ...
    def to_result(self, value: Any) -> dict[str, Any]: ...
    def job_signature(self) -> inspect.Signature: ...


_R = TypeVar("_R")
_R_co = TypeVar("_R_co", covariant=True)


class McpTaskJob(Protocol[_R_co]):
    """What `@tasks.mcp_task` returns: the Celery task (an `McpJob`), typed by the function's result.

    The arguments are not checked statically: the job's `TaskContext` parameter is injected,
    never passed (`write_report.delay(topic="x")`). Every other attribute of a Celery task is
    there too, typed `Any` (Celery ships no types).
    """

    @property
    def name(self) -> str: ...
    def __call__(self, *args: Any, **kwargs: Any) -> _R_co: ...
    def delay(self, *args: Any, **kwargs: Any) -> AsyncResult: ...
    def apply_async(self, args: Any = None, kwargs: Any = None, **options: Any) -> AsyncResult: ...
    def __getattr__(self, name: str) -> Any: ...


class McpTaskDecorator(Protocol):
    """What `@tasks.mcp_task(...)` with options returns: a decorator making a function an `McpTaskJob`."""

    def __call__(self, fn: Callable[..., _R], /) -> McpTaskJob[_R]: ...


class WorkerRuntime(Protocol):
    heartbeat_interval_s: float
    stale_timeout_s: float  # silence after which a job counts as lost (a redelivered copy may take over)

    def service(self) -> TaskService: ...


def _header(request: Any, name: str) -> Any:
    if request is None:
        return None
    if isinstance(request, dict):
        return request.get(name) or (request.get("headers") or {}).get(name)
    return getattr(request, name, None) or (getattr(request, "headers", None) or {}).get(name)


def row_key(request: Any) -> str | None:
    """Our row-key header from a Celery request context, a request dict, or None."""
    return cast("str | None", _header(request, KEY_HEADER))


def run_of(request: Any, *, next_attempt: bool = False) -> Run | None:
    """The run a request belongs to (dispatch header + Celery's retry count), or None without the header."""
    dispatch = _header(request, DISPATCH_HEADER)
    if dispatch is None:
        return None
    retries = (request.get("retries") if isinstance(request, dict) else getattr(request, "retries", 0)) or 0
    born = _header(request, BORN_HEADER)
    return Run(int(dispatch), int(retries) + (1 if next_attempt else 0), None if born is None else int(born))


def record_header(record: TaskRecord) -> str | None:
    """`RECORD_HEADER`'s value for the message sending `record`'s dispatch, or None when the record holds a
    payload besides its arguments (input requests or answers: a resumed run reads them from the row)."""
    if record.input_requests or record.input_responses or record.result is not None or record.error is not None:
        return None
    carried = {name: getattr(record, name) for name in _CARRIED}
    carried["status"] = record.status.value
    return json.dumps(carried, separators=(",", ":"))


def dispatched_record(request: Any, key: str, run: Run) -> TaskRecord | None:
    """The record a message's `RECORD_HEADER` carries (its arguments: the message's kwargs), or None without
    one, for another dispatch, or one this version cannot read (a web process of another release)."""
    text = _header(request, RECORD_HEADER)
    if not isinstance(text, str):
        return None
    try:
        carried = json.loads(text)
        if not isinstance(carried, dict) or set(carried) != set(_CARRIED):
            return None
        record = TaskRecord(
            key=key,
            arguments=dict(getattr(request, "kwargs", None) or {}),
            **{**carried, "status": TaskStatus(carried["status"]), "issued_keys": tuple(carried["issued_keys"])},
        )
    except (TypeError, ValueError):
        return None
    return record if record.dispatches == run.dispatch and run.of(record) else None


class McpJob(Task):  # type: ignore[misc]  # Celery ships no types: its Task is Any to mypy
    """Base class of every `@mcp_task` job."""

    mcp_tool: JobTool
    mcp_runtime: WorkerRuntime
    typing = True

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        key = row_key(self.request)
        if key is None:
            return super().__call__(*args, **kwargs)
        try:
            return self._run_for_task(key)
        except BaseException as exc:
            limit = _greenlet_time_limit(self, exc)
            if limit is None:
                raise
            # Celery's gevent pool reports its own only once the run's request is gone, where the bridge
            # cannot tell which task it was: the run fails now, as a prefork run past its limit does.
            raise TimeLimitExceeded(limit) from None

    def signature_from_request(
        self, request: Any = None, args: Any = None, kwargs: Any = None, queue: Any = None, **extra_options: Any
    ) -> Any:
        """Retries (ours, `autoretry_for`, a lost worker's) keep the arguments out of logs and events."""
        if row_key(self.request if request is None else request) is not None:
            for option, text in HIDDEN_ARGS.items():
                extra_options.setdefault(option, text)
        return super().signature_from_request(request, args, kwargs, queue, **extra_options)

    def retry(self, *args: Any, **kwargs: Any) -> Any:
        """Celery's, but a run that may not retry again names no arguments: Celery's MaxRetriesExceededError
        quotes them, and its text becomes the task's error and the worker's log line."""
        try:
            return super().retry(*args, **kwargs)
        except self.MaxRetriesExceededError:
            if row_key(self.request) is None:
                raise
            attempts = (self.request.retries or 0) + 1
            raise self.MaxRetriesExceededError(f"gave up after {attempts} attempts") from None

    def _ended(self, why: str) -> None:
        setattr(self.request, RUN_END, why)

    def _unreachable(self, exc: StoreUnavailable, how: str) -> None:
        """The run ends without an outcome: the store could not take its claim or a write its body needed. The
        task stays `working`, as after a lost worker: the janitor sends the job again once the stale timeout
        passes (a failure written now would end, for good, a task whose next run could succeed)."""
        logger.warning(
            "job for tool %r %s: the task store is unavailable (%s; MCP_TASKS_DATABASE_URL); the janitor sends the "
            "job again after the stale timeout",
            self.mcp_tool.name,
            how,
            exc.reason or "no answer",
        )
        self._ended(f"{how}, the task store is unavailable")

    def _outcome(self, result: dict[str, Any]) -> None:
        setattr(self.request, OUTCOME, result)

    def _run_for_task(self, key: str) -> None:
        tool = self.mcp_tool
        service = shielded(self.mcp_runtime.service())  # a soft time limit waits for the store call in flight
        interval = self.mcp_runtime.heartbeat_interval_s
        carried = run_of(self.request)
        setattr(self.request, RUN_CLOCK, time.monotonic())
        failed_at: set[int] = set()  # the times of the claims the store failed (one may have landed)

        def claim() -> tuple[Run, TaskRecord]:
            # What the claim is computed on: the record the message carries (no read), else the row (one read).
            run = carried
            found = None if run is None else dispatched_record(self.request, key, run)
            if found is None:
                found = service.record(key)
            if found is None:
                raise TaskNotFound()
            if run is None:  # a message from before the dispatch header: adopt the current run
                run = Run(found.dispatches, self.request.retries or 0, found.created_at)
            stale_before = stale_cutoff(now_ms(), self.mcp_runtime.stale_timeout_s)
            at = service.clock()
            if at in failed_at:
                at += 1  # each try its own time
            try:
                return run, service.begin(key, run, stale_before_ms=stale_before, expected=found, at_ms=at)
            except StoreUnavailable:
                failed_at.add(at)
                raise
            except RunInProgress:
                # A claim whose commit landed but whose answer was lost (the connection died with it): the copy
                # now "running" is this one, its start the time of one of the tries that failed.
                row = service.record(key) if failed_at else None
                if row is not None and _claimed_by(row, run, failed_at):
                    return run, row
                raise

        def waiting(exc: StoreUnavailable, left_s: float) -> None:
            logger.warning(
                "job for tool %r waits to start: the task store is unavailable (%s; MCP_TASKS_DATABASE_URL); "
                "trying again for up to %.0f s",
                tool.name,
                exc.reason or "no answer",
                left_s,
            )

        within_s = patience_s(self.mcp_runtime.stale_timeout_s, limit_left_s(self, self.request, soft=True))
        try:
            run, record = patiently(claim, within_s, waiting)
        except _SKIPPED as exc:
            why, detail, level = next(skip[1:] for skip in _SKIPS if isinstance(exc, skip[0]))
            logger.log(level, "job for tool %r skipped: %s%s", tool.name, why, detail)
            return self._ended(f"skipped, {why}")
        except StoreUnavailable as exc:  # nothing ran: the task stays `working`, for the janitor to send again
            return self._unreachable(exc, "not started")
        except SoftTimeLimitExceeded:  # it came while the claim waited for the store: the body never ran
            return self._unreachable(StoreUnavailable(reason="its soft time limit came first"), "not started")
        setattr(self.request, LAST_RECORD, record)  # a failure from here on is written on the claimed record
        try:
            kwargs = tool.validate(record.arguments)
        except ValidationError as exc:  # its text quotes the values: name the fields only
            raise ValueError(f"stored arguments do not fit the tool: {', '.join(tool.invalid_fields(exc))}") from None
        ctx = TaskContext(service, key, record=record, run=run)
        token = _current.set(ctx)
        try:
            with heartbeats.running(lambda: service.heartbeat(key, run), interval):
                value = self.run(**kwargs)
        except (ToolError, ResourceError) as exc:
            # As the SDK answers a synchronous tool's: a deliberate tool error is a result with isError, its text
            # after the tool's name (built by the SDK's own model, so it carries everything a result needs on
            # every era, resultType included).
            text = f"Error executing tool {tool.name}: {exc}"
            return self._outcome(
                tool.to_result(CallToolResult(content=[TextContent(type="text", text=text)], is_error=True))
            )
        except MCPError as exc:  # a protocol error: the task fails with it, not with -32603
            setattr(self.request, FAILED_ERROR, exc.error.model_dump(mode="json", exclude_none=True))
            setattr(self.request, FAILED_WITH, failure_text(exc))
            raise
        except InputRequested:
            return self._ended("waiting for input")
        except HandedOff:
            return self._ended("handed off")
        except EndRun:
            return self._ended("ended without an outcome")
        except Superseded:  # e.g. the janitor sent the job again while this run could not beat
            logger.info("job for tool %r stopped: a newer run of its task took over", tool.name)
            return self._ended("stopped, a newer run of its task took over")
        except TerminalTask:
            logger.info("job for tool %r stopped: its task was settled elsewhere", tool.name)
            return self._ended("stopped, its task was settled elsewhere")
        except StoreUnavailable as exc:  # a write the job needed (a question, a result through the context) failed
            return self._unreachable(exc, "stopped")
        except Exception as exc:
            setattr(self.request, FAILED_WITH, failure_text(exc))
            raise
        finally:
            _current.reset(token)
            setattr(self.request, LAST_RECORD, ctx.last_record)
        try:
            result = tool.to_result(value)
        except ValidationError as exc:  # its text quotes the value returned: name the fields only
            names = ", ".join(tool.invalid_fields(exc))
            raise ValueError(f"the result does not fit the tool's output schema: {names}") from None
        return self._outcome(result)


def _claimed_by(row: TaskRecord, run: Run, failed_at: set[int]) -> bool:
    """`row` holds `run`'s claim made by one of the tries at `failed_at` (a claim's `started_at` is its time, to
    the millisecond: another copy's claim would have to land in the same one)."""
    ours = row.dispatches == run.dispatch and row.attempt == run.attempt and run.of(row)
    return ours and row.started_at in failed_at


_worker_limits: tuple[float | None, float | None] = (None, None)
"""The worker's own `--time-limit` and `--soft-time-limit` (`bridge.on_worker_init`; a pool process inherits it):
Celery gives those to the pool, not to the tasks."""


def worker_limits(hard: float | None, soft: float | None) -> None:
    global _worker_limits
    _worker_limits = (hard, soft)


def limit_left_s(job: Task, request: Any, *, soft: bool) -> float | None:
    """Seconds left before the run's hard time limit (with `soft`, or its soft one if sooner), counted from its
    start in this process (`RUN_CLOCK`); None when the job has neither. As Celery decides them: the message's,
    else the job's (its options, `task_time_limit`), else the worker's."""
    hard_limit, soft_limit = getattr(request, "timelimit", None) or (None, None)
    limits = [
        hard_limit or job.time_limit or _worker_limits[0],
        (soft_limit or job.soft_time_limit or _worker_limits[1]) if soft else None,
    ]
    bounds = [float(limit) for limit in limits if limit]
    if not bounds:
        return None
    started = getattr(request, RUN_CLOCK, None)
    return min(bounds) - (time.monotonic() - started if isinstance(started, float) else 0.0)


def _greenlet_time_limit(job: Task, exc: BaseException) -> float | None:
    """The hard time limit `exc` says the run exceeded, when it is the `gevent.Timeout` a gevent pool raises in
    the job's greenlet at the run's hard time limit: of that many seconds, once the run has lasted them (None
    for anything else; a job's own Timeout of the same length, ending within the tolerance of the limit,
    reads as it)."""
    gevent = sys.modules.get("gevent")
    if gevent is None or not isinstance(exc, gevent.Timeout):
        return None
    hard_limit = (getattr(job.request, "timelimit", None) or (None, None))[0]
    limit = hard_limit or job.time_limit or _worker_limits[0]
    left = limit_left_s(job, job.request, soft=False)
    if not limit or exc.seconds != limit or left is None or left > max(_LIMIT_TOLERANCE_S, limit / 10):
        return None
    return float(limit)


_LIMIT_TOLERANCE_S = 0.5
"""How early a run's own clock may read its hard limit's end (or a tenth of the limit, if more): it starts
after the pool's timer did, which a busy hub may have started from its loop's cached time."""


def failure_text(exc: BaseException) -> str:
    """An exception as a failed task's message names it: its class, and its text when it has one (a time
    limit's says which option it was: billiard's own text is only `TimeLimitExceeded(1,)`)."""
    if isinstance(exc, TimeLimitExceeded):
        limit = exc.args[0] if exc.args and isinstance(exc.args[0], int | float) else None
        seconds = "" if limit is None else f"{limit:g} s, "
        text = (
            f"the job ran longer than its time limit ({seconds}time_limit, task_time_limit or the worker's "
            "--time-limit) and was stopped"
        )
    elif isinstance(exc, SoftTimeLimitExceeded):
        text = (
            "the job ran longer than its soft time limit (soft_time_limit, task_soft_time_limit or the worker's "
            "--soft-time-limit) and did not catch SoftTimeLimitExceeded"
        )
    else:
        try:
            text = str(exc).strip()
        except Exception:  # noqa: BLE001 - a broken __str__ still fails the task readably
            text = ""
        if isinstance(exc, WorkerLostError):  # billiard's text ends with its pool's own job counter
            text = re.sub(r"\s*Job: \d+\.?$", "", text).rstrip(".")
    return type(exc).__name__ + (f": {text}" if text else "")


def _retries() -> int:
    """Celery's retry count of the job running on this thread (0 outside one: a plain call)."""
    return int(getattr(getattr(current_task, "request", None), "retries", None) or 0)


def make_run(tool: JobTool) -> Callable[..., Any]:
    """The Celery `run` for a tool: the user's function with the context injected (with `bind=True`, the job first)."""
    fn = tool.fn

    def run(*args: Any, **kwargs: Any) -> Any:
        if tool.context_param is not None:
            kwargs[tool.context_param] = _current.get() or TaskContext.detached(attempt=_retries())
        return fn(*args, **kwargs)

    run.__name__ = fn.__name__
    run.__qualname__ = fn.__qualname__
    run.__module__ = fn.__module__
    run.__doc__ = fn.__doc__
    run.__signature__ = tool.job_signature()  # type: ignore[attr-defined]
    return run
