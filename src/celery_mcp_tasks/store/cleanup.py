"""Eviction: expired rows leave in bounded batches, and the janitor learns which were unfinished.

A task removed by its TTL while still `working` or `input_required` never reaches a
final status, so nothing else would ever count its end: each batch's DELETE returns
the `tool` and `status` of what it removed (`RETURNING`, PostgreSQL and SQLite >= 3.35),
which costs no extra statement and no second read.
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from celery_mcp_tasks.model import TERMINAL_VALUES
from celery_mcp_tasks.store.base import Eviction
from celery_mcp_tasks.store.schema import tasks

__all__ = ["evict"]


def _passes(now_ms: int, retention_ms: int) -> tuple[tuple[sa.ColumnElement[bool], sa.ColumnElement[int] | None], ...]:
    """The TTL pass (walks the `expires_at` index), then final rows without a TTL past the retention."""
    return (
        (tasks.c.expires_at <= now_ms, tasks.c.expires_at),
        (
            sa.and_(
                tasks.c.status.in_(TERMINAL_VALUES),
                tasks.c.updated_at <= now_ms - retention_ms,
                tasks.c.expires_at.is_(None),
            ),
            None,
        ),
    )


def evict(engine: Engine, tally: Eviction, *, now_ms: int, retention_ms: int, batch_size: int) -> None:
    """Delete expired rows into `tally`, one bounded batch per short transaction.

    A batch is one `DELETE ... WHERE key IN (SELECT key ... LIMIT n) RETURNING
    tool, status`: no keys travel to the client, the TTL pass walks the
    `expires_at` index (never rescanning rows it already removed), and on
    PostgreSQL `FOR UPDATE SKIP LOCKED` lets two janitors take disjoint batches.
    A concurrent writer waits for at most one small commit; a row locked by one
    is skipped, so its final status and this count never disagree. `tally` is
    the caller's, so batches committed before a dropped connection stay counted
    when the store retries.
    """
    for condition, order in _passes(now_ms, retention_ms):
        while True:
            victims = sa.select(tasks.c.key).where(condition).limit(batch_size)
            if order is not None:
                victims = victims.order_by(order)
            if engine.dialect.name == "postgresql":
                victims = victims.with_for_update(skip_locked=True)
            statement = tasks.delete().where(tasks.c.key.in_(victims.scalar_subquery()))
            with engine.begin() as conn:
                rows = conn.execute(statement.returning(tasks.c.tool, tasks.c.status)).all()
            tally.removed += len(rows)
            tally.unfinished.update(tool for tool, status in rows if status not in TERMINAL_VALUES)
            if len(rows) < batch_size:
                break
