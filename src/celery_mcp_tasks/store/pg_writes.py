"""PostgreSQL writes (an update's compare-and-swap, a creation's INSERT) without Core's per-statement work.

`SqlStore.update` on SQLAlchemy Core is BEGIN, `SELECT ... FOR UPDATE`, UPDATE, the
hint's `pg_notify` and COMMIT: five round trips, three of them compiled Core
statements (~1.3 ms measured here, on a job's claim and again on its final write).
The first attempt of every update on psycopg is the same transaction, on the same
pooled connection, in four round trips:

1. BEGIN and `SELECT <row> WHERE key = ... [AND owner ...] FOR UPDATE`, a driver-level
   statement (no compilation): the record now, locked as on the locking path, so a
   concurrent writer waits for this one and a slow writer is never starved;
2. the transition computed, then one driver-level statement (psycopg prepares it once it
   has run a few times): `UPDATE ... WHERE key = ... AND version = <read>`, with the hint's `pg_notify`
   folded in (`WITH written AS (UPDATE ... RETURNING 1) SELECT pg_notify(...) FROM
   written`: no hint for a write that did not happen);
3. COMMIT through SQLAlchemy, so a connection lost during it is the same commit in
   doubt the locking path settles (`SqlStore._settle`).

The same transaction, lock, compare-and-swap on the version and hint at commit.
Both statements go through SQLAlchemy's driver-level execution, so its error handling,
events and the store's error metric see them. A connection found dead before the COMMIT
leaves nothing applied (the server rolls back what was not committed): it is
invalidated and the locking path runs, which reconnects. Any other database error is
`StoreUnavailable("update")` (`SqlStore`'s own wrapper).

A creation's INSERT (`SqlStore.create`) goes the same way: Core's own statement (with
the row cap's bounded count), compiled once, run driver-level in the store's
transaction, committed through SQLAlchemy.

What it writes is what SQLAlchemy writes: JSON columns as JSON (None as JSON
`null`), the same values from the same `_to_row`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Protocol

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from celery_mcp_tasks.model import TaskRecord
from celery_mcp_tasks.store.base import ANY, Owner, TaskNotFound, Transition, apply
from celery_mcp_tasks.store.schema import tasks

__all__ = ["FoldableHook", "PgWrites"]

logger = logging.getLogger("celery_mcp_tasks.store.sql")


class FoldableHook(Protocol):
    """A write hook that is one `pg_notify`: the fast path folds it into its UPDATE."""

    def __call__(self, conn: Any, record: TaskRecord) -> None: ...

    def pg_notify_args(self, record: TaskRecord) -> tuple[str, str] | None:
        """(channel, payload) for `record`'s write, or None when it sends no hint."""
        ...


def read_statements(engine: Engine, columns: list[str]) -> dict[str, str]:
    """The three owner shapes of a row read by key, compiled for psycopg (`%(name)s` parameters)."""
    by_key = sa.select(*(tasks.c[name] for name in columns)).where(tasks.c.key == sa.bindparam("key"))
    shapes = {
        "any": by_key,
        "none": by_key.where(tasks.c.owner.is_(None)),
        "owner": by_key.where(tasks.c.owner == sa.bindparam("owner")),
    }
    return {name: str(query.compile(dialect=engine.dialect)) for name, query in shapes.items()}


def read_params(key: str, owner: Owner, statements: dict[str, str]) -> tuple[str, dict[str, Any]]:
    if owner is None:
        return statements["none"], {"key": key}
    if isinstance(owner, str):
        return statements["owner"], {"key": key, "owner": owner}
    assert owner is ANY
    return statements["any"], {"key": key}


class PgWrites:
    """The statements, built once per store from the schema's own column list."""

    def __init__(
        self,
        engine: Engine,
        columns: list[str],
        from_row: Callable[[dict[str, Any]], TaskRecord],
        to_row: Callable[[TaskRecord], dict[str, Any]],
        insert_if_room: sa.Insert,
    ) -> None:
        quote = engine.dialect.identifier_preparer.quote
        # A creation: Core's own two INSERTs, compiled once (their casts included); no literal binds in them.
        self._insert = str(tasks.insert().compile(dialect=engine.dialect))
        capped = insert_if_room.compile(dialect=engine.dialect)
        assert set(capped.binds) <= {*tasks.c.keys(), "max_rows"}, "the capped INSERT must bind only its values"
        self._insert_if_room = str(capped)
        self._columns = columns
        self._from_row = from_row
        self._to_row = to_row
        self._reads = read_statements(engine, columns)
        self._json = {name for name in columns if isinstance(tasks.c[name].type, sa.JSON)}
        assignments = ", ".join(f"{quote(name)} = %({name})s" for name in columns if name != "key")
        update = (
            f"UPDATE {quote(tasks.name)} SET {assignments} "
            f"WHERE {quote('key')} = %(cas_key)s AND {quote('version')} = %(cas_version)s RETURNING 1"
        )
        self._update = update
        self._update_notifying = (
            f"WITH written AS ({update}) SELECT pg_notify(%(cas_channel)s, %(cas_payload)s) FROM written"
        )

    def swap(
        self,
        conn: sa.Connection,
        key: str,
        owner: Owner,
        transition: Transition,
        hook: FoldableHook | None,
        commit: Callable[[sa.Connection, TaskRecord, TaskRecord], None],
    ) -> TaskRecord | None:
        """One attempt on `conn` (no transaction begun): the record stored, or None when another writer
        won meanwhile or the connection was found dead before the COMMIT (nothing applied either way).

        Raises `TaskNotFound`, the transition's own errors, SQLAlchemy's `DBAPIError`, or what `commit` raises
        (a commit in doubt)."""
        sql, params = read_params(key, owner, self._reads)
        with conn.begin() as tx:
            try:
                found = conn.exec_driver_sql(sql + " FOR UPDATE", params).fetchone()
            except sa.exc.DBAPIError as exc:
                _lost(tx, exc)
                return None
            if found is None:
                raise TaskNotFound()
            current = self._from_row(dict(zip(self._columns, found, strict=True)))
            nxt = apply(transition, current)
            if nxt is current:
                tx.commit()  # nothing written; a ROLLBACK would also drop the connection's prepared statements
                return current
            bound = self._bound(key, current, nxt)
            hint = hook.pg_notify_args(nxt) if hook is not None else None
            if hint is not None:
                bound["cas_channel"], bound["cas_payload"] = hint
            try:
                sent = self._update if hint is None else self._update_notifying
                written = conn.exec_driver_sql(sent, bound).fetchone()  # psycopg prepares it after a few runs
            except sa.exc.DBAPIError as exc:
                _lost(tx, exc)
                return None
            if written is None:
                tx.rollback()
                return None
            commit(conn, current, nxt)
        return nxt

    def insert(self, conn: sa.Connection, row: dict[str, Any], max_rows: int | None) -> bool:
        """`row` inserted in `conn`'s transaction (not committed); False when the row cap left no room."""
        from psycopg.types.json import Json

        bound: dict[str, Any] = {name: Json(value) if name in self._json else value for name, value in row.items()}
        if max_rows is None:
            conn.exec_driver_sql(self._insert, bound)
            return True
        bound["max_rows"] = max_rows
        return conn.exec_driver_sql(self._insert_if_room, bound).fetchone() is not None

    def _bound(self, key: str, current: TaskRecord, nxt: TaskRecord) -> dict[str, Any]:
        from psycopg.types.json import Json

        values = self._to_row(nxt)
        del values["key"]
        bound = {name: Json(value) if name in self._json else value for name, value in values.items()}
        bound["cas_key"], bound["cas_version"] = key, current.version
        return bound


def _lost(tx: sa.RootTransaction, exc: sa.exc.DBAPIError) -> None:
    """A statement failed: on a connection the database dropped, nothing was committed, so the
    caller returns None and the locking path runs next, on a fresh one; any other failure is raised."""
    if not exc.connection_invalidated:
        raise exc
    logger.warning("store connection was lost (%s); retrying once", type(exc.orig).__name__)
    tx.rollback()  # of an invalidated connection: ends the transaction, sends nothing
