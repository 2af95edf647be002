"""The janitor's SQL: the sweep ledger (`store.ledger`'s contract), eviction, and its reads of the tasks.

Every sweep records itself in the ledger, so `/readyz`, the metrics and `doctor` read the janitor's age from the
store. The same row is the claim that lets many in-worker janitors sweep once per interval between them. Every
time in that table is the database's clock, read inside the statement, never a caller's: hosts' clocks differ,
and a claimant whose clock is behind would stamp an old claim that lets another worker sweep again early.
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from celery_mcp_tasks.model import TERMINAL_VALUES, TaskStatus
from celery_mcp_tasks.store.base import Eviction
from celery_mcp_tasks.store.engine import read, upsert
from celery_mcp_tasks.store.failures import _operation, _reconnecting
from celery_mcp_tasks.store.ledger import JANITOR as JANITOR
from celery_mcp_tasks.store.ledger import SweepRecord
from celery_mcp_tasks.store.schema import sweeps, tasks


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
    if row is None:
        return None
    return SweepRecord(
        name=row["name"],
        swept_at=row["swept_at"],
        duration_ms=row["duration_ms"],
        sweeps=int(row["sweeps"] or 0),
        report=dict(row["report"] or {}),
        statuses=dict(row["statuses"] or {}),
        claimed_at=row["claimed_at"],
        claimed_by=row["claimed_by"],
        read_at=row["read_at"],
    )


class SweepLedger:
    """The `sweeps` table on the store's engine. Thread-safe; every call is one short transaction."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    @_operation
    def last(self, name: str = JANITOR) -> SweepRecord | None:
        return read(self.engine, read_sweep, name)

    @_operation
    def claim(self, name: str, *, interval_ms: int, by: str) -> bool:
        """One upsert that moves the claim only when the last one is `interval_ms` old on the database's clock
        (PostgreSQL re-checks the condition on the row it waited for; SQLite's `BEGIN IMMEDIATE` serializes).
        A retry after a lost connection may answer False for a claim that landed: one missed interval, never
        two sweeps."""
        now = db_now_ms(self.engine.dialect.name)
        stmt = upsert(self.engine, sweeps).values(name=name, claimed_at=now, claimed_by=by[:128], sweeps=0)
        stmt = stmt.on_conflict_do_update(
            index_elements=[sweeps.c.name],
            set_={"claimed_at": stmt.excluded.claimed_at, "claimed_by": stmt.excluded.claimed_by},
            where=sa.or_(sweeps.c.claimed_at.is_(None), sweeps.c.claimed_at <= stmt.excluded.claimed_at - interval_ms),
        ).returning(sweeps.c.name)
        with self.engine.begin() as conn:  # RETURNING, not rowcount: psycopg reports -1 for an upsert
            return conn.execute(stmt).first() is not None

    @_operation
    def record(
        self,
        name: str,
        *,
        duration_ms: int,
        report: dict[str, int],
        statuses: dict[str, int],
        swept_at: int | None = None,
    ) -> None:
        """`swept_at` (when it began, on the database's clock): the caller's, else the database's clock minus
        `duration_ms` (later than the sweep began by however long this call waited for a connection)."""
        values = {
            "swept_at": db_now_ms(self.engine.dialect.name) - duration_ms if swept_at is None else swept_at,
            "duration_ms": duration_ms,
            "report": dict(report),
            "statuses": dict(statuses),
        }
        stmt = upsert(self.engine, sweeps).values(name=name, sweeps=1, **values)
        stmt = stmt.on_conflict_do_update(
            index_elements=[sweeps.c.name],
            set_={**{key: stmt.excluded[key] for key in values}, "sweeps": sweeps.c.sweeps + 1},
        )
        with self.engine.begin() as conn:
            conn.execute(stmt)


@_operation
def count_by_status(engine: Engine) -> dict[str, int]:
    """Tasks in each status right now, every status named (0 when none): one `GROUP BY` on the status."""
    counts = {status.value: 0 for status in TaskStatus}
    query = sa.select(tasks.c.status, sa.func.count()).group_by(tasks.c.status)
    for status, count in read(engine, lambda conn: conn.execute(query).all()):
        counts[str(status)] = int(count)
    return counts


@_operation
def unanswered(engine: Engine, *, changed_before_ms: int, limit: int) -> list[str]:
    """Row keys of `input_required` tasks unchanged since the bound, for the input timeout (walks
    the (status, updated_at) index). Only keys: the janitor decides each inside a compare-and-swap."""
    query = (
        sa.select(tasks.c.key)
        .where(tasks.c.status == TaskStatus.INPUT_REQUIRED.value)
        .where(tasks.c.updated_at < changed_before_ms)
        .limit(limit)
    )
    return read(engine, lambda conn: list(conn.execute(query).scalars()))


@_reconnecting
def evict(engine: Engine, tally: Eviction, *, now_ms: int, retention_ms: int, batch_size: int) -> None:
    """Delete expired rows into `tally` (the caller's: batches committed before a dropped connection stay counted).

    First the TTL pass (walking the `expires_at` index), then final rows without a TTL past the retention, each a
    `DELETE ... WHERE key IN (SELECT key ... LIMIT n) RETURNING tool, status` per short transaction: RETURNING says
    which were unfinished at no extra read, and on PostgreSQL `FOR UPDATE SKIP LOCKED` gives two janitors disjoint
    batches and skips a row a writer holds, so its final status and this count never disagree.
    """
    expired = tasks.c.expires_at <= now_ms
    retained = sa.and_(
        tasks.c.status.in_(TERMINAL_VALUES), tasks.c.updated_at <= now_ms - retention_ms, tasks.c.expires_at.is_(None)
    )
    for condition, order in ((expired, (tasks.c.expires_at,)), (retained, ())):
        while True:
            victims = sa.select(tasks.c.key).where(condition).order_by(*order).limit(batch_size)
            if engine.dialect.name == "postgresql":
                victims = victims.with_for_update(skip_locked=True)
            statement = tasks.delete().where(tasks.c.key.in_(victims.scalar_subquery()))
            with engine.begin() as conn:
                rows = conn.execute(statement.returning(tasks.c.tool, tasks.c.status)).all()
            tally.removed += len(rows)
            tally.unfinished.update(tool for tool, status in rows if status not in TERMINAL_VALUES)
            if len(rows) < batch_size:
                break
