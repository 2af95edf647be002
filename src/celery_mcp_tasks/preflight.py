"""Start-up checks: a process that cannot work refuses to start, in one line that names the fix.

Run once per process start (never per request) by `serve`, `stdio`, `db`, the
worker's main process and beat, before anything is written to the store:

- the store is reachable (a short connect timeout, not a hang or a traceback);
- its schema is at the head of the package's own migrations (else: run
  `celery-mcp-tasks db upgrade`), unless the caller is about to migrate it;
- a process on a remote broker has a store it shares with the others: the
  embedded SQLite default lives in one machine's data directory, so a web
  process and a worker that meet over Redis would each see their own tasks.

Every failure is a `ConfigError` whose message starts with the setting to
change; URLs in it have their password replaced by `***`.
"""

from __future__ import annotations

import logging
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.engine import make_url

from celery_mcp_tasks.config import ConfigError, Settings, redact_url

__all__ = ["CONNECT_TIMEOUT_S", "LOCAL_BROKERS", "preflight"]

CONNECT_TIMEOUT_S = 5
"""How long the start-up probe waits for the database before it says the store is unreachable."""
LOCAL_BROKERS = ("filesystem://", "memory://")
"""Brokers that cannot cross a machine: the embedded SQLite store is the right partner for them."""
_DATABASE = "MCP_TASKS_DATABASE_URL"
_UPGRADE = "run `celery-mcp-tasks db upgrade`"


def preflight(settings: Settings, *, role: str, need_schema: bool = True, broker_url: str | None = None) -> None:
    """Raise `ConfigError` (one line, naming the setting) if a `role` process must not start.

    `role`: "serve", "stdio", "worker", "beat" or "db" (which neither checks the broker nor
    needs a schema). `broker_url`: the Celery app's effective broker (default: the
    settings'). `need_schema=False` for a caller that migrates right after.
    """
    schema = need_schema and role != "db"
    if role != "db":
        _check_shared_store(settings, role, broker_url or settings.celery_broker_url)
    url = settings.store_url
    if schema and _missing_sqlite_file(url):  # said without creating the file
        raise ConfigError(f"{_store(settings)}: the task store does not exist yet; {_UPGRADE}")
    engine = _probe_engine(url)
    try:
        try:
            with engine.connect() as conn:
                current = _current_revisions(conn) if schema else ()
        except sa.exc.DBAPIError as exc:
            raise ConfigError(f"{_store(settings)}: cannot connect to the task store ({_reason(exc)})") from None
        except OSError as exc:  # e.g. the SQLite file's directory cannot be created
            raise ConfigError(f"{_store(settings)}: cannot open the task store ({exc.strerror or exc})") from None
    finally:
        engine.dispose()
    if schema:
        _check_revisions(settings, current)


def _store(settings: Settings) -> str:
    """The setting that chose the store, as it appears at the head of every message."""
    if settings.database_url:
        return f"{_DATABASE}={redact_url(settings.database_url)}"
    return f"{_DATABASE} (unset: the embedded store {settings.store_url})"


def _check_shared_store(settings: Settings, role: str, broker_url: str) -> None:
    if settings.database_url is not None or str(broker_url).startswith(LOCAL_BROKERS):
        return
    raise ConfigError(
        f"{_DATABASE}: unset, so this {role} keeps tasks in the embedded SQLite file {settings.store_url}, "
        f"which processes on the remote broker {redact_url(str(broker_url))} do not share; set {_DATABASE} "
        f"to the database every web process and worker uses (or an explicit sqlite:/// URL on one machine)"
    )


def _missing_sqlite_file(url: str) -> bool:
    parsed = make_url(url)
    database = parsed.database or ""
    if parsed.get_backend_name() != "sqlite" or database in ("", ":memory:") or database.startswith("file:"):
        return False
    return not Path(database).exists()


def _probe_engine(url: str) -> sa.Engine:
    from celery_mcp_tasks.store.engine import create_store_engine

    connect_args = {"connect_timeout": CONNECT_TIMEOUT_S} if make_url(url).get_backend_name() == "postgresql" else {}
    return create_store_engine(url, poolclass=sa.pool.NullPool, connect_args=connect_args)


def _reason(exc: sa.exc.DBAPIError) -> str:
    """The driver's own first line (e.g. "Connection refused"), without SQLAlchemy's statement dump."""
    lines = str(exc.orig or exc).strip().splitlines()
    text = lines[0].removeprefix("connection failed: ") if lines else type(exc.orig or exc).__name__
    return text[:300]


def _current_revisions(conn: sa.Connection) -> tuple[str, ...]:
    """The package's own version table, read as alembic writes it (without alembic's INFO chatter)."""
    from celery_mcp_tasks.store.schema import VERSION_TABLE

    if not sa.inspect(conn).has_table(VERSION_TABLE):
        return ()
    return tuple(str(row[0]) for row in conn.execute(sa.text(f"SELECT version_num FROM {VERSION_TABLE}")))


def _script_heads() -> tuple[set[str], set[str]]:
    """(heads, every known revision) of the migrations shipped in the package."""
    alembic_logger = logging.getLogger("alembic")
    level = alembic_logger.level
    alembic_logger.setLevel(logging.WARNING)  # it logs its plugin set-up at INFO: not one line any more
    try:
        from alembic.script import ScriptDirectory

        from celery_mcp_tasks.migrate import SCRIPT_LOCATION

        scripts = ScriptDirectory(SCRIPT_LOCATION)
        return set(scripts.get_heads()), {revision.revision for revision in scripts.walk_revisions()}
    finally:
        alembic_logger.setLevel(level)


def _check_revisions(settings: Settings, current: tuple[str, ...]) -> None:
    heads, known = _script_heads()
    if set(current) == heads:
        return
    if not current:
        raise ConfigError(f"{_store(settings)}: the task store is not migrated; {_UPGRADE}")
    unknown = sorted(set(current) - known)
    if unknown:
        raise ConfigError(
            f"{_store(settings)}: the task store is at revision {', '.join(unknown)}, which this release of "
            f"celery-mcp-tasks does not know (migrated by a newer one?); upgrade the package"
        )
    raise ConfigError(
        f"{_store(settings)}: the task store is at revision {', '.join(sorted(current))}, behind "
        f"{', '.join(sorted(heads))}; {_UPGRADE}"
    )
