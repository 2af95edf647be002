"""`LoopReads`: `SqlStore.get` awaited on the event loop, for PostgreSQL (psycopg's async connection).

`tasks/get` is the hottest read, and on the threaded path most of its cost is not
the SQL but reaching it: a hop to a worker thread, then BEGIN, SELECT and ROLLBACK
as three round trips, each one a GIL hand-off with the busy event loop. Here it is
one prepared SELECT in autocommit, awaited on the loop. A single statement sees
every transaction committed before it began: the store stays the truth, and the
owner is in its WHERE clause as in `SqlStore.get`.

A small pool per event loop (a connection is bound to the loop that opened it),
never shared across a fork (the child's pools start empty; the parent's sockets
are left untouched). A connection whose query failed or was interrupted (a
cancelled request) is closed, never reused. A pooled connection found dead is
dropped and the read goes on with the next, at worst a fresh one (a read is
idempotent); a fresh connection that fails, or any other failure, is
`StoreUnavailable("get")`, the database's text only in the cause.
"""

from __future__ import annotations

import asyncio
import os
import sys
import weakref
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.engine import Engine

from celery_mcp_tasks.model import TaskRecord
from celery_mcp_tasks.store.base import ANY, Owner, StoreUnavailable
from celery_mcp_tasks.store.pg_writes import read_params, read_statements
from celery_mcp_tasks.store.sql import _COLUMNS, SqlStore, _from_row

POOL_SIZE = 8
"""Connections per event loop, opened as concurrent reads need them (the loop waits on them, never blocks)."""


@dataclass
class _Pool:
    slots: asyncio.Semaphore
    idle: list[tuple[Any, Any]] = field(default_factory=list)  # (connection, its cursor)


class LoopReads:
    def __init__(self, engine: Engine, size: int = POOL_SIZE) -> None:
        self.engine = engine
        self._size = size
        self._args, self._kwargs = engine.dialect.create_connect_args(engine.url)
        self._sql = read_statements(engine, _COLUMNS)
        self._pid = os.getpid()
        self._pools: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Pool] = weakref.WeakKeyDictionary()
        self._inherited: list[Any] = []  # a forked child keeps the parent's pools alive, untouched

    async def get(self, key: str, owner: Owner = ANY) -> TaskRecord | None:
        sql, params = read_params(key, owner, self._sql)
        row = await self._fetch(sql, params)
        return None if row is None else _from_row(dict(zip(_COLUMNS, row, strict=True)))

    async def _fetch(self, sql: str, params: dict[str, Any]) -> tuple[Any, ...] | None:
        import psycopg

        pool = self._pool()
        async with pool.slots:
            while True:
                pooled = bool(pool.idle)
                conn, cursor = pool.idle.pop() if pooled else (None, None)
                try:
                    if conn is None:
                        conn = await psycopg.AsyncConnection.connect(*self._args, **self._kwargs, autocommit=True)
                        cursor = conn.cursor()  # one per connection, reused: a cursor per read costs ~20 us
                    assert cursor is not None
                    await cursor.execute(sql, params, prepare=True)
                    row: tuple[Any, ...] | None = await cursor.fetchone()
                except psycopg.OperationalError as exc:
                    await _discard(conn)
                    if pooled:
                        continue  # a pooled connection the database dropped: the next one, at worst a fresh one
                    raise StoreUnavailable("get") from exc
                except psycopg.Error as exc:
                    await _discard(conn)
                    raise StoreUnavailable("get") from exc
                except BaseException:
                    await _discard(conn)  # interrupted mid-query (cancelled): its state is unknown
                    raise
                pool.idle.append((conn, cursor))
                return row

    def _pool(self) -> _Pool:
        if os.getpid() != self._pid:
            self._inherited.append(self._pools)
            self._pools, self._pid = weakref.WeakKeyDictionary(), os.getpid()
        loop = asyncio.get_running_loop()
        pool = self._pools.get(loop)
        if pool is None:
            pool = self._pools[loop] = _Pool(asyncio.Semaphore(self._size))
        return pool

    async def aclose(self) -> None:
        """Close this loop's idle connections (the serving lifespan's end)."""
        pool = self._pools.pop(asyncio.get_running_loop(), None)
        for conn, _ in pool.idle if pool is not None and os.getpid() == self._pid else ():
            await conn.close()


async def _discard(conn: Any) -> None:
    if conn is not None:
        await conn.close()  # never suspends: safe in a cancelled task


_READS: weakref.WeakKeyDictionary[SqlStore, LoopReads] = weakref.WeakKeyDictionary()


def loop_reads(store: object) -> LoopReads | None:
    """`store`'s reads on this event loop; None where they stay on threads (SQLite, not asyncio, Windows)."""
    if not isinstance(store, SqlStore) or store.engine.dialect.driver != "psycopg" or sys.platform == "win32":
        return None
    try:
        asyncio.get_running_loop()
    except RuntimeError:  # trio, or no loop at all
        return None
    reads = _READS.get(store)
    if reads is None or reads.engine is not store.engine:
        reads = _READS[store] = LoopReads(store.engine)
    return reads


@asynccontextmanager
async def closing_loop_reads(store: Callable[[], object]) -> AsyncIterator[None]:
    """A serving context: this loop's read connections are closed when the served app stops."""
    try:
        yield
    finally:
        reads = loop_reads(store())
        if reads is not None:
            await reads.aclose()
