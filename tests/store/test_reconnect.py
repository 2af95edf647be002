"""After PostgreSQL drops every connection (a restart, a failover), the next operation still works.

PostgreSQL only: a SQLite file has no server that could drop a connection.
"""

import pytest
import sqlalchemy as sa

from celery_mcp_tasks.model import TaskRecord, TaskStatus
from celery_mcp_tasks.store import ANY
from celery_mcp_tasks.store.engine import normalize_url
from celery_mcp_tasks.store.sql import SqlStore

pytestmark = pytest.mark.postgres


def drop_every_connection(store: SqlStore) -> int:
    """Terminate every other session on the store's database, as a server restart does; returns how many."""
    admin = sa.create_engine(normalize_url(store.engine.url.render_as_string(hide_password=False)))
    try:
        with admin.connect() as conn:
            killed = conn.execute(
                sa.text(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND pid <> pg_backend_pid()"
                )
            )
            count = int(killed.scalar_one())
            conn.commit()
    finally:
        admin.dispose()
    return count


def test_operations_survive_the_server_dropping_pooled_connections(pg_store: SqlStore):
    record = TaskRecord(
        key="k", owner=None, tool="t", status=TaskStatus.WORKING, created_at=1, updated_at=1, ttl_ms=None
    )
    pg_store.create(record, max_rows=None)
    assert pg_store.engine.pool.checkedin() >= 1  # a pooled connection that the restart will kill
    assert drop_every_connection(pg_store) >= 1
    assert pg_store.get("k") == record  # a read on a dead pooled connection
    assert drop_every_connection(pg_store) >= 1
    assert pg_store.update("k", ANY, lambda r: r.with_progress("after the restart", 2)).version == 2  # and a write
    assert pg_store.get("k").status_message == "after the restart"  # type: ignore[union-attr]
