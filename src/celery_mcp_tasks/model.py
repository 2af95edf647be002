"""The task record and its legal transitions.

Pure: no I/O, no `mcp`, no `celery`, no wire casing (`protocol` renders a record). Every transition is a function from one
immutable `TaskRecord` to the next, so the store can apply it as a
compare-and-swap and a racing writer simply recomputes from the fresh row.

The raw task id is a bearer capability. It exists in exactly two places: the
`CreateTaskResult` sent to the creator, and the client's own later requests.
Rows are keyed by `task_key(task_id)` (a SHA-256), so a database dump, a log
line or a Celery message never holds an id that would open the task.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import math
import re
import secrets
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Any, Final, Literal
from urllib.parse import quote

__all__ = [
    "ACTIVE",
    "ACTIVE_VALUES",
    "ANONYMOUS",
    "ANY",
    "MAX_OWNER",
    "OWNER_CLAIMS",
    "TERMINAL",
    "TERMINAL_VALUES",
    "DuplicateInputKeys",
    "InvalidInputResponse",
    "InvalidTransition",
    "Owner",
    "OwnerScope",
    "Run",
    "RunInProgress",
    "Superseded",
    "TaskRecord",
    "TaskStatus",
    "TerminalTask",
    "celery_message_id",
    "checked_progress",
    "derived_task_id",
    "failure",
    "new_task_id",
    "now_ms",
    "owner_bytes",
    "owner_namespace",
    "owner_of",
    "owner_scope",
    "spelled_namespace",
    "stale_cutoff",
    "task_key",
]


class TaskStatus(str, Enum):
    WORKING = "working"
    INPUT_REQUIRED = "input_required"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


ACTIVE = frozenset({TaskStatus.WORKING, TaskStatus.INPUT_REQUIRED})
TERMINAL = frozenset({TaskStatus.COMPLETED, TaskStatus.FAILED, TaskStatus.CANCELLED})
ACTIVE_VALUES: Final = tuple(sorted(status.value for status in ACTIVE))
"""The active statuses as the store's `status` column holds them (sorted: a stable SQL `IN` list)."""
TERMINAL_VALUES: Final = tuple(sorted(status.value for status in TERMINAL))
"""The final statuses as the store's `status` column holds them (sorted: a stable SQL `IN` list)."""


def stale_cutoff(at_ms: int, stale_timeout_s: float) -> int:
    """The heartbeat bound of `MCP_TASKS_STALE_TIMEOUT_S` at `at_ms`: a `working` task that has not
    beaten since is judged lost (`TaskRecord.stale`): the reaper, a redelivered copy and an operator's
    re-send all measure it so."""
    return at_ms - int(stale_timeout_s * 1000)


class _Default:
    def __repr__(self) -> str:
        return "DEFAULT"


DEFAULT: Final = _Default()
"""An argument left out: the configured default applies (a TTL, a poll interval, the notifier)."""


CANCELLED_BY_CLIENT = "Cancelled by the client"


class TerminalTask(Exception):
    """The task already reached `completed`, `failed` or `cancelled`; nothing may change it."""


class PastTtl(TerminalTask):
    """The task's TTL ran out before this run of its job started: its client was told it expired, so the body
    must not run. (Not `service.TaskExpired`, which a client's read of such a task raises.)"""


class Superseded(TerminalTask):
    """A newer dispatch or attempt of the job owns the task: this run's writes no longer count."""


class RunInProgress(Superseded):
    """Another copy of the current run's message (a redelivery) started first and still heartbeats."""


class TaskUnreadable(Exception):
    """The task's row holds payloads this process cannot open (`UnreadableTask`): an answer or a cancel decided on
    what it shows could be dropped while the row still waits for it. The text says why, naming the setting."""


class InvalidTransition(Exception):
    """A transition that the status machine does not allow (e.g. answering a working task)."""


class InvalidInputResponse(ValueError):
    """An answer to an outstanding input request that is not a JSON object."""


class DuplicateInputKeys(ValueError):
    """Input request keys are single-use over the task's whole life."""

    def __init__(self, keys: list[str]) -> None:
        used = ", ".join(sorted(keys))
        super().__init__(
            f"input request keys already used by this task: {used} (a job runs again once answered: ask only while "
            "the key is not in ctx.input_responses)"
        )
        self.keys = sorted(keys)


@dataclass(frozen=True)
class Run:
    """Which run of the job is writing: the dispatch (message generation) and Celery's attempt (0-based), of
    the task created at `born`.

    Signals from different processes arrive out of order; a write that names its
    run is refused (`Superseded`) once a newer dispatch or attempt exists, or once the
    row under its key is another task: an idempotency key's retry after its task expired
    creates the next task under the same key, with its counters from 1 again.
    `born` None: a message of a release that did not carry it (the dispatch decides alone).
    """

    dispatch: int
    attempt: int = 0
    born: int | None = None

    def of(self, record: TaskRecord) -> bool:
        """Whether this run was sent for `record`'s task (not an earlier task under the same key)."""
        return self.born is None or self.born == record.created_at


MAX_TOOL_NAME = 128
"""The longest tool name a task keeps (characters): MCP's guidance for tool names, and the store's column."""

MAX_STATUS_MESSAGE = 4096
"""The longest `statusMessage` a task keeps (characters): a longer one a job reports is cut, ending in "…".
Every `tasks/get` and notification carries it: it is a line for a person, not a payload."""


LONE_SURROGATE = re.compile("[\ud800-\udfff]")
"""A code point UTF-8 cannot encode (a str holds a valid pair as one code point: these are alone)."""


def shown_message(message: str) -> str:
    """`message` as a task keeps it: NUL (which PostgreSQL's text refuses) and a lone surrogate (which no
    database's UTF-8 takes) as U+FFFD, cut at the bound."""
    message = LONE_SURROGATE.sub("\ufffd", message.replace("\x00", "\ufffd"))
    return message if len(message) <= MAX_STATUS_MESSAGE else message[: MAX_STATUS_MESSAGE - 1] + "\u2026"


def _unshowable(message: str) -> bool:
    """Whether `shown_message` would change `message` (the common ASCII message is decided without a search)."""
    if len(message) > MAX_STATUS_MESSAGE or "\x00" in message:
        return True
    return not message.isascii() and LONE_SURROGATE.search(message) is not None


STARTED = "Started"
RESTARTED_AFTER_LOSS = "Started again after the worker was lost"
RESUMED = "Resumed with the answers"


def _progress_number(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"progress {name} must be a number, not {type(value).__name__}")
    try:
        number = float(value)
    except OverflowError:  # an int beyond any float
        number = math.inf
    if not math.isfinite(number):
        raise ValueError(f"progress {name} must be a finite number")
    if number < 0:
        raise ValueError(f"progress {name} must not be negative")
    return number


def checked_progress(current: float | None, total: float | None) -> tuple[float | None, float | None]:
    """Validate a job's numeric progress: finite, not negative; a `total` only beside a `current`."""
    if current is None:
        if total is not None:
            raise ValueError("progress total needs a current value: call progress(message, current, total)")
        return None, None
    return _progress_number("current", current), None if total is None else _progress_number("total", total)


def failure(message: str, data: Any = None) -> dict[str, Any]:
    """What a failed task records when the runtime fails it: a message and optional data.

    No protocol code: the wire renders it (as JSON-RPC -32603, see `protocol.render_error`).
    """
    error: dict[str, Any] = {"message": message}
    if data is not None:
        error["data"] = data
    return error


def new_task_id() -> str:
    """32 random bytes, base64url without padding: 43 header-safe characters."""
    return base64.urlsafe_b64encode(secrets.token_bytes(32)).rstrip(b"=").decode("ascii")


def derived_task_id(secret: bytes, owner: str | None, tool: str, idempotency_key: str) -> str:
    """The task id an idempotent creation gets: HMAC-SHA256 of the server's secret over the
    principal, the tool and the client's key, base64url like `new_task_id` (43 characters).

    The same caller retrying with the same key gets the same id on any replica that holds the
    secret, so the second INSERT meets the first row's key; another principal's id differs.
    Without the secret nobody can compute an id from a key, so the id stays a capability.
    """
    parts = ("" if owner is None else "p:" + owner, tool, idempotency_key)
    message = "\0".join(parts).encode("utf-8", "surrogatepass")
    digest = hmac.new(secret, b"celery-mcp-tasks idempotency\0" + message, hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


def task_key(task_id: str) -> str:
    """The row key for a task id: its SHA-256, hex. One-way, so the key opens nothing.

    Any string hashes, even one no UTF-8 encoder accepts (a lone surrogate is valid
    JSON): an id that cannot be ours simply matches no row.
    """
    return hashlib.sha256(task_id.encode("utf-8", "surrogatepass")).hexdigest()


# -- owners: who may see which task ---------------------------------------------------
#
# A task belongs to the principal that created it. The owner string says who vouched for the
# principal: `sub:<issuer>:<subject>` for a user, `client_id:<issuer>:<client id>` for a client
# acting for itself, each part percent-encoded (so no part holds a ':'): no client can pick a
# `client_id` that equals somebody's `sub`, and two issuers never share a namespace. None: the
# server runs without authentication (the task id alone protects the task).

OWNER_CLAIMS: Final = ("sub:", "client_id:")
"""The claim prefixes an owner string starts with."""
ANONYMOUS: Final = "anonymous"
"""How an owner-less task's owner is named (`owner_namespace`)."""


_DIGESTED = re.compile(r"sha256=[0-9a-f]{64}")
_ENCODED = re.compile(r"(?:[A-Za-z0-9_.~-]|%[0-9a-fA-F]{2})*")
"""An issuer as `quote(issuer, safe="")` writes it: unreserved characters and `%XX` escapes."""


MAX_OWNER: Final = 512
"""The longest owner string (the owner column's length): a longer one names its principal by a digest."""


def owner_of(issuer: str | None, *, subject: str | None = None, client_id: str | None = None) -> str | None:
    """The owner string of a principal: its subject's when it has one, else its client's, else None."""
    iss = quote(issuer or "", safe="")
    if subject:
        return _bounded(f"sub:{iss}", subject)
    if client_id:
        return _bounded(f"client_id:{iss}", client_id)
    return None


def owner_within(namespace: str, principal: str) -> str:
    """The owner string of `principal` (a subject, or a client id) within `namespace` (`sub:<issuer>` or
    `client_id:<issuer>`, its issuer written either way `spelled_namespace` takes): what `owner_of` makes."""
    return _bounded(spelled_namespace(namespace), principal)


def _bounded(namespace: str, principal: str) -> str:
    """`<namespace>:<principal, percent-encoded>`, at most `MAX_OWNER` characters: past that (a subject of
    hundreds of characters; percent-encoding triples every non-ASCII byte) the principal is named by its digest.
    A digest is `sha256=<hex>`: percent-encoding never leaves a `=`, so no principal's spelling equals one."""
    namespace = _fitting(namespace)
    owner = f"{namespace}:{quote(principal, safe='')}"
    return owner if len(owner) <= MAX_OWNER else f"{namespace}:{_digest(principal)}"


def _fitting(namespace: str) -> str:
    """A spelled namespace, its issuer named by its digest when it is too long to leave room for a digested
    principal beside it (an issuer of over 400 characters)."""
    if len(namespace) + 1 + _DIGEST_LEN <= MAX_OWNER:
        return namespace
    claim, _, issuer = namespace.partition(":")
    return f"{claim}:{_digest(issuer)}"


def _digest(text: str) -> str:
    return "sha256=" + hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


_DIGEST_LEN: Final = len("sha256=") + 64


def owner_namespace(owner: str | None) -> str:
    """`sub:<issuer>`, `client_id:<issuer>` or `anonymous`: who vouched for the owner, not who it is."""
    if owner is None:
        return ANONYMOUS
    for prefix in OWNER_CLAIMS:
        if owner.startswith(prefix):
            return owner.rsplit(":", 1)[0] if owner.count(":") >= 2 else prefix.rstrip(":")
    return "other"


def spelled_namespace(namespace: str) -> str:
    """A namespace as owner strings spell it (`sub:https%3A%2F%2Fidp`), given with its issuer either
    percent-encoded or as the identity provider writes it (`sub:https://idp`).

    An issuer holding only what the encoding leaves as it is, and `%` escapes, is taken as encoded (its
    escapes upper-cased, as `quote` writes them); any other is encoded, a `%` in it included. An issuer
    too long for the owner column is named by its digest, as owner strings name it (`_fitting`)."""
    for prefix in OWNER_CLAIMS:
        if namespace.startswith(prefix):
            issuer = namespace.removeprefix(prefix)
            if _DIGESTED.fullmatch(issuer):  # an issuer too long for the owner column, as owners spell it
                return namespace
            if _ENCODED.fullmatch(issuer):
                return _fitting(prefix + re.sub(r"%[0-9a-fA-F]{2}", lambda escape: escape[0].upper(), issuer))
            return _fitting(prefix + quote(issuer, safe=""))
    return namespace


def owner_bytes(owner: str | None) -> bytes:
    """The owner as a per-owner hash takes it (a quota's lock, a fair queue's shard): anonymous and
    every principal are distinct inputs, whatever the strings."""
    return b"\1" if owner is None else b"\2" + owner.encode("utf-8", "surrogatepass")


class _Any:
    __slots__ = ()

    def __repr__(self) -> str:
        return "ANY"


ANY: Final = _Any()
"""Owner wildcard for server-side callers (worker, janitor, an operator). Never from a request."""

Owner = str | None | _Any
OwnerScope = Literal["any", "none", "one"]


def owner_scope(owner: Owner) -> OwnerScope:
    """The owner rule, once: which tasks `owner` may see. `ANY` (server side) sees every task ("any");
    a request sees only its principal's tasks ("one"), and an anonymous request only owner-less tasks
    ("none"). Any other task answers exactly as a missing one."""
    if owner is ANY:
        return "any"
    return "none" if owner is None else "one"


_CELERY_ID_NAMESPACE = uuid.UUID("4f0b5a8e-9c1d-4e57-8a43-6d2c1e0f7b19")


def celery_message_id(record: TaskRecord) -> str:
    """The Celery message id of a row's current dispatch: derived (uuid5 of key, creation time and dispatch
    number), never stored. Lets a cancel revoke the current message, and an operator find it in Flower or a
    worker's log; a task created again under its key never shares an id (nor a revoke) with the last one."""
    return str(uuid.uuid5(_CELERY_ID_NAMESPACE, f"{record.key}:{record.created_at}:{record.dispatches}"))


def now_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass(frozen=True)
class TaskRecord:
    """One task as the store keeps it. `version` increases on every write."""

    key: str
    owner: str | None
    tool: str
    status: TaskStatus
    created_at: int
    updated_at: int
    ttl_ms: int | None
    poll_interval_ms: int | None = None
    status_message: str | None = None
    arguments: dict[str, Any] = field(default_factory=dict)
    input_requests: dict[str, Any] = field(default_factory=dict)
    input_responses: dict[str, Any] = field(default_factory=dict)
    issued_keys: tuple[str, ...] = ()
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    version: int = 1
    dispatches: int = 0
    heartbeat_at: int | None = None
    attempt: int = 0  # Celery attempt (retries) of the current dispatch, scheduled or running
    resends: int = 0  # the reaper's re-sends of the current run
    parked: bool = False  # a job blocks in `wait_for_input`: answering must not enqueue another
    started_at: int | None = None  # when a copy of the job claimed the current run (None: not yet)
    progress: float | None = None  # the job's last reported `current` (kept until the next report)
    progress_total: float | None = None  # the job's last reported `total` (None: unknown)
    trace_context: str | None = None  # W3C `traceparent` of the call that created the task (tracing on)
    caller: str | None = None  # an anonymous caller's quota identity (a hash of its address); None: the owner

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL

    @property
    def expires_at(self) -> int | None:
        return None if self.ttl_ms is None else self.created_at + self.ttl_ms

    def expired(self, at_ms: int) -> bool:
        expires = self.expires_at
        return expires is not None and at_ms >= expires

    @property
    def final_in_time(self) -> bool:
        """It reached its final state before its TTL ended: past the expiry, that state is still the last word a
        listen stream owes its client (a final state written later, a job finishing late, is not)."""
        return self.terminal and not self.expired(self.updated_at)

    @property
    def never_started(self) -> bool:
        """No copy of this dispatch's job has claimed it (a Celery retry also clears `started_at`: not this)."""
        return self.started_at is None and self.attempt == 0

    def stale(self, heartbeat_before_ms: int) -> bool:
        """`working` with no sign of life since the bound: its job was probably lost."""
        return self.status is TaskStatus.WORKING and (
            self.heartbeat_at is None or self.heartbeat_at < heartbeat_before_ms
        )

    def unanswered(self, changed_before_ms: int) -> bool:
        """`input_required` and unchanged since the bound (no answer, not even a partial one)."""
        return self.status is TaskStatus.INPUT_REQUIRED and self.updated_at < changed_before_ms

    # -- transitions -------------------------------------------------------------
    # Each returns the next record (version bumped) or raises. The store writes the
    # result only if the row still has `self.version`.

    def _next(self, at_ms: int, **changes: Any) -> TaskRecord:
        message = changes.get("status_message")
        if message and _unshowable(message):  # a job's text: see shown_message
            changes["status_message"] = shown_message(message)
        return replace(self, updated_at=max(at_ms, self.updated_at), version=self.version + 1, **changes)

    def _require_active(self, run: Run | None = None) -> None:
        if self.terminal:
            raise TerminalTask("task is already terminal")
        if run is not None and (run.dispatch != self.dispatches or run.attempt < self.attempt or not run.of(self)):
            raise Superseded("a newer run of the job owns this task")

    def with_progress(
        self,
        message: str | None,
        at_ms: int,
        run: Run | None = None,
        *,
        current: float | None = None,
        total: float | None = None,
    ) -> TaskRecord:
        """Show `message`; with `current` (and optionally `total`) also record numeric progress.

        A report with `current` replaces both numbers (`total` None: unknown); one
        without keeps the last numbers, so a message-only report never moves a
        progress bar backwards. A final state keeps them too (a failed or cancelled task
        shows how far it got), but `completed` fills a bar that had a total.
        """
        self._require_active(run)
        current, total = checked_progress(current, total)
        if current is None:
            return self._next(at_ms, status_message=message)
        return self._next(at_ms, status_message=message, progress=current, progress_total=total)

    def began(self, run: Run, at_ms: int, *, stale_before_ms: int) -> TaskRecord:
        """A copy of the job's message starts `run`: it claims the run (and beats), or it raises.

        `Superseded`: not the current run (an older dispatch or attempt, or any run while the task waits for
        input). `PastTtl`: past its TTL. `RunInProgress`: a second copy of the current run (a redelivery) while the claiming copy beats
        after `stale_before_ms`; once that beat is stale, this copy takes over. The status message says which
        start this is (`_start_message`), replacing the runtime's own word ("Queued", "Retrying ...") or that
        of a copy that is gone; unless it already says exactly that, `lastUpdatedAt` moves.
        """
        self._require_active(run)
        if self.status is not TaskStatus.WORKING:
            raise Superseded("no run is expected while the task waits for input")
        if self.expired(at_ms):  # not evicted yet (the janitor sweeps once an interval), but gone for its client
            raise PastTtl("the task expired before this run started")
        late_retry = run.attempt > self.attempt  # the retry signal is late (or was lost)
        if (
            not late_retry
            and self.started_at is not None
            and self.heartbeat_at is not None
            and self.heartbeat_at >= stale_before_ms
        ):
            raise RunInProgress("another copy of this run is running")
        message = self._start_message(run)
        changes: dict[str, Any] = {
            "attempt": run.attempt,
            "started_at": at_ms,
            "heartbeat_at": max(at_ms, self.heartbeat_at or 0),
        }
        if message == self.status_message:
            return replace(self, version=self.version + 1, **changes)
        return self._next(at_ms, status_message=message, **changes)

    def _start_message(self, run: Run) -> str:
        """Which start this is: a Celery retry, a run again after a lost worker, a run after answers, the first."""
        if run.attempt > 0:
            return f"Started (attempt {run.attempt + 1})"
        if self.started_at is not None or self.resends > 0:  # a stale copy taken over, or the reaper's re-send
            return RESTARTED_AFTER_LOSS
        if self.dispatches > 1:  # only an answer sends a new run without a resend
            return RESUMED
        return STARTED

    def retrying(self, run: Run, at_ms: int, start_by_ms: int, after: str | None = None) -> TaskRecord:
        """Attempt `run.attempt` is scheduled (a Celery retry), `after` the named failure (an exception's class).
        A late signal changes nothing.

        The heartbeat moves to the scheduled start, so a long countdown is not mistaken for a lost job.
        """
        self._require_active()
        if (
            run.dispatch != self.dispatches
            or run.attempt <= self.attempt
            or self.status is not TaskStatus.WORKING
            or not run.of(self)
        ):
            return self
        return self._next(
            at_ms,
            attempt=run.attempt,
            status_message=f"Retrying (attempt {run.attempt + 1})" + (f" after {after}" if after else ""),
            heartbeat_at=max(start_by_ms, self.heartbeat_at or 0),
            started_at=None,
        )

    def dispatched(self, at_ms: int, message: str | None = None, *, resend: bool = False) -> TaskRecord:
        """A send of the Celery message: a new run (`resend=False`) or the reaper's re-send of a lost one.

        Every send is a new dispatch number, so an older message still in flight is superseded.
        """
        self._require_active()
        changes = self._new_run(at_ms, resend=resend)
        if message is None:
            return replace(self, version=self.version + 1, **changes)
        return self._next(at_ms, status_message=message, **changes)

    def _new_run(self, at_ms: int, *, resend: bool = False) -> dict[str, Any]:
        """What a send records: the next dispatch number, its first attempt, not started, beating from now."""
        return {
            "dispatches": self.dispatches + 1,
            "heartbeat_at": at_ms,
            "attempt": 0,
            "resends": self.resends + 1 if resend else 0,
            "parked": False,
            "started_at": None,
        }

    def unparked(self) -> TaskRecord:
        """The blocked job gave up waiting: from now on an answer enqueues the job again."""
        self._require_active()
        if not self.parked:
            return self
        return replace(self, parked=False, version=self.version + 1)

    def completed(
        self, result: dict[str, Any], at_ms: int, message: str | None = None, run: Run | None = None
    ) -> TaskRecord:
        self._require_active(run)
        # The work is done: a job that said "section 3 of 3" before writing it did not say it again after.
        done = (
            max(self.progress, self.progress_total)
            if self.progress is not None and self.progress_total
            else self.progress
        )
        return self._next(
            at_ms,
            status=TaskStatus.COMPLETED,
            result=result,
            input_requests={},
            status_message=message,
            progress=done,
        )

    def failed(
        self, error: dict[str, Any], at_ms: int, message: str | None = None, run: Run | None = None
    ) -> TaskRecord:
        self._require_active(run)
        return self._next(
            at_ms,
            status=TaskStatus.FAILED,
            error=error,
            input_requests={},
            status_message=message if message is not None else str(error.get("message", "Failed")),
        )

    def cancelled(self, at_ms: int, message: str = CANCELLED_BY_CLIENT) -> TaskRecord:
        self._require_active()
        return self._next(at_ms, status=TaskStatus.CANCELLED, input_requests={}, status_message=message)

    def requiring_input(
        self,
        requests: dict[str, Any],
        at_ms: int,
        message: str | None = None,
        *,
        park: bool = False,
        run: Run | None = None,
    ) -> TaskRecord:
        """Ask for input. `park`: the asking job stays and waits, so answering must not enqueue it again."""
        self._require_active(run)
        if not requests:
            raise ValueError("require_input needs at least one input request")
        reused = [key for key in requests if key in self.issued_keys]
        if reused:
            raise DuplicateInputKeys(reused)
        return self._next(
            at_ms,
            status=TaskStatus.INPUT_REQUIRED,
            input_requests={**self.input_requests, **requests},
            issued_keys=self.issued_keys + tuple(requests),
            status_message=message,
            parked=park,
        )

    def answered(
        self,
        responses: dict[str, Any],
        at_ms: int,
        *,
        dispatch: bool = True,
        problem: Callable[[Mapping[str, Any], Any], str | None] | None = None,
    ) -> tuple[TaskRecord, bool]:
        """Record answers to outstanding keys (others are ignored).

        Returns the next record and whether the job must be enqueued again (back to `working`, no parked job
        waiting). With `dispatch` that new run is part of this transition: one write, one notification, no
        window in which the reaper sees a run never sent. Raises `InvalidTransition` when nothing outstanding
        was answered (callers skip the write), `InvalidInputResponse` when such an answer is not an object,
        or not what its request asks for: `problem(request, answer)` says why (the wire's result types: `protocol`).
        """
        if self.terminal or self.status is not TaskStatus.INPUT_REQUIRED:
            raise InvalidTransition("no input is outstanding")
        taken = {key: value for key, value in responses.items() if key in self.input_requests}
        for key, value in taken.items():
            if not isinstance(value, dict):
                raise InvalidInputResponse(f"the input response {key!r} must be an object")
        for key, answer in taken.items():
            why = None if problem is None else problem(self.input_requests[key], answer)
            if why is not None:
                method = self.input_requests[key].get("method")
                raise InvalidInputResponse(
                    f"the input response {key!r} is not an answer to its {method} request: {why}"
                )
        if not taken:
            raise InvalidTransition("no outstanding key was answered")
        remaining = {key: value for key, value in self.input_requests.items() if key not in taken}
        resumed = not remaining
        enqueue = resumed and not self.parked
        changes: dict[str, Any] = {
            "input_requests": remaining,
            "input_responses": {**self.input_responses, **taken},
            "status": TaskStatus.WORKING if resumed else TaskStatus.INPUT_REQUIRED,
            "status_message": "Resuming with the answers" if resumed else self.status_message,
            "parked": self.parked and not resumed,
        }
        if enqueue and dispatch:  # the new run, as `dispatched` records it
            changes.update(self._new_run(at_ms))
        return self._next(at_ms, **changes), enqueue


class UnreadableTask(TaskRecord):
    """A row this process cannot open (a retired or missing encryption key), as every reader sees it: `failed`,
    its status message saying why, its payloads left out. Nothing may be decided on it (`TaskUnreadable`)."""
