"""Alembic environment for celery-mcp-tasks' own tables.

It only ever looks at tables prefixed `mcp_tasks_` and keeps its history in
`mcp_tasks_alembic_version`, so it can share a database (and a host
application's own alembic setup) without touching anything else. The URL
comes from `-x url=...`, then `MCP_TASKS_DATABASE_URL`, then the ini.
"""

from __future__ import annotations

import os
import time
from collections.abc import Collection, Mapping
from logging.config import fileConfig
from typing import Any

from alembic import context
from alembic.runtime.environment import NameFilterParentNames, NameFilterType
from alembic.runtime.migration import MigrationContext, MigrationInfo
from sqlalchemy import pool, text

from celery_mcp_tasks.store.engine import create_store_engine
from celery_mcp_tasks.store.schema import TABLE_PREFIX, VERSION_TABLE, metadata

config = context.config
if config.config_file_name is not None and config.file_config.has_section("formatters"):
    fileConfig(config.config_file_name, disable_existing_loggers=False)

# Any constant works; it only has to be the same for every migrator of this package.
_ADVISORY_LOCK = 0x6D637074
_LOCK_POLL_S = 0.2


def _url() -> str:
    url = (
        context.get_x_argument(as_dictionary=True).get("url")
        or os.environ.get("MCP_TASKS_DATABASE_URL")
        or config.get_main_option("sqlalchemy.url")
    )
    if not url:
        from celery_mcp_tasks.config import Settings

        url = Settings.from_env().store_url
    return url


def include_name(name: str | None, type_: NameFilterType, parent_names: NameFilterParentNames) -> bool:
    if type_ == "table":
        return bool(name and name.startswith(TABLE_PREFIX))
    return True


def _applied(ctx: MigrationContext, step: MigrationInfo, heads: Collection[Any], run_args: Mapping[str, Any]) -> None:
    """Each migration step this run applied, for its caller (`migrate.upgrade`): recorded after the lock, so a
    migrator that waited for another one's run reports what it did itself (nothing), not what it saw before."""
    applied = config.attributes.get("applied")
    if applied is not None:
        applied.append((tuple(step.source_revision_ids), tuple(step.destination_revision_ids)))


def _configure(**kwargs: Any) -> None:
    context.configure(
        target_metadata=metadata,
        version_table=VERSION_TABLE,
        on_version_apply=_applied,
        include_name=include_name,
        compare_type=True,
        **kwargs,
    )


def run_offline() -> None:
    _configure(url=_url(), literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()


def run_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    engine = create_store_engine(_url(), poolclass=pool.NullPool)
    try:
        with engine.connect() as conn:
            _run(conn)
    finally:
        engine.dispose()


def _lock(connection) -> None:  # type: ignore[no-untyped-def]
    """Two migrators starting at once (several web replicas) must not race: a session lock, which
    outlives the commit of a migration's autocommit block (CREATE INDEX CONCURRENTLY). Waited for
    by polling outside any transaction: a waiter blocked in a statement holds a snapshot, which a
    concurrent index build waits for, while it waits for the lock: a deadlock."""
    level = connection.get_isolation_level()
    connection.execution_options(isolation_level="AUTOCOMMIT")  # in place: restored below
    try:
        while not connection.execute(text("SELECT pg_try_advisory_lock(:k)"), {"k": _ADVISORY_LOCK}).scalar():
            time.sleep(_LOCK_POLL_S)
        connection.commit()
    finally:
        connection.execution_options(isolation_level=level)


def _run(connection) -> None:  # type: ignore[no-untyped-def]
    _configure(connection=connection, render_as_batch=connection.dialect.name == "sqlite")
    locked = connection.dialect.name == "postgresql"
    if locked:
        _lock(connection)
    try:
        with context.begin_transaction():
            context.run_migrations()
    finally:
        if locked:
            connection.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": _ADVISORY_LOCK})
            connection.commit()


if context.is_offline_mode():
    run_offline()
else:
    run_online()
