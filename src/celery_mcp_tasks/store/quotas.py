"""The limits on creating tasks: the row cap (`RowGauge`) and per-principal quotas, decided in the transaction
that creates the task (only when a quota is set).

A quota counts the principal's own rows, so no counter can drift. Two creations by one principal on two
replicas must not both see room for one: on PostgreSQL the transaction first takes an advisory lock named after
the principal (others never wait on it; its own creations queue there, each on a pooled connection), then
counts at READ COMMITTED (`SqlStore._locking`); on SQLite `BEGIN IMMEDIATE` serializes every writer. Each
count is bounded by its limit.
"""

from __future__ import annotations

import functools
import hashlib
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from celery_mcp_tasks.model import TaskRecord, owner_bytes
from celery_mcp_tasks.store.base import Quota, QuotaExceeded
from celery_mcp_tasks.store.ledger import SweepRecord
from celery_mcp_tasks.store.schema import UNFINISHED, tasks

_LOCK = sa.select(sa.func.pg_advisory_xact_lock(sa.bindparam("lock", type_=sa.BigInteger)))


def lock_caller(conn: Connection, record: TaskRecord) -> None:
    """Serialize this caller's quota-checked creations until the transaction ends (PostgreSQL), on 64 bits of a
    hash that no other use of advisory locks shares."""
    who = owner_bytes(record.owner) if record.owner is not None else owner_bytes(None) + (record.caller or "").encode()
    digest = hashlib.sha256(b"celery-mcp-tasks quota\0" + who).digest()
    conn.execute(_LOCK, {"lock": int.from_bytes(digest[:8], "big", signed=True)})


def _owner(anonymous: bool, per_client: bool = False) -> Any:
    """The caller's rows: its owner's, or an anonymous caller's (all of them, or one client's)."""
    if not anonymous:
        return tasks.c.owner == sa.bindparam("q_owner")
    if per_client:
        return sa.and_(tasks.c.owner.is_(None), tasks.c.caller == sa.bindparam("q_caller"))
    return tasks.c.owner.is_(None)


def bounded_count(limit: str, *where: Any) -> Any:
    """How many rows match, counting no further than the limit bound as `limit` (`LIMIT`, then `count`): the
    row cap's and each quota's count."""
    rows = sa.select(sa.literal_column("1")).select_from(tasks).where(*where).limit(sa.bindparam(limit)).subquery()
    return sa.select(sa.func.count()).select_from(rows).scalar_subquery()


ROOM_CHECK_S = 1.0
"""How old a process's count of the rows may be before its next creation counts them again (`RowGauge`)."""

BASE_REFRESH_S = 15.0
"""How old a process's reading of the janitor's last count of the rows (`RowBase`) may be before a creation that
counts reads it again (a sweep a minute by default: more often would read the same row)."""

BASE_MARGIN_MS = 5_000
"""Rows created up to this long before the janitor's sweep began are counted again on top of its count: the
creating hosts' clocks may trail the database's (whose clock the ledger keeps), and a creation stamped before
the count may commit after it."""


@dataclass(frozen=True)
class RowBase:
    """Where the row cap's count starts: the rows the janitor's last sweep counted (`statuses`, in the ledger),
    plus every row created since shortly before that sweep began (an index range on `created_at`): a sweep
    interval's creations, not the table (at a million rows the whole count took most of a second of the
    database's CPU each time). It errs high (a row deleted since counts until the next sweep's count is read; one
    created while the sweep ran counts twice), and low only for a creation committed more than `BASE_MARGIN_MS`
    after it was stamped or stamped by a clock trailing the database's by more."""

    rows: int
    since_ms: int | None  # None: no count to start from, every row is counted

    @classmethod
    def of(cls, sweep: SweepRecord | None) -> RowBase:
        """The base the ledger's janitor row gives (none recorded yet: count every row)."""
        if sweep is None or sweep.swept_at is None or not sweep.statuses:
            return cls(0, None)
        # From the sweep's start (the database's clock), before it counted: what its count missed, created and
        # committed after it, was stamped after that, unless its stamp came BASE_MARGIN_MS before its commit.
        return cls(sum(int(count) for count in sweep.statuses.values()), sweep.swept_at - BASE_MARGIN_MS)


class RowGauge:
    """A process's estimate of how many rows the store holds, for the row cap (`MCP_TASKS_MAX_ROWS`).

    The cap's count (`bounded_count`) walks the index entries of the rows created since the janitor last counted
    them all (`RowBase`; every row before its first sweep): about 2 ms of the database's CPU at 10,000 entries,
    more than the INSERT it guards. So a creation's INSERT counts the rows (`plan`) only
    when this process's last count is over `ROOM_CHECK_S` old or a tenth of the cap's creations of its own ago
    (that INSERT also returns what it counted), or when that count plus the rows this process created since
    comes within a tenth of the cap. A process that creates often counts once a second; one that creates
    seldom counts in each INSERT, as every creation once did: a creation is one statement either way. What
    other processes created since the last count is unseen: each can add about a tenth of the cap unseen, so
    several creating at once can pass the cap by about a tenth of it for each process beyond the first.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._rows: int | None = None  # at the last count; None: none yet
        self._mark = 0  # `_created` when the last count's creation was planned
        self._created = 0  # creations of this process that stored a row, ever
        self._counted_at = -math.inf  # when the last count was planned
        self._planned = 0  # `_created` then
        self._base: RowBase | None = None  # where the count starts, as last read from the ledger
        self._based_at = -math.inf  # when

    def plan(self, max_rows: int) -> tuple[bool, int | None]:
        """(whether this creation's INSERT counts the rows, and if it is to say what it counted: the mark to pass
        to `counted`)."""
        now = self._clock()
        tenth = max(1, max_rows // 10)
        with self._lock:
            stale = now - self._counted_at >= ROOM_CHECK_S or self._created - self._planned >= tenth
            if stale or self._rows is None:
                self._counted_at, self._planned = now, self._created  # the creations meanwhile go by the last count
                return True, self._created
            return self._rows + self._created - self._mark >= max_rows - tenth, None

    def counted(self, rows: int, mark: int) -> None:
        """What an INSERT planned with `mark` counted (the cap, when it found no room)."""
        with self._lock:
            if self._rows is None or mark >= self._mark:  # a count planned earlier than the last one is older
                self._rows, self._mark = rows, mark

    def uncounted(self) -> None:
        """The INSERT that was to count failed: the next creation counts."""
        with self._lock:
            self._counted_at = -math.inf

    def created(self) -> None:
        with self._lock:
            self._created += 1

    def base(self, read: Callable[[], RowBase]) -> RowBase:
        """Where this creation's count starts: the last base read, or `read()`'s when that is `BASE_REFRESH_S` old."""
        now = self._clock()
        with self._lock:
            if self._base is not None and now - self._based_at < BASE_REFRESH_S:
                return self._base
        base = read()
        with self._lock:
            self._base, self._based_at = base, now
        return base


@functools.cache
def _counts(anonymous: bool, per_client: bool, limits: tuple[str, ...]) -> Any:
    """One SELECT of the bounded counts of `limits` (built once per shape)."""
    mine = _owner(anonymous, per_client)
    # Unfinished (served by its partial index) and not past its TTL: an expired task nobody can read or cancel
    # any more must not hold a slot until the janitor deletes it.
    live = sa.and_(
        UNFINISHED,
        sa.or_(tasks.c.expires_at.is_(None), tasks.c.expires_at > sa.bindparam("q_now")),
    )
    where = {
        "creations": (mine, tasks.c.created_at > sa.bindparam("q_since")),
        "active_tool": (mine, live, tasks.c.tool == sa.bindparam("q_tool")),
        "active": (mine, live),
    }
    return sa.select(*(bounded_count(f"q_{limit}", *where[limit]) for limit in limits))


@functools.cache
def _nth_newest(anonymous: bool, per_client: bool) -> Any:
    """The creation time of the principal's n-th newest task in the window: when it leaves, there is room."""
    return (
        sa.select(tasks.c.created_at)
        .where(_owner(anonymous, per_client), tasks.c.created_at > sa.bindparam("q_since"))
        .order_by(tasks.c.created_at.desc())
        .offset(sa.bindparam("q_offset"))
        .limit(1)
    )


def refusal(conn: Connection, record: TaskRecord, quota: Quota) -> QuotaExceeded | None:
    """Why `quota` refuses `record` now (the rate, else the first active limit reached), or None when there is room."""
    anonymous = record.owner is None
    per_client = anonymous and record.caller is not None
    params: dict[str, Any] = {"q_since": record.created_at - quota.window_ms, "q_now": record.created_at}
    if not anonymous:
        params["q_owner"] = record.owner
    if per_client:
        params["q_caller"] = record.caller
    # The creation rate first: when it is reached too, a retry once a task ends would be refused
    # again, so the refusal a client can act on is the rate's, with its time to retry.
    limits = (("creations", quota.creations), ("active_tool", quota.active_tool), ("active", quota.active))
    checks = [(limit, allowed) for limit, allowed in limits if allowed is not None]
    params.update({f"q_{limit}": allowed for limit, allowed in checks})
    if quota.active_tool is not None:
        params["q_tool"] = record.tool
    counts = conn.execute(_counts(anonymous, per_client, tuple(limit for limit, _ in checks)), params).one()
    for (limit, allowed), count in zip(checks, counts, strict=True):
        if count < allowed:
            continue
        retry_after_ms = None
        if limit == "creations":
            params["q_offset"] = allowed - 1
            leaving = conn.execute(_nth_newest(anonymous, per_client), params).scalar()
            # Never past the window: another host's clock ahead of this one's would make it so.
            retry_after_ms = (
                1 if leaving is None else min(max(leaving + quota.window_ms - record.created_at, 1), quota.window_ms)
            )
        return QuotaExceeded(limit, allowed, retry_after_ms, quota.window_ms)
    return None
