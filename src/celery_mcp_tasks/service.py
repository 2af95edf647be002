"""The domain operations, shared by the web process, the workers and the janitor.

Every write goes through here: the store applies it atomically, then the notifier hears of it. The job is
sent (`Dispatcher`) only after its row is committed, so no worker runs a job whose task does not exist.
Request-side calls take the raw task id and the caller's principal and are owner-scoped; worker-side
calls take the row key and are not.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Final, Protocol

from celery_mcp_tasks.model import (
    ANY,
    CANCELLED_BY_CLIENT,
    DEFAULT,
    DuplicateInputKeys,
    InvalidTransition,
    Owner,
    Run,
    TaskRecord,
    TaskStatus,
    TaskUnreadable,
    TerminalTask,
    UnreadableTask,
    _Default,
    checked_progress,
    derived_task_id,
    failure,
    new_task_id,
    now_ms,
    task_key,
)
from celery_mcp_tasks.notify.base import Notifier, safe_notify
from celery_mcp_tasks.observe import Observer, safe_observe
from celery_mcp_tasks.store.base import Eviction, Quota, Store, TaskLimitReached, TaskNotFound
from celery_mcp_tasks.store.codec import PayloadTooDeep, PayloadTooLarge, payload_bytes, same_json, too_deep

if TYPE_CHECKING:
    from celery_mcp_tasks.store.ledger import Ledger
    from celery_mcp_tasks.store.rows import Filter, Overview, Page, Row

__all__ = [
    "DEFAULT",
    "Dispatcher",
    "DuplicateInputKeys",
    "IdempotencyKeyReused",
    "NotLost",
    "PayloadLimits",
    "PayloadTooLarge",
    "TaskExpired",
    "TaskNotFound",
    "TaskService",
    "TerminalTask",
]

logger = logging.getLogger(__name__)


ENQUEUE_FAILED: Final = "Could not enqueue the job"  # the error of a task whose job could not be sent


class Dispatcher(Protocol):
    """The seam to the job runner (Celery in practice: `worker.dispatch.CeleryDispatcher`), called
    only for committed rows."""

    def send(self, record: TaskRecord) -> None:
        """Send the job for this record's current dispatch (e.g. a Celery message). May raise (an outage of
        the job runner: `DispatchUnavailable`)."""

    def revoke(self, record: TaskRecord) -> None:
        """This call just cancelled the task: stop its job, if its tool asked for that.

        Must return at once (a broker outage may not hold a request); best effort.
        """


class DispatchUnavailable(Exception):
    """What a `Dispatcher` raises when the job runner cannot take jobs at all (its broker is down): it has said
    why in its log, once an outage, so the failed tasks do not each say it again. The text is the cause's name."""


class NotLost(Exception):
    """A re-send refused: the task is not a `working` task whose job is judged lost. The text says why."""


class IdempotencyKeyReused(ValueError):
    """An idempotency key the caller already used for this tool, for a task it cannot have back: nothing was
    created. `how`: with other arguments, or for a task that expired before it ended (its id reads as expired,
    and the key cannot start another task while that one holds it)."""

    OTHER_ARGUMENTS = "with other arguments"
    UNFINISHED = "for a task that expired before it ended"

    def __init__(self, how: str = OTHER_ARGUMENTS) -> None:
        super().__init__(how)
        self.how = how


class TaskExpired(LookupError):
    """The owner's task outlived its TTL (the janitor has not evicted it yet)."""


@dataclass(frozen=True)
class PayloadLimits:
    """A tool's payload limits in bytes of compact JSON (`store.codec.payload_bytes`); None: unlimited.

    `arguments`: a creation's arguments; `answers`: one `tasks/update`'s answers; `result`: the job's result.
    """

    arguments: int | None = None
    answers: int | None = None
    result: int | None = None


_ARGUMENTS = ("Arguments", "MCP_TASKS_MAX_ARGUMENTS_BYTES", "max_arguments_bytes")
_ANSWERS = ("Answers", "MCP_TASKS_MAX_ANSWER_BYTES", "max_answer_bytes")
_RESULT = ("Result", "MCP_TASKS_MAX_RESULT_BYTES", "max_result_bytes")
_ERROR = ("Error", *_RESULT[1:])  # a failed task's outcome, held to its result's limits


_UNLIMITED = PayloadLimits()


def _over(what: tuple[str, str, str], value: Any, limit: int | None) -> PayloadTooLarge | None:
    """The refusal for `value` over `limit` bytes, or nested too deeply whatever the limits (`PayloadTooDeep`);
    None when it fits. Depth first: encoding a value nested deeper than Python recurses would raise."""
    if too_deep(value):
        return PayloadTooDeep(what[0])
    if limit is not None:
        size = payload_bytes(value)
        if size > limit:
            return PayloadTooLarge(what[0], size, limit, what[1], what[2])
    return None


def _bounded(error: dict[str, Any], refused: PayloadTooLarge, tool: str) -> dict[str, Any]:
    """What a failed task keeps of an error over its result limits: its code and its message's start."""
    logger.warning("tool %r: the job's error was cut to its code and message: %s", tool, refused)
    kept = failure(f"{str(error.get('message') or '')[:_KEPT_MESSAGE]} (the rest was not stored: {refused})")
    code = error.get("code")
    return {"code": code, **kept} if isinstance(code, int) and not isinstance(code, bool) else kept


_KEPT_MESSAGE = 500


class _CapRefusals:
    """A WARNING when the row cap refuses creations, at most one a minute per process (a full store refuses
    every creation), saying how many it refused since the last."""

    EVERY_S = 60.0

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._unsaid = 0
        self._next_at: float | None = None

    def refused(self, tool: str, max_rows: int | None) -> None:
        """Count a refusal of a creation of `tool`; say the count when the last line is a minute old (the rest
        are said with the next refusal after that)."""
        with self._lock:
            self._unsaid += 1
            now = self._clock()
            if self._next_at is not None and now < self._next_at:
                return
            refused, self._unsaid, self._next_at = self._unsaid, 0, now + self.EVERY_S
        logger.warning(
            "%d task creation%s refused since the last such line (the last of tool %r): the store holds "
            "MCP_TASKS_MAX_ROWS=%s rows (expired tasks count until the janitor evicts them); raise the cap, or "
            "shorten TTLs or MCP_TASKS_RETENTION_MS",
            refused,
            "" if refused == 1 else "s",
            tool,
            max_rows,
        )


@dataclass
class TaskService:
    store: Store
    notifier: Notifier | None = None
    dispatcher: Dispatcher | None = None
    max_rows: int | None = 10_000
    default_ttl_ms: int | None = 3_600_000
    default_poll_interval_ms: int | None = 1_000
    clock: Callable[[], int] = now_ms
    observer: Observer | None = None
    idempotency_secret: bytes | None = None  # derives the id of an idempotent creation (`model.derived_task_id`)
    limits: Callable[[str], PayloadLimits] | None = None
    """A tool's payload limits (the composition root: settings and `@mcp_task` options); None: unlimited."""
    answer_problem: Callable[[Mapping[str, Any], Any], str | None] | None = None
    """Why an answer is not of the kind its input request asks for, None when it is (the composition root:
    `protocol.answer_problem`)."""
    _cap_refusals: _CapRefusals = field(default_factory=_CapRefusals, init=False, repr=False, compare=False)

    # -- request side (raw id, owner-scoped) ----------------------------------------

    def create(
        self,
        *,
        owner: str | None,
        tool: str,
        arguments: dict[str, Any],
        ttl_ms: int | _Default | None = DEFAULT,
        poll_interval_ms: int | _Default | None = DEFAULT,
        status_message: str | None = None,
        input_responses: dict[str, Any] | None = None,
        dispatch: bool = True,
        trace_context: str | None = None,
        quota: Quota | None = None,
        idempotency_key: str | None = None,
        caller: str | None = None,
        durable: bool = True,
    ) -> tuple[str, TaskRecord]:
        """Store a new `working` task, then send its job. Returns (task id, record).

        Raises `TaskLimitReached`, `PayloadTooLarge` or `QuotaExceeded` (the owner's `quota`) before anything
        is stored. `idempotency_key`: the id is derived from the secret, owner, tool and key, so a retry gets
        the first call's task back (no second job) while it is unexpired; the same key with other arguments
        raises `IdempotencyKeyReused`. `caller`: the anonymous client the quota counts this for. If sending
        fails the failed record is returned: a client learns an id only for a row that tells the truth.
        `input_responses`: answers gathered before the task existed (MRTR); their keys count as used.
        `trace_context`: the W3C `traceparent` every send of the job carries. Not `durable` (PostgreSQL): the
        creation's commit does not wait for its flush to disk, for a task nothing of which reaches its caller
        before a later durable write (a synchronous call's hidden task: the outcome, a question, a cancel),
        whose commit flushes the creation too. A database crash before then loses the row: the call fails,
        though its job may have run.
        """
        limits = _UNLIMITED if self.limits is None else self.limits(tool)
        refused = _over(_ARGUMENTS, arguments, limits.arguments)
        if refused is None and input_responses:  # answers given before the task existed are answers too
            refused = _over(_ANSWERS, input_responses, limits.answers)
        if refused is not None:
            logger.warning("tool %r: a creation was refused: %s", tool, refused)
            raise refused
        at = self.clock()
        if idempotency_key is None:
            task_id = new_task_id()
        elif self.idempotency_secret is None:
            raise ValueError("idempotent creation needs the service's idempotency_secret")
        else:
            task_id = derived_task_id(self.idempotency_secret, owner, tool, idempotency_key)
        record = TaskRecord(
            key=task_key(task_id),
            owner=owner,
            tool=tool,
            status=TaskStatus.WORKING,
            created_at=at,
            updated_at=at,
            ttl_ms=self.default_ttl_ms if isinstance(ttl_ms, _Default) else ttl_ms,
            poll_interval_ms=(
                self.default_poll_interval_ms if isinstance(poll_interval_ms, _Default) else poll_interval_ms
            ),
            status_message=status_message,
            arguments=arguments,
            input_responses=dict(input_responses or {}),
            issued_keys=tuple(input_responses or ()),
            trace_context=trace_context,
            caller=caller if owner is None else None,
        )
        will_send = dispatch and self.dispatcher is not None
        if will_send:  # the first dispatch is part of the insert: one write, then the send
            record = replace(record, dispatches=1, heartbeat_at=at)
        idempotent = idempotency_key is not None
        stored = self._insert(record, quota, idempotent, durable)
        if stored is not record:  # an idempotent retry: nothing is decided on a row this process cannot open
            _require_readable(stored)
            if stored.expired(at) and stored.terminal:
                # The key's task is over and forgotten, whatever its arguments were: free its key (unless a
                # racing retry freed it and created the next task already) and create again; every racing
                # retry gets the one next task.
                self.store.delete(stored.key, expected=stored)
                stored = self._insert(record, quota, idempotent, durable)
        if stored is not record:  # an idempotent retry: the key's task
            if not same_json(stored.arguments, arguments):
                raise IdempotencyKeyReused()
            if stored.expired(at):
                raise IdempotencyKeyReused(IdempotencyKeyReused.UNFINISHED)
            return task_id, stored
        safe_observe(self.observer, None, record)
        safe_notify(self.notifier, record)
        if will_send:
            record = self._send(record)
        return task_id, record

    def _insert(self, record: TaskRecord, quota: Quota | None, idempotent: bool, durable: bool) -> TaskRecord:
        try:
            return self.store.create(
                record, max_rows=self.max_rows, quota=quota, idempotent=idempotent, durable=durable
            )
        except TaskLimitReached:
            self._cap_refusals.refused(record.tool, self.max_rows)
            raise

    def get(self, task_id: str, owner: str | None, *, final_too: bool = False) -> TaskRecord:
        """The owner's task, or TaskNotFound (missing or foreign) / TaskExpired. With `final_too`, an expired task
        whose final state came in time is returned (`TaskRecord.final_in_time`: what a listen stream owes)."""
        return self.get_by_key(task_key(task_id), owner, final_too=final_too)

    def get_by_key(self, key: str, owner: str | None, *, final_too: bool = False) -> TaskRecord:
        """`get` for a task known by its row key (a synchronous call's hidden task): owner-scoped alike."""
        record = self.store.get(key, owner)
        if record is None:
            raise TaskNotFound()
        if not (final_too and record.final_in_time):
            self._require_unexpired(record)
        return record

    def get_many(self, task_ids: Iterable[str], owner: str | None, *, final_too: bool = False) -> dict[str, TaskRecord]:
        """`get` of many tasks in one read: the owner's unexpired ones by task id, the others left out (`final_too`
        as for `get`)."""
        by_key = {task_key(task_id): task_id for task_id in task_ids}
        now = self.clock()
        found = self.store.get_many(by_key, owner)
        return {
            by_key[key]: record
            for key, record in found.items()
            if not record.expired(now) or (final_too and record.final_in_time)
        }

    def versions(self, keys: Iterable[str]) -> dict[str, int]:
        """The current version of each of these rows that exists (any owner): a cheap "did it move?"
        before an owner-scoped read of those that did. A version opens nothing."""
        return self.store.versions(keys)

    def _require_unexpired(self, record: TaskRecord) -> None:
        if record.expired(self.clock()):
            raise TaskExpired()

    def answer(self, task_id: str, owner: str | None, responses: dict[str, Any]) -> TaskRecord:
        """Record answers for outstanding keys (others are ignored); send the job again when none remain.

        A terminal task is left alone; answers over the tool's limit raise `PayloadTooLarge`. Ownership and
        expiry are checked on the row the write reads; answers and new run are one commit, one notification.
        """
        return self.answer_by_key(task_key(task_id), responses, owner=owner)

    def answer_by_key(self, key: str, responses: dict[str, Any], *, owner: Owner = ANY) -> TaskRecord:
        """`answer` by row key (a synchronous call's hidden task; owner-scoped when `owner` is given)."""
        changed = resumed = False
        dispatch = self.dispatcher is not None
        refusals: list[PayloadTooLarge | None] = []  # judged once, however many times a CAS retry recomputes

        def transition(record: TaskRecord) -> TaskRecord:
            nonlocal changed, resumed
            changed = resumed = False  # a CAS retry recomputes from the fresh row
            self._require_unexpired(record)
            _require_readable(record)
            if not record.terminal:
                if not refusals:
                    limit = None if self.limits is None else self.limits(record.tool).answers
                    refusals.append(_over(_ANSWERS, responses, limit))
                refused = refusals[0]
                if refused is not None:
                    logger.warning("tool %r: answers were refused: %s", record.tool, refused)
                    raise refused
            try:
                nxt, resumed = record.answered(responses, self.clock(), dispatch=dispatch, problem=self.answer_problem)
            except InvalidTransition:
                return record
            changed = True
            return nxt

        record = self._update(key, owner, transition)
        if changed:
            safe_notify(self.notifier, record)
        if resumed and dispatch:
            record = self._send(record)
        return record

    def cancel(self, task_id: str, owner: str | None, message: str | None = None) -> tuple[TaskRecord, bool]:
        """Cancel synchronously. Returns (record, whether this call changed it)."""
        return self._cancel(task_key(task_id), owner, message, check_expiry=True)

    def _cancel(
        self, key: str, owner: Owner, message: str | None, *, check_expiry: bool = False, revoke: bool = True
    ) -> tuple[TaskRecord, bool]:
        changed = False

        def transition(record: TaskRecord) -> TaskRecord:
            nonlocal changed
            if check_expiry:
                self._require_unexpired(record)
                _require_readable(record)
            changed = not record.terminal
            return record.cancelled(self.clock(), message or CANCELLED_BY_CLIENT) if changed else record

        record = self._update(key, owner, transition)
        if changed:
            safe_notify(self.notifier, record)
            if revoke:
                self._revoke(record)
        return record, changed

    def _revoke(self, record: TaskRecord) -> None:
        """The store's cancel is what counts; stopping the job is the runner's best effort."""
        if self.dispatcher is None:
            return
        try:
            self.dispatcher.revoke(record)
        except Exception as exc:  # noqa: BLE001 - the cancel is already stored and final
            logger.warning("could not revoke the job for tool %r: %s", record.tool, type(exc).__name__)

    # -- worker side (row key, not owner-scoped) --------------------------------------

    def record(self, key: str) -> TaskRecord | None:
        return self.store.get(key, ANY)

    # -- the janitor's and the operators' reads (server side; the console's by row key): the `Store`'s ----

    def evict(self, *, now_ms: int, retention_ms: int, batch_size: int, into: Eviction | None = None) -> Eviction:
        return self.store.evict(now_ms=now_ms, retention_ms=retention_ms, batch_size=batch_size, into=into)

    def stale(self, *, heartbeat_before_ms: int, limit: int) -> list[TaskRecord]:
        return self.store.stale(heartbeat_before_ms=heartbeat_before_ms, limit=limit)

    def unanswered(self, *, changed_before_ms: int, limit: int) -> list[str]:
        return self.store.unanswered(changed_before_ms=changed_before_ms, limit=limit)

    def count_by_status(self) -> dict[str, int]:
        return self.store.count_by_status()

    def ledger(self) -> Ledger:
        return self.store.ledger()

    def browse(self, filter: Filter, sort: str, cursor: str | None, limit: int, *, now_ms: int) -> Page:
        return self.store.browse(filter, sort, cursor, limit, now_ms=now_ms)

    def overview(self, now_ms: int) -> Overview:
        return self.store.overview(now_ms)

    def rows(self, keys: Iterable[str], filter: Filter | None = None, *, now_ms: int | None = None) -> list[Row]:
        return self.store.rows(keys, filter, now_ms=now_ms)

    def keys_starting(self, prefix: str, *, limit: int) -> list[str]:
        return self.store.keys_starting(prefix, limit=limit)

    def changed_since(self, updated_at_ms: int, *, limit: int) -> list[Row]:
        return self.store.changed_since(updated_at_ms, limit=limit)

    def sign_out(self, session: str, expires_ms: int) -> None:
        self.store.sign_out(session, expires_ms, now_ms=self.clock())

    def signed_out(self, session: str) -> bool:
        return self.store.signed_out(session)

    # Writes that name a `run` are refused with `Superseded` once a newer dispatch
    # or attempt owns the task, so a late signal or a lost-then-found job cannot
    # move the task backwards.

    def progress(
        self,
        key: str,
        message: str | None,
        run: Run | None = None,
        *,
        current: float | None = None,
        total: float | None = None,
        expected: TaskRecord | None = None,
    ) -> TaskRecord:
        """Show `message` and, with `current` (and `total`), numeric progress. ValueError for bad numbers."""
        checked_progress(current, total)  # before the write: a bad number never reaches the store
        return self._write(
            key, lambda r: r.with_progress(message, self.clock(), run, current=current, total=total), expected
        )

    def heartbeat(self, key: str, run: Run | None = None, *, ahead_ms: int = 0, waiting: bool = False) -> bool:
        """Liveness for the stale reaper (`ahead_ms`: a promise to report again by then).

        False once the task is final, a newer dispatch owns it, or the key holds a later task than `run`'s.
        `waiting`: for a message of `run` not started yet, so also False once a copy of that run has started
        (a copy that died then is the reaper's to notice; this one would stand aside for it when it starts).
        """
        if run is None:
            return self.store.touch(key, self.clock() + ahead_ms)
        unstarted = run.attempt if waiting else None
        return self.store.touch(key, self.clock() + ahead_ms, dispatch=run.dispatch, born=run.born, unstarted=unstarted)

    # `expected` (worker side): the record the caller last saw or wrote. While the row is still
    # at its version the write is one conditional UPDATE (`Store.update`); else the usual one.

    def complete(
        self,
        key: str,
        result: dict[str, Any],
        message: str | None = None,
        run: Run | None = None,
        *,
        expected: TaskRecord | None = None,
    ) -> TaskRecord:
        refusals: list[PayloadTooLarge | None] = []  # judged once, however many times a CAS retry recomputes

        def transition(record: TaskRecord) -> TaskRecord:
            """Completed with `result`, or failed when it is over the tool's limit (nothing of it kept)."""
            if not record.terminal:
                if not refusals:
                    limit = None if self.limits is None else self.limits(record.tool).result
                    refusals.append(_over(_RESULT, result, limit))  # deeper, no client could read it
                refused = refusals[0]
                if refused is not None:
                    logger.warning("tool %r: the job's result was refused, the task fails: %s", record.tool, refused)
                    reason = f"The job's result was not stored: {refused}"
                    return record.failed(failure(reason), self.clock(), reason, run)
            return record.completed(result, self.clock(), message, run)

        return self._write(key, transition, expected)

    def fail(
        self,
        key: str,
        error: dict[str, Any],
        message: str | None = None,
        run: Run | None = None,
        *,
        expected: TaskRecord | None = None,
    ) -> TaskRecord:
        """Failed with `error` (a JSON-RPC error: a job's `MCPError`, `ctx.fail`'s), held to the tool's result
        limits as a result is: over them, its code and the start of its message are kept, its data is not."""
        kept: list[dict[str, Any]] = []  # judged once, however many times a CAS retry recomputes

        def transition(record: TaskRecord) -> TaskRecord:
            if not kept:
                limit = None if self.limits is None else self.limits(record.tool).result
                refused = None if record.terminal else _over(_ERROR, error, limit)
                kept.append(error if refused is None else _bounded(error, refused, record.tool))
            return record.failed(kept[0], self.clock(), message, run)

        return self._write(key, transition, expected)

    def require_input(
        self,
        key: str,
        requests: dict[str, Any],
        message: str | None = None,
        *,
        park: bool = False,
        run: Run | None = None,
        expected: TaskRecord | None = None,
    ) -> TaskRecord:
        return self._write(
            key, lambda r: r.requiring_input(requests, self.clock(), message, park=park, run=run), expected
        )

    def begin(
        self, key: str, run: Run, *, stale_before_ms: int, expected: TaskRecord | None = None, at_ms: int | None = None
    ) -> TaskRecord:
        """A copy of the job's message starts `run`: it claims the run, or it must not run the body.

        One read (none with `expected`, the record as the caller or the job's message has it) and one
        conditional UPDATE recording the claim and a beat, not flushed at commit (`durable=False`). Raises
        `TaskNotFound`, `TerminalTask`, `Superseded` (not the current run) or `RunInProgress` (a redelivered
        copy while the claiming one beats since `stale_before_ms`). Clients hear of the start ("Started",
        "Started (attempt 2)", ...) unless the task already said exactly that. `at_ms`: the claim's time (the
        clock's by default), which its `started_at` records: a claim tried again can tell its own.
        """
        said = False
        at = self.clock() if at_ms is None else at_ms

        def transition(record: TaskRecord) -> TaskRecord:
            nonlocal said
            nxt = record.began(run, at, stale_before_ms=stale_before_ms)
            said = nxt.status_message != record.status_message
            return nxt

        if expected is None:
            expected = self.store.get(key, ANY)
            if expected is None:
                raise TaskNotFound()
        # Only a first claim is decided on the version alone. Once a copy has started, the claim
        # weighs that copy's heartbeat, which a beat moves without a version bump: the locking
        # path reads it under the row lock, so a live copy is never taken over.
        fast = expected if expected.started_at is None else None
        # Not durable: a claim lost in a database crash only lets a copy of the run claim it again (a run
        # is at least once anyway); the run's outcome is a durable write, and its commit flushes the claim too.
        record = self._update(key, ANY, transition, expected=fast, durable=False)
        if said:
            safe_notify(self.notifier, record)
        return record

    def retrying(
        self, key: str, run: Run, start_by_ms: int, *, after: str | None = None, expected: TaskRecord | None = None
    ) -> TaskRecord:
        """Celery scheduled attempt `run.attempt` (`after`: the failure's name): the task stays `working`, says so."""
        return self._write(key, lambda r: r.retrying(run, self.clock(), start_by_ms, after), expected)

    def unpark(self, key: str, *, expected: TaskRecord | None = None) -> TaskRecord:
        return self._write(key, lambda r: r.unparked(), expected)

    def cancel_by_key(self, key: str, message: str, *, terminate: bool = True) -> tuple[TaskRecord, bool]:
        """Cancel by row key (server side: the janitor, an operator). Returns (record, whether this call changed it).

        `terminate`: also revoke the running job (the dispatcher terminates it where its
        tool allows); without it the job notices `ctx.cancelled()` at its next check.
        """
        return self._cancel(key, ANY, message, revoke=terminate)

    def resend(self, key: str, *, stale_before_ms: int, message: str) -> TaskRecord:
        """An operator's re-send of a `working` task judged lost (no heartbeat since `stale_before_ms`): a new
        dispatch (an older message in flight is superseded), decided in the compare-and-swap. Raises `NotLost`
        (saying why) or `TaskNotFound`."""

        def transition(record: TaskRecord) -> TaskRecord:
            if record.terminal:
                raise NotLost(f"the task is already {record.status.value}")
            if record.status is not TaskStatus.WORKING:
                raise NotLost(f"the task is {record.status.value}: only a working task's job can be lost")
            if self.dispatcher is None:
                raise NotLost("this process sends no jobs")
            if not record.stale(stale_before_ms):
                if record.started_at is None:  # sent, not started: its message may still be waiting in the queue
                    raise NotLost("the job was sent less than the stale timeout ago and has not started yet")
                raise NotLost("the job is alive: its heartbeat is newer than the stale timeout")
            return record.dispatched(self.clock(), message, resend=True)

        record = self._write(key, transition)
        return self._send(record)

    def delete(self, key: str) -> None:
        """Delete a final task's row. Raises `TaskNotFound`, or `InvalidTransition` for an active task."""
        record = self.store.get(key, ANY)
        if record is None:
            raise TaskNotFound()
        if not record.terminal:
            raise InvalidTransition(f"the task is {record.status.value}: only a final task can be deleted")
        if not self.store.delete(key):
            raise TaskNotFound()  # deleted meanwhile (a final task never becomes active again)

    def expire_input(self, key: str, *, changed_before_ms: int, message: str) -> bool:
        """Fail a task nobody answered since the bound (the input timeout), inside the CAS: an answer first wins."""
        return self._fail_if(key, lambda record: record.unanswered(changed_before_ms), message)

    def reap(self, key: str, *, stale_before_ms: int, max_sends: int, lost_message: Callable[[TaskRecord], str]) -> str:
        """Settle a task whose job seems lost: send it again while the run has sends left, then fail it
        (`lost_message(record)` says why).

        Decided inside the compare-and-swap, so two janitors at once act only once.
        Returns "resent", "failed" (a send the broker refused too) or "skipped" (it showed life or ended meanwhile).
        """
        outcome = "skipped"

        def transition(record: TaskRecord) -> TaskRecord:
            nonlocal outcome
            outcome = "skipped"
            if not record.stale(stale_before_ms):
                return record
            sends = record.resends + 1
            if sends < max_sends:
                outcome = "resent"
                said = (
                    "No worker started the job; sending it again"  # none took it, or could reach the store to
                    if record.never_started  # claim it, or the one holding it died before starting it
                    else "The worker was lost; running the job again"  # or it could not reach the store to beat
                )
                return record.dispatched(self.clock(), f"{said} (send {sends + 1} of {max_sends})", resend=True)
            outcome = "failed"
            message = lost_message(record)
            return record.failed(failure(message), self.clock(), message)

        try:
            record = self._write(key, transition)
        except (TerminalTask, TaskNotFound):
            return "skipped"
        if outcome == "resent" and self._send(record).terminal:
            return "failed"  # the broker refused the send: `_send` failed the task, readable
        return outcome

    def dropped(self, key: str, run: Run, *, tool: str) -> bool:
        """A worker that does not know `tool` (an older release of the app) got `run`'s message, and Celery
        dropped it: the task fails saying what to do, at once (that worker can send no job of a tool it does
        not know; else the task would wait out the stale timeout). False, and nothing written, when that
        message is no longer the task's current run or a copy of it started meanwhile (a retry's message counts
        as unstarted while the attempt before it still shows: Celery sends it before it says so).

        In a fleet of both releases, a copy of the message the broker handed out again (after its visibility
        timeout) may be dropped while another worker holds the first copy unstarted: the task fails then too
        (docs/production.md: a release that adds a tool replaces the workers first)."""
        message = f"The worker that got the job does not know tool {tool!r}: restart the workers with the code that defines it"

        def current(record: TaskRecord) -> bool:
            unstarted = record.started_at is None or run.attempt > record.attempt
            ours = run.dispatch == record.dispatches and run.attempt >= record.attempt and run.of(record)
            return record.status is TaskStatus.WORKING and unstarted and ours

        return self._fail_if(key, current, message)

    def _fail_if(self, key: str, due: Callable[[TaskRecord], bool], message: str) -> bool:
        """Fail the task with `message` when `due(record)`, decided inside the compare-and-swap; whether it did."""
        failed = False

        def transition(record: TaskRecord) -> TaskRecord:
            nonlocal failed
            failed = due(record)
            return record.failed(failure(message), self.clock(), message) if failed else record

        try:
            self._write(key, transition)
        except (TerminalTask, TaskNotFound):
            return False
        return failed

    def _update(
        self,
        key: str,
        owner: Owner,
        transition: Callable[[TaskRecord], TaskRecord],
        *,
        notify: bool = False,
        expected: TaskRecord | None = None,
        durable: bool = True,
    ) -> TaskRecord:
        """`store.update`; when the row really changed the observer hears (before, after), and with
        `notify` the notifier too."""
        seen: list[TaskRecord] = []

        def remembered(record: TaskRecord) -> TaskRecord:
            seen.append(record)
            return transition(record)

        record = self.store.update(key, owner, remembered, expected=expected, durable=durable)
        if not seen or record.version != seen[-1].version:
            if seen:
                safe_observe(self.observer, seen[-1], record)
            if notify:
                safe_notify(self.notifier, record)
        return record

    def _write(
        self, key: str, transition: Callable[[TaskRecord], TaskRecord], expected: TaskRecord | None = None
    ) -> TaskRecord:
        """Apply `transition` atomically; tell the notifier only when the row really changed."""
        return self._update(key, ANY, transition, notify=True, expected=expected)

    def _send(self, record: TaskRecord) -> TaskRecord:
        """Hand a committed dispatch to the broker; if that fails the task fails, readable."""
        if self.dispatcher is None:
            return record
        try:
            self.dispatcher.send(record)
        except Exception as exc:  # noqa: BLE001 - broker down, serialization, routing: the task must still end readable
            if isinstance(exc, DispatchUnavailable):  # an outage: the dispatcher said it once
                reason = str(exc)
            else:  # this job's own failure
                reason = type(exc).__name__
                logger.error("could not send the job for tool %r: %s", record.tool, reason)
            try:
                return self.fail(record.key, failure(ENQUEUE_FAILED, reason))
            except TerminalTask:
                return self.store.get(record.key, ANY) or record
        return record


def _require_readable(record: TaskRecord) -> None:
    """A caller's answer or cancel is refused, not acknowledged and dropped, on a row this process cannot open."""
    if isinstance(record, UnreadableTask):
        raise TaskUnreadable(record.status_message or "The task cannot be read in this process")
