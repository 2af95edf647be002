"""Engines tuned for atomic transitions on SQLite and PostgreSQL.

SQLite needs WAL, a busy timeout and `BEGIN IMMEDIATE` (a transaction that reads then writes holds the write
lock from its start), or updates are lost or fail with "database is locked". The write lock is waited for in
short steps of our own (`_begin_immediate`): SQLite's busy handler sleeps in steps growing to 100 ms, so beside
a worker writing progress in a loop a request's INSERT waited seconds. PostgreSQL needs nothing special.
"""

from __future__ import annotations

import os
import sqlite3
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Engine, make_url

from celery_mcp_tasks.store.codec import encode

READ_ONLY = "mcp_tasks_read_only"
"""Execution option marking a read-only connection (a deferred BEGIN on SQLite)."""

_ENGINES: weakref.WeakSet[Engine] = weakref.WeakSet()
_fork_hook_registered = False  # `_leave_the_parents_connections`, registered with the first engine
_T = TypeVar("_T")

BUSY_TIMEOUT_S = 30.0
"""How long a SQLite statement waits for a lock before "database is locked"."""
_LOCK_STEPS_S = (0.0002, 0.0005, 0.001, 0.002)
"""The waits between attempts at the write lock (the last one repeats)."""
_SQLITE_BUSY = 5


def _leave_the_parents_connections() -> None:
    """In a forked child (Celery's prefork pool): a new pool for every engine. Using an inherited connection
    would talk over the parent's socket, closing one would end its session: `dispose(close=False)` drops the
    old pool without touching it."""
    for engine in list(_ENGINES):
        engine.dispose(close=False)


def _track(engine: Engine) -> None:
    """Remember `engine` for `_leave_the_parents_connections`, registered as a fork hook with the first engine
    (importing the package registers nothing)."""
    global _fork_hook_registered
    if not _fork_hook_registered:  # two threads may both register it: disposing twice in the child is harmless
        os.register_at_fork(after_in_child=_leave_the_parents_connections)
        _fork_hook_registered = True
    _ENGINES.add(engine)


def normalize_url(url: str) -> str:
    """`postgresql://` and `postgres://` mean psycopg 3 here (psycopg2 is not a dependency)."""
    parsed = make_url(url)
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    return parsed.render_as_string(hide_password=False)


def read(engine: Engine, reader: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
    """`reader(conn, *args, **kwargs)` on a connection for reads: no transaction kept (SQLite: a deferred BEGIN)."""
    with engine.connect() as conn:
        if engine.dialect.name == "sqlite":
            conn = conn.execution_options(**{READ_ONLY: True})
        found = reader(conn, *args, **kwargs)
        conn.rollback()
    return found


def upsert(engine: Engine, table: sa.Table) -> Any:
    """`INSERT INTO table` with `ON CONFLICT` clauses, spelled alike by both dialects."""
    dialect = postgresql if engine.dialect.name == "postgresql" else sqlite
    return dialect.insert(table)


def create_store_engine(url: str, **kwargs: Any) -> Engine:
    """An engine whose errors never carry bound parameters (arguments, results, owners), which writes
    JSON compact (`store.codec.encode`), and which a forked child never shares with its parent."""
    kwargs.setdefault("hide_parameters", True)
    kwargs.setdefault("json_serializer", encode)  # compact, and a measured payload is not encoded twice
    url = normalize_url(url)
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        engine = _sqlite_engine(url, parsed.database, **kwargs)
    else:
        kwargs.setdefault("pool_pre_ping", False)
        if "poolclass" not in kwargs:
            kwargs.setdefault("pool_size", 10)
            kwargs.setdefault("max_overflow", 10)
        engine = sa.create_engine(url, **kwargs)
    _track(engine)
    return engine


def _sqlite_engine(url: str, database: str | None, **kwargs: Any) -> Engine:
    if database and database != ":memory:" and not database.startswith("file:"):
        Path(database).parent.mkdir(parents=True, exist_ok=True)
    connect_args = dict(kwargs.pop("connect_args", {}))
    connect_args.setdefault("timeout", BUSY_TIMEOUT_S)
    connect_args.setdefault("check_same_thread", False)
    engine = sa.create_engine(url, connect_args=connect_args, **kwargs)

    @sa.event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None  # SQLAlchemy's "begin" event issues BEGIN itself
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute(f"PRAGMA busy_timeout={int(BUSY_TIMEOUT_S * 1000)}")
        cursor.close()

    @sa.event.listens_for(engine, "begin")
    def _on_begin(connection: Any) -> None:
        # Reads take a deferred BEGIN (WAL readers never wait for the writer); every write
        # takes the write lock at once, waited for in short steps.
        if connection.get_execution_options().get(READ_ONLY):
            connection.exec_driver_sql("BEGIN")
        else:
            _begin_immediate(connection)

    return engine


def _begin_immediate(connection: Any) -> None:
    """`BEGIN IMMEDIATE`, retried in steps of at most 2 ms for up to `BUSY_TIMEOUT_S` while another holds the lock,
    with the busy handler off; the last attempt goes through SQLAlchemy, which raises its own error for it."""
    raw = connection.connection.driver_connection
    raw.execute("PRAGMA busy_timeout=0")
    try:
        deadline = time.monotonic() + BUSY_TIMEOUT_S
        steps = iter(_LOCK_STEPS_S)
        step = 0.0
        while True:
            try:
                raw.execute("BEGIN IMMEDIATE")
                return
            except sqlite3.OperationalError as exc:
                busy = getattr(exc, "sqlite_errorcode", _SQLITE_BUSY) & 0xFF == _SQLITE_BUSY
                if not busy or time.monotonic() > deadline:
                    break
            step = next(steps, step)
            time.sleep(step)
        connection.exec_driver_sql("BEGIN IMMEDIATE")
    finally:
        raw.execute(f"PRAGMA busy_timeout={int(BUSY_TIMEOUT_S * 1000)}")
