"""Engines tuned for atomic transitions on SQLite and PostgreSQL.

SQLite needs WAL, a busy timeout and `BEGIN IMMEDIATE` (a transaction that reads then writes holds the write
lock from its start), or updates are lost or fail with "database is locked". The write lock is waited for in
short steps of our own (`_begin_immediate`): SQLite's busy handler sleeps in steps growing to 100 ms, so beside
a worker writing progress in a loop a request's INSERT waited seconds. PostgreSQL needs nothing special.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import threading
import time
import weakref
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Engine, ExceptionContext, make_url

from celery_mcp_tasks.store.codec import encode

logger = logging.getLogger(__name__)

READ_ONLY = "mcp_tasks_read_only"
"""Execution option marking a read-only connection (a deferred BEGIN on SQLite)."""

_ENGINES: weakref.WeakSet[Engine] = weakref.WeakSet()
_fork_hooks_registered = False  # `_ForkGate` and `_in_child`, registered with the first engine
_T = TypeVar("_T")

SOCKET_TIMEOUT_S = 10
"""How long a PostgreSQL connection may go unanswered at its connect, or once a peer has vanished (read where a
connection is made)."""

BUSY_TIMEOUT_S = 30.0
"""How long a SQLite statement waits for a lock before "database is locked"."""
_LOCK_STEPS_S = (0.0002, 0.0005, 0.001, 0.002)
"""The waits between attempts at the write lock (the last one repeats)."""
_SQLITE_BUSY = 5


class _ForkGate:
    """No fork while a thread of this process is inside SQLite: from a connection's checkout to its checkin,
    and while one is opened (with the engine's setup of it) or closed.

    SQLite keeps the locks a process holds in memory shared by all its connections, and guards them with
    mutexes. A child forked while another thread is inside a write transaction inherits "this process holds
    the write lock" with no thread left to release it: every write of the child then waits out the busy
    timeout ("database is locked"); forked while another thread opens a connection, it inherits a held mutex
    and hangs at its first. Celery's prefork pool forks new children from a thread of the worker's main
    process while the main thread records a revoke or a lost job, so a fork waits here until no other thread
    is inside (at most the busy timeout, then it goes ahead and says so), and no thread gets in until it is
    done but one already inside (taking a second connection) and the forking thread itself (a finalizer
    closing a connection during the fork). The gate's lock is never held across the fork: a thread inside
    may be a finalizer that holds another lock a later fork hook takes (logging's).

    A checkout is counted for the thread that made it, on its connection record (`record_info`, which
    outlives a reconnect), so a checkin from another thread (a collected connection), without a checkout
    (a failed reconnect) or after a retried checkout (a listener's `DisconnectionError`) never unbalances it.
    """

    def __init__(self) -> None:
        self._idle = threading.Condition()
        self._inside: Counter[int] = Counter()  # thread ident -> how deep it is inside
        self._forking: Counter[int] = Counter()  # thread ident -> forks under way (two threads may fork at once)

    def enter(self) -> int:
        me = threading.get_ident()
        with self._idle:
            if not self._inside[me]:
                self._idle.wait_for(lambda: not self._forking.keys() - {me}, timeout=BUSY_TIMEOUT_S)
            self._inside[me] += 1
        return me

    def leave(self, thread: int) -> None:
        with self._idle:
            self._inside[thread] -= 1
            if self._inside[thread] <= 0:
                del self._inside[thread]
            self._idle.notify_all()

    def checkout(self, _dbapi_connection: Any, record: Any, _proxy: Any) -> None:
        if _GATE_KEY not in record.record_info:  # else the pool retried this checkout: counted already
            record.record_info[_GATE_KEY] = self.enter()

    def checkin(self, _dbapi_connection: Any, record: Any) -> None:
        """At checkin, and when a connection is detached from its pool: the checkout ends, if it was counted."""
        thread = record.record_info.pop(_GATE_KEY, None) if record is not None else None
        if thread is not None:
            self.leave(thread)

    def hold(self) -> None:
        """Before a fork: let no other thread in, and wait until none is inside."""
        me = threading.get_ident()
        with self._idle:
            self._forking[me] += 1
            idle = self._idle.wait_for(lambda: not self._inside.keys() - {me}, timeout=BUSY_TIMEOUT_S)
        if not idle:
            logger.warning("a fork went ahead after %.0f s with another thread inside SQLite", BUSY_TIMEOUT_S)

    def release(self) -> None:
        me = threading.get_ident()
        with self._idle:
            self._forking[me] -= 1
            if self._forking[me] <= 0:
                del self._forking[me]
            self._idle.notify_all()

    def reset(self) -> None:
        """In the child: its only thread is the one that forked."""
        me = threading.get_ident()
        self._idle = threading.Condition()
        self._inside = Counter({me: self._inside[me]}) if self._inside[me] else Counter()
        self._forking = Counter()


_FORK_GATE = _ForkGate()
_GATE_KEY = "celery_mcp_tasks.fork_gate"  # a connection record's `record_info`: the thread whose checkout counts


class _GatedConnection(sqlite3.Connection):
    """A SQLite connection (`sqlite3.connect(factory=...)`) inside the fork gate from its opening until the
    engine has set it up (`opened`, at the end of the engine's last connect event, even when it fails), and
    while it closes. One whose setup failed before ours ran, and which nothing closes (older SQLAlchemy
    releases leave such a connection to the collector), leaves the gate when it is collected."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._opening = weakref.finalize(self, _FORK_GATE.leave, _FORK_GATE.enter())
        try:
            super().__init__(*args, **kwargs)
        except BaseException:
            self.opened()
            raise

    def opened(self) -> None:
        self._opening()  # once: a finalizer runs at most once

    def close(self) -> None:
        inside = _FORK_GATE.enter()
        try:
            if self.in_transaction:  # closed mid-write (an interrupted statement): give the write lock back now; a
                with contextlib.suppress(sqlite3.Error):  # statement still referenced (a traceback's cursor)
                    self.rollback()  # would keep it, the connection left open, until that is collected
            super().close()
        finally:
            _FORK_GATE.leave(inside)
            self.opened()  # a connect event failed: SQLAlchemy closes the connection it could not set up


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
    if not _fork_hooks_registered:  # two threads may both register: each fork then holds and releases twice
        os.register_at_fork(before=_FORK_GATE.hold, after_in_parent=_FORK_GATE.release, after_in_child=_in_child)
        _fork_hooks_registered = True
    _ENGINES.add(engine)


def normalize_url(url: str) -> str:
    """`postgresql://` and `postgres://` mean psycopg 3 here (psycopg2 is not a dependency)."""
    parsed = make_url(url)
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    return parsed.render_as_string(hide_password=False)


def is_postgres(url: str) -> bool:
    """Whether `url` names a PostgreSQL store (`postgres://` too)."""
    return make_url(normalize_url(url)).get_backend_name() == "postgresql"


def read(engine: Engine, reader: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
    """`reader(conn, *args, **kwargs)` on a connection for reads: no transaction kept (SQLite: a deferred BEGIN)."""
    with engine.connect() as conn:
        if engine.dialect.name == "sqlite":
            conn = conn.execution_options(**{READ_ONLY: True})
        found = reader(conn, *args, **kwargs)
        conn.rollback()
    return found


def write(engine: Engine, statement: Any) -> int:
    """`statement` in a transaction of its own (autocommit on PostgreSQL): how many rows it matched."""
    with engine.connect() as conn:
        count: int = conn.execute(statement).rowcount
        conn.commit()
    return count


def upsert(engine: Engine, table: sa.Table) -> Any:
    """`INSERT INTO table` with `ON CONFLICT` clauses, spelled alike by both dialects."""
    dialect = postgresql if engine.dialect.name == "postgresql" else sqlite
    return dialect.insert(table)


def libpq_deadlines(timeout_s: int | None = None) -> dict[str, int]:
    """libpq's parameters bounding a connection's socket by `timeout_s` (`SOCKET_TIMEOUT_S`): the connect, then keepalives and
    `tcp_user_timeout`, so a vanished peer (a partition, a dead NAT entry, a failover) fails in seconds, not at
    the kernel's ~15 minutes. A long statement is not cut short: a socket waiting for rows is still acknowledged."""
    timeout_s = SOCKET_TIMEOUT_S if timeout_s is None else timeout_s
    return {
        "connect_timeout": timeout_s,
        "keepalives": 1,
        "keepalives_idle": timeout_s,
        "keepalives_interval": 1,
        "keepalives_count": 3,
        "tcp_user_timeout": timeout_s * 1000,
    }


APPLICATION_NAME = "celery-mcp-tasks"


def application_name(url: str, name: str = APPLICATION_NAME) -> dict[str, str]:
    """libpq's `fallback_application_name`, naming this package's connections in `pg_stat_activity` and the
    server's log unless something else names them: libpq gives way to the URL's `application_name`,
    `PGAPPNAME` and a service file by itself; a name set in the URL's `options` needs the check here."""
    query = make_url(url).query
    if "fallback_application_name" in query or "application_name" in str(query.get("options", "")):
        return {}
    return {"fallback_application_name": name}


def create_store_engine(url: str, **kwargs: Any) -> Engine:
    """An engine whose errors never carry bound parameters (arguments, results, owners), which writes
    JSON compact (`store.codec.encode`), which a forked child never shares with its parent, and which never
    pools a connection a statement was interrupted on (`_discard_interrupted`)."""
    kwargs.setdefault("hide_parameters", True)
    kwargs.setdefault("json_serializer", encode)  # compact, and a measured payload is not encoded twice
    url = normalize_url(url)
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        # MCP_TASKS_DATABASE_POOL_SIZE sizes PostgreSQL's pool; one host's SQLite file keeps SQLAlchemy's own.
        kwargs.pop("pool_size", None)
        engine = _sqlite_engine(url, parsed.database, **kwargs)
    else:
        kwargs.setdefault("pool_pre_ping", False)
        kwargs["connect_args"] = {**libpq_deadlines(), **application_name(url), **kwargs.get("connect_args", {})}
        if "poolclass" not in kwargs:
            kwargs.setdefault("pool_size", 10)
            kwargs.setdefault("max_overflow", kwargs["pool_size"])  # as many again at a peak
        engine = sa.create_engine(url, **kwargs)
        sa.event.listen(engine, "connect", _read_committed)
    sa.event.listen(engine, "handle_error", _discard_interrupted)
    _track(engine)
    return engine


def _discard_interrupted(context: ExceptionContext) -> None:
    """An exception that is not the driver's, raised while the driver ran a statement (a Celery soft time
    limit, any signal handler's), may leave the connection mid-query: it is closed, not pooled, as SQLAlchemy
    does itself only for exit exceptions such as KeyboardInterrupt. Else the next statement on it fails
    ("another command is already in progress"). The other pooled connections are kept."""
    if context.sqlalchemy_exception is None and not context.is_disconnect:
        context.is_disconnect = True
        context.invalidate_pool_on_disconnect = False


def _read_committed(dbapi_connection: Any, _record: Any) -> None:
    """PostgreSQL: the store's statements run at READ COMMITTED whatever the server's default. A conditional
    UPDATE then re-checks a row another writer changed since the statement began (under REPEATABLE READ it
    fails with a serialization error), and a count after a lock wait sees what the lock's holder committed."""
    with dbapi_connection.cursor() as cursor:
        cursor.execute("SET SESSION CHARACTERISTICS AS TRANSACTION ISOLATION LEVEL READ COMMITTED")
    dbapi_connection.commit()  # kept for the session (a no-op where the connection is in autocommit already)


def _sqlite_engine(url: str, database: str | None, **kwargs: Any) -> Engine:
    if database and database != ":memory:" and not database.startswith("file:"):
        Path(database).parent.mkdir(parents=True, exist_ok=True)
    connect_args = dict(kwargs.pop("connect_args", {}))
    connect_args.setdefault("timeout", BUSY_TIMEOUT_S)
    connect_args.setdefault("check_same_thread", False)
    connect_args.setdefault("factory", _GatedConnection)
    engine = sa.create_engine(url, connect_args=connect_args, **kwargs)
    sa.event.listen(engine, "checkout", _FORK_GATE.checkout)
    sa.event.listen(engine, "checkin", _FORK_GATE.checkin)
    sa.event.listen(engine, "detach", _FORK_GATE.checkin)  # a detached connection is out of the pool's count

    @sa.event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None  # SQLAlchemy's "begin" event issues BEGIN itself
        try:
            cursor = dbapi_connection.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")  # opens WAL's files (on a new database, sets its mode)
            cursor.execute("PRAGMA synchronous=NORMAL")
            cursor.execute(f"PRAGMA busy_timeout={int(BUSY_TIMEOUT_S * 1000)}")
            cursor.close()
        finally:
            if isinstance(dbapi_connection, _GatedConnection):
                dbapi_connection.opened()  # registered last: the dialect's own setup ran before, inside the gate

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
