"""`TaskContext`: what a job sees of its task, and the handle for work that ends elsewhere (a webhook, a test).

It talks to the store through the service, never to Celery. After a final state every write raises
`TerminalTask`; once a newer dispatch or attempt owns the task, a job's writes raise `Superseded` (one).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, NoReturn

from celery_mcp_tasks.model import Run, Superseded, TaskRecord, TaskStatus, TerminalTask, checked_progress, failure
from celery_mcp_tasks.protocol import tool_result, validate_input_requests
from celery_mcp_tasks.service import TaskService
from celery_mcp_tasks.store.base import StoreUnavailable

logger = logging.getLogger("celery_mcp_tasks.worker")


class EndRun(BaseException):
    """Ends the current run without settling the task. A `BaseException`, like `GeneratorExit`: a job's own
    `except Exception` (or Celery's `autoretry_for=(Exception,)`) must not swallow it."""


class InputRequested(EndRun):
    """The task now waits in `input_required`; the job runs again once every key is answered."""


class HandedOff(EndRun):
    """The task stays `working`; something outside the job settles it through a task handle."""


class InputTimeout(TimeoutError):
    """`wait_for_input` saw no complete answer in time.

    The task still waits in `input_required` (a later answer enqueues the job
    again). Let it propagate and the task fails with this message; catch it to
    decide otherwise (e.g. complete with a partial result). The question stays
    asked: waiting again on the same key raises `DuplicateInputKeys`.
    """


class TaskContext:
    """The handle on one task. Cheap to create; holds the row key and the last record read."""

    cancel_check_interval: float = 1.0
    """Seconds `cancelled()` answers from its last read (or write) before it reads the store again.

    One read a second per looping job (100 jobs: 100 reads/s, not 2 000), and a
    cancellation seen within a second; a `progress()` write sees it at once (it
    raises `TerminalTask`). Set it on a context, a subclass or here for another
    trade-off: `TaskContext.cancel_check_interval = 0.25`.
    """

    def __init__(
        self, service: TaskService | None, key: str | None, *, record: TaskRecord | None = None, run: Run | None = None
    ) -> None:
        self._service = service
        self._key = key
        self._record = record
        self._run = run
        self._detached_attempt = 0
        self._dropping = False  # progress reports are being dropped (a store outage)
        self._checked_at = time.monotonic() if record is not None else 0.0

    @classmethod
    def detached(cls, *, attempt: int = 0) -> TaskContext:
        """For a job called without an MCP task (`.delay()`, a plain call): every report is a no-op.
        `attempt`: Celery's retry count of the running job."""
        ctx = cls(None, None)
        ctx._detached_attempt = attempt
        return ctx

    @property
    def attached(self) -> bool:
        return self._service is not None and self._key is not None

    @property
    def key(self) -> str | None:
        """The row key (a hash of the task id, which it cannot open): give it to whatever finishes the work."""
        return self._key

    @property
    def attempt(self) -> int:
        """Celery's retry count for this run (0 on the first attempt)."""
        return self._run.attempt if self._run is not None else self._detached_attempt

    @property
    def input_responses(self) -> dict[str, Any]:
        """Every answer the client gave so far, by input request key."""
        return dict(self._record.input_responses) if self._record is not None else {}

    @property
    def last_record(self) -> TaskRecord | None:
        """The record as this handle last read or wrote it (no read): what its next write expects."""
        return self._record

    def record(self) -> TaskRecord | None:
        """A fresh read of the task (None when detached or evicted)."""
        if self._service is None or self._key is None:
            return None
        found = self._service.record(self._key)
        # A later task under the key (created again after this one expired) is not this run's: this one is gone.
        self._record = found if found is None or self._run is None or self._run.of(found) else None
        self._checked_at = time.monotonic()
        return self._record

    def cancelled(self) -> bool:
        """True once the client cancelled (or the task is gone). At most one store read per
        `cancel_check_interval` (1 s by default): call it in loops."""
        if not self.attached:
            return False
        if time.monotonic() - self._checked_at >= self.cancel_check_interval:
            try:
                self.record()
            except StoreUnavailable:  # a store outage is no cancel: the last state read stands, asked again later
                self._checked_at = time.monotonic()
        return self._record is None or self._record.status is TaskStatus.CANCELLED

    def progress(self, message: str, current: float | None = None, total: float | None = None) -> None:
        """Show `message` as the task's statusMessage, and optionally how far the job is.

        `current` is how much is done (not negative, and it should only grow from
        one call to the next); `total` how much there is, when known. A call with
        `current` replaces both numbers; one without keeps the last ones. `total`
        without `current` is a `ValueError`. Raises `TerminalTask` once the task is final.
        A report the task store cannot take (an outage) is dropped with a warning, and
        the work goes on: the next report, or the outcome, says where it is.
        """
        checked_progress(current, total)  # even when detached: a bad call fails in a plain `.delay()` too
        try:
            self._write(
                lambda s, k: s.progress(k, message, self._run, current=current, total=total, expected=self._record)
            )
        except StoreUnavailable as exc:
            if not self._dropping:  # one line an outage, not one a report
                logger.warning(
                    "a progress report was dropped: the task store is unavailable (%s; MCP_TASKS_DATABASE_URL); "
                    "the job goes on",
                    exc.reason or "no answer",
                )
            self._dropping = True
        else:
            self._dropping = False

    def complete(self, result: dict[str, Any] | str, message: str | None = None) -> None:
        """Finish with a CallToolResult (a str becomes one text block), stored as a job's return value is. Mostly
        for work that ends outside a job. A dict that is not a CallToolResult is a `ValueError` naming its fields."""
        stored = tool_result(result)
        self._write(lambda s, k: s.complete(k, stored, message, self._run, expected=self._record))

    def fail(self, error: dict[str, Any] | str, message: str | None = None) -> None:
        """Fail with a JSON-RPC error (`{"code", "message"}`, or a message for -32603)."""
        if isinstance(error, str):
            error = failure(error)
        self._write(lambda s, k: s.fail(k, error, message, self._run, expected=self._record))

    def heartbeat(self, within_s: float = 0.0) -> None:
        """Tell the stale reaper the work is alive (and will report again within `within_s` plus the stale timeout).

        A job gets this for free from a background thread; use it from outside a job.
        """
        if self._service is None or self._key is None:
            return
        if not self._service.heartbeat(self._key, self._run, ahead_ms=int(within_s * 1000)):
            found = self.record()  # which of the two: the job's line says
            if found is None or found.terminal:
                raise TerminalTask("the task is final")
            raise Superseded("a newer run owns the task")

    def require_input(self, requests: dict[str, Any], message: str | None = None) -> NoReturn:
        """Ask the client for input and end this run; the job runs again once every key is answered.

        Keys must be new for this task (a reused key raises `DuplicateInputKeys`),
        so guard the call with `if "key" not in ctx.input_responses`.
        """
        checked = validate_input_requests(requests)
        self._require_attached("require_input")
        self._write(lambda s, k: s.require_input(k, checked, message, run=self._run, expected=self._record))
        raise InputRequested()

    def wait_for_input(
        self, requests: dict[str, Any], message: str | None = None, *, timeout: float, poll_interval: float = 0.2
    ) -> dict[str, Any]:
        """Ask for input and block this worker until every key is answered; return the answers by key.

        For short waits only: the worker slot stays busy meanwhile. Keys already
        answered are not asked again, so a re-run of the job gets its answers at
        once. Raises `InputTimeout` after `timeout` seconds and `TerminalTask`
        when the task is cancelled meanwhile.
        """
        self._require_attached("wait_for_input")
        pending = {key: value for key, value in requests.items() if key not in self.input_responses}
        if pending:
            checked = validate_input_requests(pending)
            self._write(
                lambda s, k: s.require_input(k, checked, message, park=True, run=self._run, expected=self._record)
            )
            self._await_answers(list(pending), timeout, poll_interval)
        answers = self.input_responses
        return {key: answers[key] for key in requests}

    def hand_off(self, message: str | None = None, *, within_s: float) -> NoReturn:
        """End this run leaving the task `working`, to be settled from outside through `task_handle(ctx.key)`.

        Unless something reports (`heartbeat`, `progress`, `complete`, `fail`)
        within `within_s` seconds plus the stale timeout, the janitor treats the
        work as lost: it runs the job again while sends are left, then fails it.
        """
        self._require_attached("hand_off")
        if message is not None:
            self.progress(message)
        self.heartbeat(within_s)
        raise HandedOff()

    def _await_answers(self, keys: list[str], timeout: float, poll_interval: float) -> None:
        assert self._service is not None and self._key is not None
        deadline = time.monotonic() + timeout
        while True:
            try:
                record = self.record()
            except StoreUnavailable:  # an outage is neither an answer nor an end: read again, within the timeout
                if time.monotonic() >= deadline:
                    raise
                time.sleep(min(poll_interval, max(deadline - time.monotonic(), 0.0)))
                continue
            if record is None or record.terminal:
                raise TerminalTask("the task ended while waiting for input")
            if record.status is TaskStatus.WORKING and all(key in record.input_responses for key in keys):
                return
            if time.monotonic() >= deadline:
                # Stop being parked; if the answers won that race, take them.
                self._record = self._service.unpark(self._key, expected=self._record)
                if self._record.status is TaskStatus.WORKING:
                    return
                raise InputTimeout(f"no answer to the input request within {timeout:g}s")
            time.sleep(min(poll_interval, max(deadline - time.monotonic(), 0.0)))

    def _require_attached(self, what: str) -> None:
        if not self.attached:
            raise RuntimeError(f"{what} needs an MCP task; this job was called without one")

    def _write(self, op: Callable[[TaskService, str], TaskRecord]) -> None:
        if self._service is None or self._key is None:
            return
        try:
            self._record = op(self._service, self._key)
        except TerminalTask:
            self.record()
            raise
        self._checked_at = time.monotonic()
