"""`SqlStore`: the `Store` on SQLAlchemy Core, for SQLite and PostgreSQL alike.

Every transition is read, computed (a pure `TaskRecord` method) and written
with `UPDATE ... WHERE key = :key AND version = :version`; a rowcount of 0
means another writer won, and the transition is recomputed from the fresh
row. That is correct on both databases in every isolation mode, unlike
`SELECT ... FOR UPDATE`, which SQLite silently ignores.

A dropped connection is retried once, but never past a COMMIT whose outcome is
unknown: `create` and `update` then read what the row became (so a retried
answer cannot be applied twice, nor a created row be inserted twice). Every
failure leaves the store as `StoreUnavailable`, whose text names nothing of SQL.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import fields
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from celery_mcp_tasks.model import TERMINAL, TaskRecord, TaskStatus
from celery_mcp_tasks.store.base import (
    ANY,
    Owner,
    StoreConflict,
    StoreUnavailable,
    TaskLimitReached,
    TaskNotFound,
    Transition,
    apply,
)
from celery_mcp_tasks.store.cleanup import Eviction, evict
from celery_mcp_tasks.store.engine import READ_ONLY, create_store_engine
from celery_mcp_tasks.store.schema import tasks

logger = logging.getLogger(__name__)

WriteHook = Callable[[Connection, TaskRecord], None]
"""Runs inside the writing transaction (e.g. `pg_notify`, delivered at commit)."""

_MAX_CAS_ATTEMPTS = 64
_COLUMNS = [f.name for f in fields(TaskRecord)]
_TERMINAL_VALUES = [status.value for status in TERMINAL]


F = TypeVar("F", bound=Callable[..., Any])


def _reconnecting(method: F) -> F:
    """Run again, once, when the database dropped the pooled connection (a restart, a failover).

    The pool does not ping before every checkout (a round trip on the hot path);
    instead the first statement on a dead connection fails, SQLAlchemy invalidates
    the pool, and the operation is retried on a fresh connection. That is safe for
    work the server never committed (it rolls back a transaction whose connection is
    gone) and for idempotent writes. A connection lost *during* a COMMIT is another
    matter: `_commit` reports it as `_CommitInDoubt`, which is never retried blindly.
    """

    @functools.wraps(method)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return method(*args, **kwargs)
        except sa.exc.DBAPIError as exc:
            if not exc.connection_invalidated:
                raise
            logger.warning("store connection was lost (%s); retrying once", type(exc.orig).__name__)
            return method(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


def _reported(method: F) -> F:
    """The store's failures leave it as `StoreUnavailable`: a fixed text, the database's own in the cause."""
    operation = method.__name__

    @functools.wraps(method)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return method(*args, **kwargs)
        except _CommitInDoubt as doubt:
            raise StoreUnavailable(operation) from doubt.cause
        except sa.exc.SQLAlchemyError as exc:
            raise StoreUnavailable(operation) from exc

    return wrapper  # type: ignore[return-value]


class _CommitInDoubt(Exception):
    """The connection was lost while COMMIT was in flight: applied or not, nobody knows yet.

    `before` and `after` are the record read and the record written, for a compare-and-swap.
    """

    def __init__(self, cause: BaseException, before: TaskRecord | None = None, after: TaskRecord | None = None) -> None:
        super().__init__("the outcome of a COMMIT is unknown")
        self.cause = cause
        self.before = before
        self.after = after


def _commit(conn: Connection, before: TaskRecord | None = None, after: TaskRecord | None = None) -> None:
    try:
        conn.commit()
    except sa.exc.DBAPIError as exc:
        if not exc.connection_invalidated:
            raise
        raise _CommitInDoubt(exc, before, after) from exc


def _same(a: TaskRecord, b: TaskRecord) -> bool:
    """Equal as stored (JSON values compared as JSON: a tuple written reads back as a list)."""

    def stored(record: TaskRecord) -> str:
        return json.dumps(_to_row(record), sort_keys=True, default=str)

    return stored(a) == stored(b)


def _insert_if_room() -> sa.Insert:
    """`INSERT ... SELECT :values WHERE (bounded count) < :max_rows RETURNING key`, built once.

    RETURNING rather than rowcount: psycopg reports -1 for INSERT ... SELECT.
    """
    capped = sa.select(sa.literal_column("1")).select_from(tasks).limit(sa.bindparam("max_rows")).subquery()
    room = sa.select(sa.func.count()).select_from(capped).scalar_subquery() < sa.bindparam("max_rows")
    values = sa.select(*(sa.bindparam(c.name, type_=c.type).label(c.name) for c in tasks.columns)).where(room)
    return tasks.insert().from_select([c.name for c in tasks.columns], values).returning(tasks.c.key)


_INSERT_IF_ROOM = _insert_if_room()


def _to_row(record: TaskRecord) -> dict[str, Any]:
    row = {name: getattr(record, name) for name in _COLUMNS}
    row["status"] = record.status.value
    row["issued_keys"] = list(record.issued_keys)
    row["expires_at"] = record.expires_at
    return row


def _from_row(row: Mapping[Any, Any]) -> TaskRecord:
    values = {name: row[name] for name in _COLUMNS}
    values["status"] = TaskStatus(values["status"])
    values["issued_keys"] = tuple(values["issued_keys"] or ())
    for name in ("arguments", "input_requests", "input_responses"):
        values[name] = values[name] or {}
    return TaskRecord(**values)


def _owner_clause(owner: Owner) -> sa.ColumnElement[bool] | None:
    if owner is ANY:
        return None
    if owner is None:
        return tasks.c.owner.is_(None)
    return tasks.c.owner == owner


class SqlStore:
    """The durable store. Thread-safe; share one per process (one engine, one pool)."""

    def __init__(self, engine: Engine, *, write_hook: WriteHook | None = None) -> None:
        self.engine = engine
        self.write_hook = write_hook
        # PostgreSQL reads in autocommit: one statement, one round trip (not BEGIN, SELECT, ROLLBACK).
        self._reads = {READ_ONLY: True, **({"isolation_level": "AUTOCOMMIT"} if self.dialect == "postgresql" else {})}

    @classmethod
    def from_url(cls, url: str, **engine_kwargs: Any) -> SqlStore:
        return cls(create_store_engine(url, **engine_kwargs))

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    def create_schema(self) -> None:
        """Create the tables directly (tests, throwaway databases). Production uses alembic."""
        tasks.metadata.create_all(self.engine)

    def dispose(self) -> None:
        self.engine.dispose()

    # -- reads ---------------------------------------------------------------------

    @_reported
    @_reconnecting
    def get(self, key: str, owner: Owner = ANY) -> TaskRecord | None:
        with self.engine.connect().execution_options(**self._reads) as conn:
            row = self._select(conn, key, owner)
            conn.rollback()
        return row

    def _select(self, conn: Connection, key: str, owner: Owner, *, for_update: bool = False) -> TaskRecord | None:
        query = sa.select(tasks).where(tasks.c.key == key)
        if for_update:
            # PostgreSQL: the read blocks until a concurrent writer commits, so the CAS
            # below almost never loses (without it a fast writer can starve a slow one).
            # SQLite: a no-op; BEGIN IMMEDIATE already serializes the transaction.
            query = query.with_for_update()
        clause = _owner_clause(owner)
        if clause is not None:
            query = query.where(clause)
        row = conn.execute(query).mappings().first()
        return None if row is None else _from_row(row)

    @_reported
    @_reconnecting
    def versions(self, keys: Iterable[str]) -> dict[str, int]:
        wanted = list(keys)
        if not wanted:
            return {}
        with self.engine.connect().execution_options(**self._reads) as conn:
            rows = conn.execute(sa.select(tasks.c.key, tasks.c.version).where(tasks.c.key.in_(wanted))).all()
            conn.rollback()
        return dict(rows)

    @_reported
    @_reconnecting
    def stale(self, *, heartbeat_before_ms: int, limit: int) -> list[TaskRecord]:
        query = (
            sa.select(tasks)
            .where(tasks.c.status == TaskStatus.WORKING.value)
            .where(sa.or_(tasks.c.heartbeat_at.is_(None), tasks.c.heartbeat_at < heartbeat_before_ms))
            .limit(limit)
        )
        with self.engine.connect().execution_options(**self._reads) as conn:
            rows = conn.execute(query).mappings().all()
            conn.rollback()
        return [_from_row(row) for row in rows]

    # -- writes --------------------------------------------------------------------

    @_reported
    def create(self, record: TaskRecord, *, max_rows: int | None) -> None:
        """Insert; at the cap, refuse. One statement: the row goes in only if there is room.

        The count is bounded (it never scans more rows than the cap) and part of
        the INSERT itself, so the hot path pays one round trip, not two. Under
        concurrency the cap is approximate by at most the number of racing creates.
        A connection lost during the COMMIT is settled by reading the row: there
        with this content, the create succeeded; absent, it is inserted again.
        """
        try:
            self._insert(record, max_rows)
            return
        except _CommitInDoubt as doubt:
            lost = doubt
        logger.warning("store connection was lost during a COMMIT (create); checking whether it was applied")
        found = self.get(record.key)
        if found is None:
            try:
                self._insert(record, max_rows)
                return
            except sa.exc.IntegrityError:  # the lost COMMIT landed meanwhile
                found = self.get(record.key)
        if found is None or not _same(found, record):
            raise lost.cause

    @_reconnecting
    def _insert(self, record: TaskRecord, max_rows: int | None) -> None:
        row = _to_row(record)
        with self.engine.connect() as conn:
            conn.begin()
            if max_rows is None:
                conn.execute(tasks.insert(), row)
            elif conn.execute(_INSERT_IF_ROOM, {**row, "max_rows": max_rows}).first() is None:
                raise TaskLimitReached()
            if self.write_hook is not None:
                self.write_hook(conn, record)
            _commit(conn)

    @_reported
    def update(self, key: str, owner: Owner, transition: Transition) -> TaskRecord:
        for _ in range(_MAX_CAS_ATTEMPTS):
            try:
                written = self._swap(key, owner, transition)
            except _CommitInDoubt as doubt:
                written = self._settle(doubt)
            if written is not None:
                return written
        raise StoreConflict("the task kept changing under this write; try again")

    @_reconnecting
    def _swap(self, key: str, owner: Owner, transition: Transition) -> TaskRecord | None:
        """One compare-and-swap: the record now stored, or None when another writer won (recompute)."""
        with self.engine.connect() as conn:
            conn.begin()
            current = self._select(conn, key, owner, for_update=True)
            if current is None:
                raise TaskNotFound()
            nxt = apply(transition, current)
            if nxt is current:
                conn.rollback()
                return current
            row = _to_row(nxt)
            del row["key"]
            written = conn.execute(
                tasks.update().where(tasks.c.key == key).where(tasks.c.version == current.version).values(**row)
            ).rowcount
            if written != 1:
                conn.rollback()
                return None
            if self.write_hook is not None:
                self.write_hook(conn, nxt)
            _commit(conn, current, nxt)
        return nxt

    def _settle(self, doubt: _CommitInDoubt) -> TaskRecord | None:
        """After a COMMIT lost in flight: the written record if it was applied, None if it was not.

        Decided on the row as it is once the lost transaction is resolved (the
        locking read waits for it on PostgreSQL). Versions only grow, one per write:
        still at the version read, nothing was applied; at the version written, it
        is ours exactly when it holds what we wrote. Further along, nobody can tell,
        and the write fails rather than being applied twice.
        """
        before, after = doubt.before, doubt.after
        assert before is not None and after is not None
        logger.warning("store connection was lost during a COMMIT (update); checking whether it was applied")
        found = self._locked(after.key)
        if found is None:
            raise TaskNotFound()
        if found.version == before.version:
            return None
        if found.version == after.version:
            return after if _same(found, after) else None
        raise doubt.cause

    @_reported
    @_reconnecting
    def _locked(self, key: str) -> TaskRecord | None:
        with self.engine.begin() as conn:
            return self._select(conn, key, ANY, for_update=True)

    @_reported
    @_reconnecting
    def touch(self, key: str, at_ms: int, *, dispatch: int | None = None) -> bool:
        """Record a heartbeat: one conditional UPDATE, no version bump (liveness is not a change
        clients see), never moving it backwards. False when the task is final, gone, or (with
        `dispatch`) owned by a newer run. Idempotent, so retried even after a lost COMMIT."""
        query = tasks.update().where(tasks.c.key == key).where(tasks.c.status.not_in(_TERMINAL_VALUES))
        if dispatch is not None:
            query = query.where(tasks.c.dispatches == dispatch)
        later = sa.case((tasks.c.heartbeat_at > at_ms, tasks.c.heartbeat_at), else_=sa.literal(at_ms))
        with self.engine.begin() as conn:
            return conn.execute(query.values(heartbeat_at=later)).rowcount == 1

    def cleanup(self, *, now_ms: int, retention_ms: int, batch_size: int) -> int:
        """Delete expired rows in bounded batches (`store.cleanup.evict`); how many went."""
        return self.evict(now_ms=now_ms, retention_ms=retention_ms, batch_size=batch_size).removed

    @_reported
    def evict(self, *, now_ms: int, retention_ms: int, batch_size: int) -> Eviction:
        """`cleanup`, telling also which rows went before their task was final (by tool)."""
        tally = Eviction()  # outside the retry: batches committed before a dropped connection stay counted
        self._evict(tally, now_ms=now_ms, retention_ms=retention_ms, batch_size=batch_size)
        return tally

    @_reconnecting
    def _evict(self, tally: Eviction, *, now_ms: int, retention_ms: int, batch_size: int) -> None:
        evict(self.engine, tally, now_ms=now_ms, retention_ms=retention_ms, batch_size=batch_size)
