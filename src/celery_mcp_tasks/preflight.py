"""Start-up checks: a process that cannot work refuses to start, in one line that names the fix.

Run once per start of `serve`, `stdio`, `db`, a worker and beat (never per request): the store is
reachable, its schema at head, the key ring opens its rows, a process on a remote broker does not keep
tasks in its own embedded SQLite file, and every MCP_TASKS_* name is a setting. Each failure is a
`ConfigError` starting with the setting to change (passwords shown as `***`).
"""

from __future__ import annotations

import functools
import logging
import os
import time
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import make_url

from celery_mcp_tasks.config import ConfigError, Settings, redact_url, unknown_settings

CONNECT_TIMEOUT_S = 5
"""How long the start-up probe waits for the database before it says the store is unreachable."""
LOCAL_BROKERS = ("filesystem://", "memory://")
"""Brokers that cannot cross a machine: the embedded SQLite store is the right partner for them."""
_DATABASE = "MCP_TASKS_DATABASE_URL"
UPGRADE = "run `celery-mcp-tasks db upgrade`"
NOT_CREATED = f"the task store does not exist yet; {UPGRADE}"

SKEW_WARN_S = 1.0
"""How far this host's clock may be from the database's before a process says so at start (`doctor`: WARN)."""

_WHO = {"serve": "web process", "stdio": "stdio server", "db": "db command"}
"""How a role reads in a message (`dev` checks as "serve" does)."""

logger = logging.getLogger("celery_mcp_tasks")
_said: set[str] = set()  # the lines this process has logged (serve checks twice when it migrates)


def preflight(settings: Settings, *, role: str, need_schema: bool = True, broker_url: str | None = None) -> None:
    """Raise `ConfigError` (one line, naming the setting) if a `role` process must not start.

    `role`: "serve", "stdio", "worker", "beat" or "db" (which needs no schema, and has no app: its broker is
    the settings'). `broker_url`: the Celery app's effective broker (default: the settings').
    `need_schema=False` for a caller that migrates right after (a store at a revision this release does not
    know is refused still: no migration can start from it).
    """
    check_environment()
    schema = need_schema and role != "db"
    problem = shared_store_problem(settings, role, broker_url or settings.celery_broker_url)
    if problem is not None:  # `db` too: it would migrate a file nobody serves, and say it succeeded
        raise ConfigError(problem)
    url = settings.store_url
    if schema and missing_sqlite_file(url):  # said without creating the file
        raise ConfigError(f"{_store(settings)}: {NOT_CREATED}")
    from celery_mcp_tasks.store.rekeying import ring_check

    engine = None
    try:
        engine = probe_engine(url)
        with engine.connect() as conn:
            current = current_revisions(conn)
            at_head = schema and revision_problem(current) is None
            postgres = conn.dialect.name == "postgresql" and role != "db"
            offset = clock_offset(conn) if postgres else None
            denied = missing_privileges(conn) if postgres and at_head else []
            # A wrong or missing MCP_TASKS_ENCRYPTION_KEYS for this store, or None (it reads the task table).
            keys = ring_check(conn, settings.key_ring()) if at_head and not denied else None
    except sa.exc.DBAPIError as exc:
        raise ConfigError(f"{_store(settings)}: cannot connect to the task store ({short_reason(exc)})") from None
    except OSError as exc:  # e.g. the SQLite file's directory cannot be created (the engine makes it)
        raise ConfigError(f"{_store(settings)}: cannot open the task store ({exc.strerror or exc})") from None
    finally:
        if engine is not None:
            engine.dispose()
    problem = revision_problem(current)
    # A store migrated by a newer release cannot be served, nor migrated from here (alembic knows no such revision).
    if problem is not None and (schema or set(current) - script_heads()[1]):
        raise ConfigError(f"{_store(settings)}: {problem}")
    if keys is not None:
        raise ConfigError(keys)
    if denied:
        raise ConfigError(
            f"{_store(settings)}: the database role lacks {'; '.join(denied)}: GRANT SELECT, INSERT, UPDATE, DELETE "
            "ON the mcp_tasks_ tables TO it"
        )
    if offset is not None and abs(offset[0]) - offset[1] > SKEW_WARN_S and "clock" not in _said:
        _said.add("clock")
        # Heartbeats, TTLs and input timeouts are stamped on one host's clock and judged on another's: a worker
        # behind by more than the stale timeout less a heartbeat interval has its live jobs taken for lost.
        logger.warning(
            "this host's clock is %.1f s %s the database's: heartbeats, TTLs and input timeouts compare times "
            "across hosts; synchronize the clocks (NTP, chrony); `celery-mcp-tasks doctor` measures it",
            abs(offset[0]),
            "behind" if offset[0] > 0 else "ahead of",
        )


def missing_privileges(conn: sa.Connection) -> list[str]:
    """What the connected role may not do to the package's tables (PostgreSQL), as `mcp_tasks_task: UPDATE,
    DELETE`: without it the store answers reads and fails every write, each taken for an outage."""
    from celery_mcp_tasks.store.schema import metadata

    rows = conn.execute(
        sa.text(
            "SELECT t, p FROM unnest(CAST(:tables AS text[])) WITH ORDINALITY AS tables(t, n), "
            "unnest(ARRAY['SELECT', 'INSERT', 'UPDATE', 'DELETE']) WITH ORDINALITY AS privileges(p, m) "
            "WHERE NOT has_table_privilege(t, p) ORDER BY n, m"
        ),
        {"tables": [table.name for table in metadata.sorted_tables]},
    ).all()
    denied: dict[str, list[str]] = {}
    for table, privilege in rows:
        denied.setdefault(table, []).append(privilege)
    return [f"{table}: {', '.join(privileges)}" for table, privileges in denied.items()]


def clock_offset(conn: sa.Connection) -> tuple[float, float]:
    """The database's clock less this host's, in seconds, and how uncertain that reading is (half its round
    trip). PostgreSQL only."""
    before = time.time()
    database = float(conn.execute(sa.text("SELECT extract(epoch FROM clock_timestamp())")).scalar_one())
    after = time.time()
    return database - (before + after) / 2, (after - before) / 2


def check_environment() -> None:
    """Warn once per process about each MCP_TASKS_* name that is not a setting (strict: `ConfigError`)."""
    for line in unknown_settings(os.environ):
        if line not in _said:
            _said.add(line)
            logger.warning(line)


def _store(settings: Settings) -> str:
    """The setting that chose the store, as it appears at the head of every message."""
    if settings.database_url:
        return f"{_DATABASE}={redact_url(settings.database_url)}"
    return f"{_DATABASE} (unset: the embedded store {settings.store_url})"


def shared_store_problem(settings: Settings, role: str, broker_url: str) -> str | None:
    """Why a `role` process on `broker_url` would keep tasks no other process sees (None: it would not)."""
    if settings.database_url is not None or str(broker_url).startswith(LOCAL_BROKERS):
        return None
    who = _WHO.get(role, role)
    return (
        f"{_DATABASE}: unset, so this {who} keeps tasks in the embedded SQLite file {settings.store_url}, "
        f"which processes on the remote broker {redact_url(str(broker_url))} do not share; set {_DATABASE} "
        f"to the database every web process and worker uses (or an explicit sqlite:/// URL on one machine)"
    )


def missing_sqlite_file(url: str) -> bool:
    """A SQLite store whose file does not exist (connecting would create it, empty)."""
    parsed = make_url(url)
    database = parsed.database or ""
    if parsed.get_backend_name() != "sqlite" or database in ("", ":memory:") or database.startswith("file:"):
        return False
    return not Path(database).exists()


def probe_engine(url: str, *, timeout_s: int | None = None) -> sa.Engine:
    """The one engine a check builds (start-up, `db`, `/readyz`, `doctor`): no pool, so each check is a fresh
    connection. On PostgreSQL, libpq bounds its socket by `timeout_s` (`CONNECT_TIMEOUT_S`, read at the call):
    the connect, then keepalives and `tcp_user_timeout`, so a vanished peer (a partition, a dead NAT entry) fails
    in seconds."""
    from celery_mcp_tasks.store.engine import create_store_engine, is_postgres, libpq_deadlines

    timeout_s = CONNECT_TIMEOUT_S if timeout_s is None else timeout_s
    args: dict[str, Any] = {}
    if is_postgres(url):
        args = libpq_deadlines(timeout_s)
    return create_store_engine(url, poolclass=sa.pool.NullPool, connect_args=args)


def short_reason(exc: BaseException) -> str:
    """One line about a failure: the driver's or client's own first line (e.g. "Connection refused", "Error 111
    connecting to host:6379. Connection refused."), without SQLAlchemy's statement dump, or the exception's type."""
    if isinstance(exc, sa.exc.DBAPIError) and exc.orig is not None:
        exc = exc.orig
    lines = str(exc).strip().splitlines()
    return (lines[0].removeprefix("connection failed: ") if lines else type(exc).__name__)[:300]


def current_revisions(conn: sa.Connection) -> tuple[str, ...]:
    """The package's own version table, read as alembic writes it (without alembic's INFO chatter)."""
    from celery_mcp_tasks.store.schema import VERSION_TABLE

    if not sa.inspect(conn).has_table(VERSION_TABLE):
        return ()
    return tuple(str(row[0]) for row in conn.execute(sa.text(f"SELECT version_num FROM {VERSION_TABLE}")))


@functools.cache
def script_heads() -> tuple[frozenset[str], frozenset[str]]:
    """(heads, every known revision) of the migrations shipped in the package (read once per process)."""
    alembic_logger = logging.getLogger("alembic")
    level = alembic_logger.level
    alembic_logger.setLevel(logging.WARNING)  # it logs its plugin set-up at INFO: not one line any more
    try:
        from alembic.script import ScriptDirectory

        from celery_mcp_tasks.migrate import SCRIPT_LOCATION

        scripts = ScriptDirectory(SCRIPT_LOCATION)
        return frozenset(scripts.get_heads()), frozenset(revision.revision for revision in scripts.walk_revisions())
    finally:
        alembic_logger.setLevel(level)


def revision_problem(current: tuple[str, ...]) -> str | None:
    """What is wrong with a store at `current` revisions, ending with the fix (None: it is at head)."""
    heads, known = script_heads()
    if set(current) == heads:
        return None
    if not current:
        return f"the task store is not migrated; {UPGRADE}"
    unknown = sorted(set(current) - known)
    if unknown:
        return (
            f"the task store is at revision {', '.join(unknown)}, which this release of "
            f"celery-mcp-tasks does not know (migrated by a newer one?); upgrade the package"
        )
    return f"the task store is at revision {', '.join(sorted(current))}, behind {', '.join(sorted(heads))}; {UPGRADE}"
