"""Engines tuned for atomic transitions on SQLite and PostgreSQL.

SQLite needs WAL, a busy timeout and `BEGIN IMMEDIATE` (a transaction that reads then writes holds the write
lock from its start), or updates are lost or fail with "database is locked". The write lock is waited for in
short steps of our own (`_begin_immediate`): SQLite's busy handler sleeps in steps growing to 100 ms, so beside
a worker writing progress in a loop a request's INSERT waited seconds. PostgreSQL needs nothing special.
"""

from __future__ import annotations

import os
import sqlite3
import threading
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
_fork_hooks_registered = False  # `_ForkGate` and `_in_child`, registered with the first engine
_T = TypeVar("_T")

BUSY_TIMEOUT_S = 30.0
"""How long a SQLite statement waits for a lock before "database is locked"."""
_LOCK_STEPS_S = (0.0002, 0.0005, 0.001, 0.002)
"""The waits between attempts at the write lock (the last one repeats)."""
_SQLITE_BUSY = 5


class _ForkGate:
    """No fork while a thread of this process is inside SQLite: between a connection's checkout and its
    checkin, and while one is opened or closed.

    SQLite keeps the locks a process holds in memory shared by all its connections, and guards them with
    process-wide mutexes. A child forked while another thread is inside a write transaction inherits "this
    process holds the write lock" with no thread left to release it: every write of the child then waits out
    the busy timeout ("database is locked"); forked while another thread opens a connection, it inherits a
    held mutex and hangs at its first. Celery's prefork pool forks new children from a thread of the worker's
    main process while the main thread records a revoke or a lost job, so a fork waits here until no thread
    is inside (at most the busy timeout), and no thread gets in until it is done.
    """

    def __init__(self) -> None:
        self._idle = threading.Condition()
        self._out = 0  # connections out of the pools of this process's SQLite engines
        self._forking = False
        self._mine = threading.local()  # how many of them this thread holds

    def enter(self, *_: Any) -> None:
        mine = getattr(self._mine, "out", 0)
        with self._idle:
            if not mine:  # a thread already inside may take another connection: the fork waits for it anyway
                self._idle.wait_for(lambda: not self._forking)
            self._out += 1
        self._mine.out = mine + 1

    def leave(self, *_: Any) -> None:
        self._mine.out = max(getattr(self._mine, "out", 0) - 1, 0)
        with self._idle:
            self._out = max(self._out - 1, 0)
            self._idle.notify_all()

    def hold(self) -> None:
        """Before a fork: let no thread in, wait until none is inside, hold the gate until the fork is done."""
        self._idle.acquire()
        self._forking = True
        own = getattr(self._mine, "out", 0)
        self._idle.wait_for(lambda: self._out <= own, timeout=BUSY_TIMEOUT_S)

    def release(self) -> None:
        self._forking = False
        self._idle.notify_all()
        self._idle.release()

    def reset(self) -> None:
        """In the child: its only thread is the one that forked."""
        self._idle = threading.Condition()
        self._out = getattr(self._mine, "out", 0)
        self._forking = False


_FORK_GATE = _ForkGate()


class _GatedConnection(sqlite3.Connection):
    """A SQLite connection opened and closed inside the fork gate (`sqlite3.connect(factory=...)`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        _FORK_GATE.enter()
        try:
            super().__init__(*args, **kwargs)
        finally:
            _FORK_GATE.leave()

    def close(self) -> None:
        _FORK_GATE.enter()
        try:
            super().close()
        finally:
            _FORK_GATE.leave()


def _in_child() -> None:
    """In a forked child (Celery's prefork pool): a new pool for every engine. Using an inherited connection
    would talk over the parent's socket, closing one would end its session: `dispose(close=False)` drops the
    old pool without touching it."""
    _FORK_GATE.reset()
    for engine in list(_ENGINES):
        engine.dispose(close=False)


def _track(engine: Engine) -> None:
    """Remember `engine` for `_in_child`; the fork hooks are registered with the first engine (importing the
    package registers nothing)."""
    global _fork_hooks_registered
    if not _fork_hooks_registered:  # two threads may both register: the hooks run twice, harmlessly (re-entrant lock)
        os.register_at_fork(before=_FORK_GATE.hold, after_in_parent=_FORK_GATE.release, after_in_child=_in_child)
        _fork_hooks_registered = True
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
    connect_args.setdefault("factory", _GatedConnection)
    engine = sa.create_engine(url, connect_args=connect_args, **kwargs)
    sa.event.listen(engine, "checkout", _FORK_GATE.enter)
    sa.event.listen(engine, "checkin", _FORK_GATE.leave)

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
