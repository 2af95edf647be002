"""The sweep ledger on SQL: when each sweeping duty last ran, what it did, and who may run it next.

Its contract and row (`Ledger`, `SweepRecord`) are `store.ledger`'s; the janitor's reads of the tasks it sweeps
(`count_by_status`, `unanswered`) live here too.

A janitor that stops must be visible: every sweep records itself here (time,
duration, counts, the tasks in each status), so `/readyz`, the metrics and
`doctor` read its age from the store instead of trusting that a `celery beat`
is somewhere. The same row is the claim that lets many in-worker janitors
sweep once per interval between them: `claim` is one atomic upsert whose
`WHERE` admits a claimant only when the last claim is an interval old, so of
N workers asking at once exactly one wins (PostgreSQL re-checks the condition
on the row it waited for; SQLite's `BEGIN IMMEDIATE` serializes the writers).

Every time in this table is the database's clock, read inside the statement
(`claimed_at`, `swept_at`, and `read_at` on a read), never the caller's: the
claimants and the readers (web, `doctor`, metrics) run on hosts whose clocks
differ, and a claimant whose clock is behind would otherwise stamp an old claim
that lets another worker sweep again early.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Engine, RowMapping

from celery_mcp_tasks.model import TaskStatus
from celery_mcp_tasks.store.engine import READ_ONLY
from celery_mcp_tasks.store.failures import _reconnecting, _reported
from celery_mcp_tasks.store.ledger import SweepRecord
from celery_mcp_tasks.store.schema import sweeps, tasks

__all__ = [
    "JANITOR",
    "SweepLedger",
    "count_by_status",
    "db_now_ms",
    "read_sweep",
    "unanswered",
]

JANITOR = "janitor"
"""The janitor's row in the ledger."""


def db_now_ms(dialect: str) -> sa.ColumnElement[int]:
    """The database's clock in epoch ms, as a SQL expression (floored, like `model.now_ms`)."""
    if dialect == "postgresql":
        return sa.literal_column("floor(extract(epoch from clock_timestamp()) * 1000)::bigint", sa.BigInteger)
    if dialect == "sqlite":  # 'now' has millisecond precision and is one value for the whole statement
        return sa.literal_column("CAST(round((julianday('now') - 2440587.5) * 86400000) AS INTEGER)", sa.BigInteger)
    raise NotImplementedError(f"the sweep ledger supports PostgreSQL and SQLite, not {dialect}")


def read_sweep(conn: sa.Connection, name: str = JANITOR) -> SweepRecord | None:
    """`name`'s row and the database's clock, in one statement on `conn` (the caller owns the transaction)."""
    query = sa.select(sweeps, db_now_ms(conn.dialect.name).label("read_at")).where(sweeps.c.name == name)
    row = conn.execute(query).mappings().first()
    return None if row is None else _from_row(row)


def _from_row(row: RowMapping) -> SweepRecord:
    return SweepRecord(
        name=row["name"],
        swept_at=row["swept_at"],
        duration_ms=row["duration_ms"],
        sweeps=int(row["sweeps"] or 0),
        report=dict(row["report"] or {}),
        statuses=dict(row["statuses"] or {}),
        claimed_at=row["claimed_at"],
        claimed_by=row["claimed_by"],
        read_at=row.get("read_at"),
    )


def _upsert(engine: Engine, values: dict[str, Any]) -> Any:
    """`INSERT ... ON CONFLICT (name)` in the engine's dialect (both speak it, spelled alike)."""
    if engine.dialect.name == "postgresql":
        return postgresql.insert(sweeps).values(**values)
    if engine.dialect.name == "sqlite":
        return sqlite.insert(sweeps).values(**values)
    raise NotImplementedError(f"the sweep ledger supports PostgreSQL and SQLite, not {engine.dialect.name}")


class SweepLedger:
    """The `sweeps` table on the store's engine. Thread-safe; every call is one short transaction.

    Failures leave as `StoreUnavailable` (operation "last", "claim" or "record"), as the store's do.
    """

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    @_reported
    @_reconnecting
    def last(self, name: str = JANITOR) -> SweepRecord | None:
        with self.engine.connect().execution_options(**{READ_ONLY: True}) as conn:
            record = read_sweep(conn, name)
            conn.rollback()
        return record

    @_reported
    @_reconnecting
    def claim(self, name: str, *, interval_ms: int, by: str) -> bool:
        """Take the duty for this interval: True for exactly one of any number of claimants at once.

        Inserts the row when there is none; otherwise moves the claim only when the
        last one is at least `interval_ms` old, both times read from the database's
        clock. A claimant whose sweep then fails simply holds the interval; the next
        interval is anyone's again. A retry after a lost connection may answer False
        for a claim that landed: one missed interval, never two sweeps.
        """
        now = db_now_ms(self.engine.dialect.name)
        stmt = _upsert(self.engine, {"name": name, "claimed_at": now, "claimed_by": by[:128], "sweeps": 0})
        stmt = stmt.on_conflict_do_update(
            index_elements=[sweeps.c.name],
            set_={"claimed_at": stmt.excluded.claimed_at, "claimed_by": stmt.excluded.claimed_by},
            where=sa.or_(sweeps.c.claimed_at.is_(None), sweeps.c.claimed_at <= stmt.excluded.claimed_at - interval_ms),
        ).returning(sweeps.c.name)
        with self.engine.begin() as conn:  # RETURNING, not rowcount: psycopg reports -1 for an upsert
            return conn.execute(stmt).first() is not None

    @_reported
    @_reconnecting
    def record(
        self,
        name: str,
        *,
        duration_ms: int,
        report: dict[str, int],
        statuses: dict[str, int],
    ) -> None:
        """A sweep that just ended after `duration_ms`: the row now shows it, and `sweeps` counts it.

        `swept_at` (when it began) is the database's clock minus `duration_ms`: one
        clock for every writer and reader, whatever the hosts' own clocks say.
        """
        values = {
            "swept_at": db_now_ms(self.engine.dialect.name) - duration_ms,
            "duration_ms": duration_ms,
            "report": dict(report),
            "statuses": dict(statuses),
        }
        stmt = _upsert(self.engine, {"name": name, "sweeps": 1, **values})
        stmt = stmt.on_conflict_do_update(
            index_elements=[sweeps.c.name],
            set_={**{key: stmt.excluded[key] for key in values}, "sweeps": sweeps.c.sweeps + 1},
        )
        with self.engine.begin() as conn:
            conn.execute(stmt)


@_reported
@_reconnecting
def count_by_status(engine: Engine) -> dict[str, int]:
    """Tasks in each status right now, every status named (0 when none): one `GROUP BY` on the status."""
    counts = {status.value: 0 for status in TaskStatus}
    query = sa.select(tasks.c.status, sa.func.count()).group_by(tasks.c.status)
    with engine.connect().execution_options(**{READ_ONLY: True}) as conn:
        for status, count in conn.execute(query).all():
            counts[str(status)] = int(count)
        conn.rollback()
    return counts


@_reported
@_reconnecting
def unanswered(engine: Engine, *, changed_before_ms: int, limit: int) -> list[str]:
    """Row keys of `input_required` tasks unchanged since the bound, for the input timeout (walks
    the (status, updated_at) index). Only keys: the janitor decides each inside a compare-and-swap."""
    query = (
        sa.select(tasks.c.key)
        .where(tasks.c.status == TaskStatus.INPUT_REQUIRED.value)
        .where(tasks.c.updated_at < changed_before_ms)
        .limit(limit)
    )
    with engine.connect().execution_options(**{READ_ONLY: True}) as conn:
        keys = list(conn.execute(query).scalars())
        conn.rollback()
    return keys
