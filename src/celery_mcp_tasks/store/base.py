"""The `Store` contract: how task state is kept, whatever the database.

Records are keyed by the hash of the task id and never listed to a caller (deliberately no `list`). Every
read-modify-write is a compare-and-swap on the record's `version`, so a client's `tasks/update` can never
write `working` back over a worker's `completed`. A record owned by someone else reads as missing
(`model.owner_scope`); `ANY` is for server-side callers only (the worker, the janitor).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from celery_mcp_tasks.model import ANY as ANY
from celery_mcp_tasks.model import Owner as Owner
from celery_mcp_tasks.model import TaskRecord

if TYPE_CHECKING:
    from celery_mcp_tasks.store.ledger import Ledger
    from celery_mcp_tasks.store.rows import Filter, Overview, Page, Row


class TaskLimitReached(Exception):
    """The row cap is reached: no new task until the janitor evicts some."""


@dataclass(frozen=True)
class Quota:
    """What one principal may have of the store, decided in the creating transaction (None: unlimited).

    `active`: tasks not yet final; `active_tool`: of the tool being created; `creations`: within `window_ms`.
    """

    active: int | None = None
    active_tool: int | None = None
    creations: int | None = None
    window_ms: int = 60_000

    @property
    def unlimited(self) -> bool:
        return self.active is None and self.active_tool is None and self.creations is None


class QuotaExceeded(Exception):
    """A creation refused by its `Quota`; nothing was stored. `limit` names the field, `allowed` its value;
    `retry_after_ms`: when a retry can succeed (creations), or None (once a task ends)."""

    def __init__(self, limit: str, allowed: int, retry_after_ms: int | None, window_ms: int) -> None:
        super().__init__(limit)
        self.limit, self.allowed, self.retry_after_ms, self.window_ms = limit, allowed, retry_after_ms, window_ms


class TaskNotFound(LookupError):
    """No such task for this owner (missing and foreign look the same)."""


class StoreConflict(RuntimeError):
    """A compare-and-swap kept losing; the caller may retry later."""


class StoreUnavailable(RuntimeError):
    """The database could not be reached, or failed the operation.

    Its text is fixed: the database's own message (SQL, sometimes values) stays in the chained cause, for the
    server's log only, so whatever shows this exception (a client's error, a task's message) shows nothing of it.
    """

    MESSAGE = "The task store is unavailable"

    def __init__(self, operation: str = "", reason: str = "") -> None:
        super().__init__(self.MESSAGE)  # its repr too (Celery logs a job's exception so) names no method of ours
        self.operation = operation  # the store method, e.g. "update": for a log line
        self.reason = reason  # what a log line may say of the cause (`store.failures.loggable`), never values

    def __str__(self) -> str:
        return self.MESSAGE

    def __reduce__(self) -> tuple[type[StoreUnavailable], tuple[str, str]]:
        return type(self), (self.operation, self.reason)  # pickled between Celery's processes whole


Transition = Callable[[TaskRecord], TaskRecord]


@dataclass(frozen=True)
class ChangeHint:
    """A change hint sent in each write's own statement (PostgreSQL's `pg_notify`): delivered at its commit,
    never for a write that did not happen. `payload(record)`: its text, or None when no one can be listening."""

    channel: str
    payload: Callable[[TaskRecord], str | None]


def apply(transition: Transition, current: TaskRecord) -> TaskRecord:
    """The record `transition` makes of `current`: itself (nothing to write) or its next version."""
    nxt = transition(current)
    if nxt is not current and nxt.version != current.version + 1:
        raise ValueError("a transition must bump the version by exactly one")
    return nxt


@dataclass
class Eviction:
    """What one eviction removed: every row, and by tool the rows that were not final yet."""

    removed: int = 0
    unfinished: Counter[str] = field(default_factory=Counter)


class Store(Protocol):
    # Every method raises `StoreUnavailable` when the database fails it.

    def create(
        self,
        record: TaskRecord,
        *,
        max_rows: int | None,
        quota: Quota | None = None,
        idempotent: bool = False,
        durable: bool = True,
    ) -> TaskRecord:
        """Insert a new record; the record now stored under its key. Durable on return, unless not `durable`
        (as `update`'s: a task no caller learns of before a later durable write flushes it too).

        Raises `TaskLimitReached` at the cap, `QuotaExceeded` (decided under a lock per owner, across
        processes). `idempotent`: a row already under the key is returned, and nothing is written.
        """
        ...

    def get(self, key: str, owner: Owner = ANY) -> TaskRecord | None:
        """The record, or `None` when missing or owned by another principal."""
        ...

    def get_many(self, keys: Iterable[str], owner: Owner = ANY) -> dict[str, TaskRecord]:
        """`get` of many keys in one read: the records by key, those missing or another's left out."""
        ...

    def update(
        self,
        key: str,
        owner: Owner,
        transition: Transition,
        *,
        expected: TaskRecord | None = None,
        durable: bool = True,
    ) -> TaskRecord:
        """Atomically replace the record with `transition(record)` and return the new one.

        Raises `TaskNotFound`; anything `transition` raises propagates and leaves the record unchanged.
        `expected`: the record the caller last saw or wrote; while the row is at its version the transition
        is computed on it and written at once (no locking read), else on the row as it is now.
        `durable=False`: as atomic and visible as any write, but its return need not wait until it would
        survive a database crash (a run's claim: losing it only lets the run be claimed again).
        """
        ...

    def touch(
        self,
        key: str,
        at_ms: int,
        *,
        dispatch: int | None = None,
        born: int | None = None,
        unstarted: int | None = None,
    ) -> bool:
        """Set the heartbeat of an active record (of that dispatch, of the task created at `born`) without a
        version bump. `unstarted`: only while no copy of that attempt (or a later one) has started a run."""
        ...

    def versions(self, keys: Iterable[str]) -> dict[str, int]:
        """Current version of each existing key (used by the polling notifier)."""
        ...

    def evict(self, *, now_ms: int, retention_ms: int, batch_size: int, into: Eviction | None = None) -> Eviction:
        """Evict expired records in batches: how many went, and by tool those not final yet. `into`: the
        caller's tally, counted batch by batch (what committed stays counted when a later batch fails)."""
        ...

    def stale(self, *, heartbeat_before_ms: int, limit: int) -> list[TaskRecord]:
        """`working` records whose heartbeat is older than the bound (for the reaper)."""
        ...

    def unanswered(self, *, changed_before_ms: int, limit: int) -> list[str]:
        """Keys of `input_required` records unchanged since the bound (for the input timeout)."""
        ...

    def count_by_status(self) -> dict[str, int]:
        """How many records are in each status now (every status named)."""
        ...

    def ledger(self) -> Ledger:
        """The sweep ledger kept beside the tasks."""
        ...

    # The operators' console (`store.rows`): rows by key, never by task id.

    def browse(self, filter: Filter, sort: str, cursor: str | None, limit: int, *, now_ms: int) -> Page:
        """One keyset page of rows matching `filter` in `sort` order (`rows.SORTS`), after `cursor`
        (`BadFilter("cursor", ...)` when malformed or made for another sort)."""
        ...

    def overview(self, now_ms: int) -> Overview:
        """Counts by status and tool, the last hour per minute, the oldest active rows, the last sweep."""
        ...

    def rows(self, keys: Iterable[str], filter: Filter | None = None, *, now_ms: int | None = None) -> list[Row]:
        """The rows of these keys that exist (any owner) and match `filter` (ages counted back from
        `now_ms`, default now), in no particular order."""
        ...

    def keys_starting(self, prefix: str, *, limit: int) -> list[str]:
        """Row keys that start with `prefix` (lowercase hex digits), in order, at most `limit`."""
        ...

    def changed_since(self, updated_at_ms: int, *, limit: int) -> list[Row]:
        """Rows written at or after `updated_at_ms` (their `updated_at`), oldest first, at most `limit`."""
        ...

    def delete(self, key: str, *, expected: TaskRecord | None = None) -> bool:
        """Delete the row if it is final (completed, failed, cancelled) and, with `expected`, still that task (its
        creation time and version: not a later task under the same key): whether it was deleted."""
        ...

    def sign_out(self, session: str, expires_ms: int, *, now_ms: int) -> None:
        """Refuse the console session `session` from now until `expires_ms` (idempotent); forget the
        sessions already past their expiry (`now_ms`)."""
        ...

    def signed_out(self, session: str) -> bool:
        """Whether the console session `session` was signed out (and not yet forgotten)."""
        ...
