"""After PostgreSQL drops every connection (a restart, a failover), the next operation still works."""

import sqlalchemy as sa

from celery_mcp_tasks.model import TaskRecord, TaskStatus
from celery_mcp_tasks.store import ANY
from celery_mcp_tasks.store.sql import SqlStore
from tests.conftest import needs_postgres


@needs_postgres
def test_operations_survive_the_server_dropping_pooled_connections(store_url: str):
    if not store_url.startswith("postgresql"):
        return
    store = SqlStore.from_url(store_url)
    record = TaskRecord(key="k", owner=None, tool="t", status=TaskStatus.WORKING, created_at=1, updated_at=1,
                        ttl_ms=None)
    store.create(record, max_rows=None)
    admin = sa.create_engine(store_url.replace("postgresql://", "postgresql+psycopg://", 1))
    with admin.connect() as conn:  # kill every other session on this database: the pool's connections die
        conn.execute(sa.text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                             "WHERE datname = current_database() AND pid <> pg_backend_pid()"))
        conn.commit()
    admin.dispose()
    assert store.get("k") == record
    assert store.update("k", ANY, lambda r: r.with_progress("after the restart", 2)).version == 2
    store.dispose()
