"""`LoopReads`: `SqlStore.get` awaited on the event loop, for PostgreSQL (psycopg's libpq layer).

`tasks/get` is the hottest read, and on the threaded path most of its cost is not
the SQL but reaching it: a hop to a worker thread, then BEGIN, SELECT and ROLLBACK
as three round trips, each one a GIL hand-off with the busy event loop. Here it is
one prepared SELECT in autocommit, awaited on the loop. A single statement sees
every transaction committed before it began: the store stays the truth, and the
owner is in its WHERE clause as in `SqlStore.get`.

The read itself goes to libpq through psycopg's public `pq` wrapper: the statement
prepared once per connection, sent with `send_query_prepared`, the socket awaited
with `add_reader`, and the row returned as one `json_build_array` value decoded by
one `json.loads`. Through psycopg's cursor (its per-query generators and waits, a
loader per column) a read cost ~90 us more of the web process's CPU at 8 clients
(measured alternating, 70-120 us): half of what `tasks/get` cost beyond a bare
`tools/list`. psycopg still opens every connection (authentication, TLS, the URL's
options), and its exception classes name every failure.

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
import json
import os
import struct
import sys
import weakref
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from celery_mcp_tasks.model import TaskRecord
from celery_mcp_tasks.store.base import ANY, Owner, StoreUnavailable
from celery_mcp_tasks.store.schema import tasks
from celery_mcp_tasks.store.sql import _COLUMNS, SqlStore, _from_row

POOL_SIZE = 8
"""Connections per event loop, opened as concurrent reads need them (the loop waits on them, never blocks)."""


@dataclass
class _Pool:
    slots: asyncio.Semaphore
    idle: list[Any] = field(default_factory=list)  # psycopg AsyncConnections, their statements prepared


class LoopReads:
    def __init__(self, engine: Engine, size: int = POOL_SIZE) -> None:
        self.engine = engine
        self._size = size
        self._args, self._kwargs = engine.dialect.create_connect_args(engine.url)
        self._connect = {**self._kwargs, "client_encoding": "UTF8"}  # what the read decodes, and sends
        self._prepare = prepare_statements(engine)
        self._pid = os.getpid()
        self._pools: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Pool] = weakref.WeakKeyDictionary()
        self._inherited: list[Any] = []  # a forked child keeps the parent's pools alive, untouched

    async def get(self, key: str, owner: Owner = ANY) -> TaskRecord | None:
        if "\x00" in key or (isinstance(owner, str) and "\x00" in owner):
            return None  # no stored text holds a NUL (and libpq would cut the parameter there)
        name, params = _statement(key, owner)
        value = await self._fetch(name, params)
        if value is None:
            return None
        try:
            values = json.loads(value)
            for index in _FLOATS:  # float8send, hex: exact whatever the server's float settings
                if values[index] is not None:
                    values[index] = struct.unpack(">d", bytes.fromhex(values[index]))[0]
        except ValueError:
            raise StoreUnavailable("get") from None  # never the row's text in a cause
        return _from_row(dict(zip(_COLUMNS, values, strict=True)))

    async def _fetch(self, name: bytes, params: list[bytes]) -> bytes | None:
        import psycopg

        pool = self._pool()
        async with pool.slots:
            while True:
                pooled = bool(pool.idle)
                conn = pool.idle.pop() if pooled else None
                try:
                    if conn is None:
                        conn = await psycopg.AsyncConnection.connect(*self._args, **self._connect, autocommit=True)
                        for prepared, sql in self._prepare.items():
                            await _prepare(conn.pgconn, prepared, sql)
                    value = await _query_prepared(conn.pgconn, name, params)
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
                pool.idle.append(conn)
                return value

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
        for conn in pool.idle if pool is not None and os.getpid() == self._pid else ():
            await conn.close()


_FLOAT_NAMES = {name for name in _COLUMNS if isinstance(tasks.c[name].type, sa.Float)}
_FLOATS = [index for index, name in enumerate(_COLUMNS) if name in _FLOAT_NAMES]
_NAMES = {"any": b"mcp_tasks_get_any", "none": b"mcp_tasks_get_none", "owner": b"mcp_tasks_get_owner"}


def prepare_statements(engine: Engine) -> dict[bytes, bytes]:
    """The three owner shapes of the read, by statement name: prepared once per connection.

    Protocol-level prepared statements (libpq's `PQsendPrepare`), which PgBouncer (1.21+)
    keeps track of in transaction mode, as it does psycopg's own; no session setting is relied
    on. A row comes back as one `json_build_array` of the columns in `_COLUMNS` order: one text
    value, decoded by one `json.loads`, the JSON columns nested as they are stored, and each
    float column as the hex of its eight bytes (`float8send`), so it reads back the same double
    whatever `extra_float_digits` says (and 3.0 stays a float).
    """
    quote = engine.dialect.identifier_preparer.quote
    columns = [f"encode(float8send({quote(n)}), 'hex')" if n in _FLOAT_NAMES else quote(n) for n in _COLUMNS]
    row = f"SELECT json_build_array({', '.join(columns)}) FROM {quote(tasks.name)}"
    by_key = f"{row} WHERE {quote('key')} = $1::text"
    owner = quote("owner")
    shapes = {"any": by_key, "none": f"{by_key} AND {owner} IS NULL", "owner": f"{by_key} AND {owner} = $2::text"}
    return {_NAMES[shape]: sql.encode() for shape, sql in shapes.items()}


def _statement(key: str, owner: Owner) -> tuple[bytes, list[bytes]]:
    encoded = key.encode()
    if owner is None:
        return _NAMES["none"], [encoded]
    if isinstance(owner, str):
        return _NAMES["owner"], [encoded, owner.encode("utf-8", "surrogatepass")]
    assert owner is ANY
    return _NAMES["any"], [encoded]


async def _prepare(pgconn: Any, name: bytes, sql: bytes) -> None:
    pgconn.send_prepare(name, sql)
    failure = _failure(await _results(pgconn))
    if failure is not None:
        raise _error(pgconn, failure)


async def _query_prepared(pgconn: Any, name: bytes, params: list[bytes]) -> bytes | None:
    """One prepared statement on libpq directly (psycopg's `pq`): send, wait readable, read the one value."""
    from psycopg.pq import ExecStatus

    pgconn.send_query_prepared(name, params)
    results = await _results(pgconn)
    failure = _failure(results)
    if failure is not None:
        raise _error(pgconn, failure)
    rows = [result for result in results if result.status == ExecStatus.TUPLES_OK]
    return rows[0].get_value(0, 0) if rows and rows[0].ntuples else None


async def _results(pgconn: Any) -> list[Any]:
    """Every result of what was sent, the loop awaiting the socket whenever libpq would block.

    `get_result` blocks while libpq is busy, so it is only called when it is not: once
    before the first result, and again before the end (the server's ReadyForQuery may come
    in a later packet than the row)."""
    loop = asyncio.get_running_loop()
    fd = pgconn.socket
    if pgconn.flush():  # the query did not fit the socket's buffer at once (never for a key)
        await _flushed(loop, pgconn, fd)
    results: list[Any] = []
    while True:
        if pgconn.is_busy():
            done = loop.create_future()
            loop.add_reader(fd, _readable, pgconn, done)
            try:
                await done
            finally:
                loop.remove_reader(fd)
        result = pgconn.get_result()
        if result is None:
            return results
        results.append(result)


def _failure(results: list[Any]) -> Any:
    from psycopg.pq import ExecStatus

    return next((r for r in results if r.status not in (ExecStatus.TUPLES_OK, ExecStatus.COMMAND_OK)), None)


def _error(pgconn: Any, result: Any) -> Exception:  # psycopg.Error (imported lazily)
    """psycopg's own class for a failed result (by SQLSTATE); a connection left broken is an OperationalError."""
    import psycopg
    from psycopg.pq import ConnStatus, DiagnosticField

    state = result.error_field(DiagnosticField.SQLSTATE)
    try:
        cls: type[psycopg.Error] = psycopg.errors.lookup(state.decode()) if state else psycopg.DatabaseError
    except KeyError:
        cls = psycopg.DatabaseError
    if pgconn.status != ConnStatus.OK:
        cls = psycopg.OperationalError
    return cls(result.error_message.decode("utf-8", "replace").strip(), info=result)


def _readable(pgconn: Any, done: asyncio.Future[None]) -> None:
    if done.done():
        return
    try:
        pgconn.consume_input()
    except BaseException as exc:  # noqa: BLE001 - the connection is lost: the read's exception
        done.set_exception(exc)
        return
    if not pgconn.is_busy():
        done.set_result(None)


async def _flushed(loop: asyncio.AbstractEventLoop, pgconn: Any, fd: int) -> None:
    while True:
        writable = loop.create_future()
        loop.add_writer(fd, _wake, writable)
        try:
            await writable
        finally:
            loop.remove_writer(fd)
        if not pgconn.flush():
            return


def _wake(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


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
