"""After PostgreSQL drops every connection (a restart, a failover), the next operation still works.

PostgreSQL only: a SQLite file has no server that could drop a connection.
"""

import uuid

import pytest
import sqlalchemy as sa

from celery_mcp_tasks.model import TaskRecord, TaskStatus
from celery_mcp_tasks.store import ANY
from celery_mcp_tasks.store.base import StoreUnavailable
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


class Interrupted(Exception):
    """What a signal handler raises in the middle of a statement: Celery's SoftTimeLimitExceeded, for one."""


def test_a_statement_interrupted_by_a_signal_leaves_no_broken_connection_in_the_pool(pg_store: SqlStore):
    """An exception that is not the driver's, raised while a statement waits on the server, leaves its connection
    mid-query: the store must discard it, not pool it, or the next operations fail on it ("another command is
    already in progress") and a job's later writes are mislabelled as the store being unavailable."""
    import signal

    from celery_mcp_tasks.store.engine import create_store_engine
    from celery_mcp_tasks.store.schema import tasks

    record = TaskRecord(
        key="k", owner=None, tool="t", status=TaskStatus.WORKING, created_at=1, updated_at=1, ttl_ms=None
    )
    pg_store.create(record, max_rows=None)
    holder = create_store_engine(pg_store.engine.url.render_as_string(hide_password=False))

    def interrupt(_signum: int, _frame: object) -> None:
        raise Interrupted()

    before = signal.signal(signal.SIGALRM, interrupt)
    try:
        with holder.connect() as lock:
            lock.execute(sa.select(tasks.c.key).where(tasks.c.key == "k").with_for_update())  # the row stays locked
            for attempt in range(4):  # each time on a connection the pool hands out, interrupted mid-wait
                signal.setitimer(signal.ITIMER_REAL, 0.2)
                with pytest.raises(Interrupted):
                    pg_store.update("k", ANY, lambda r, n=attempt: r.with_progress(f"step {n}", 2 + n))
            lock.rollback()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, before)
        holder.dispose()
    for n in range(4):
        written = pg_store.update("k", ANY, lambda r, n=n: r.with_progress(f"after {n}", 10 + n))
        assert written.status_message == f"after {n}"


def test_a_connection_the_server_refuses_says_why_in_the_store_error(pg_store: SqlStore):
    """A role's CONNECTION LIMIT (or max_connections) reached: the error names the refusal, not only its type."""
    role = f"mcp_tasks_limited_{uuid.uuid4().hex[:8]}"
    admin = sa.create_engine(normalize_url(pg_store.engine.url.render_as_string(hide_password=False)))
    try:
        with admin.connect() as conn:
            conn.execute(sa.text(f"CREATE ROLE {role} LOGIN CONNECTION LIMIT 0"))
            conn.commit()
        limited = SqlStore.from_url(pg_store.engine.url.set(username=role).render_as_string(hide_password=False))
        try:
            with pytest.raises(StoreUnavailable) as refused:
                limited.get("k" * 64)
            assert refused.value.reason == f'OperationalError: too many connections for role "{role}"'
        finally:
            limited.dispose()
    finally:
        with admin.connect() as conn:
            conn.execute(sa.text(f"DROP ROLE IF EXISTS {role}"))
            conn.commit()
        admin.dispose()


def test_a_read_only_database_and_a_lock_timeout_are_said_in_the_settings_words(pg_store: SqlStore):
    """What an operator can act on reaches the log in its words (PostgreSQL's own text may quote values): a
    row lock not granted within `lock_timeout`, and a database turned read-only (a failover to a standby)."""
    from celery_mcp_tasks.store.engine import create_store_engine
    from celery_mcp_tasks.store.schema import tasks

    record = TaskRecord(
        key="k", owner=None, tool="t", status=TaskStatus.WORKING, created_at=1, updated_at=1, ttl_ms=None
    )
    pg_store.create(record, max_rows=None)
    url = pg_store.engine.url.render_as_string(hide_password=False)
    database = pg_store.engine.url.database
    admin = sa.create_engine(normalize_url(url), isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool)
    holder = create_store_engine(url)
    try:
        with admin.connect() as conn:  # this database's own settings, dropped with it
            conn.execute(sa.text(f'ALTER DATABASE "{database}" SET lock_timeout = 100'))
        drop_every_connection(pg_store)  # new sessions take the setting
        with holder.connect() as lock:
            lock.execute(sa.select(tasks.c.key).where(tasks.c.key == "k").with_for_update())  # the row stays locked
            with pytest.raises(StoreUnavailable) as waited:
                pg_store.update("k", ANY, lambda r: r.with_progress("blocked", 2))
            assert waited.value.reason == "LockNotAvailable: a row lock was not granted in time (lock_timeout)"
            lock.rollback()
        with admin.connect() as conn:
            conn.execute(sa.text(f'ALTER DATABASE "{database}" SET default_transaction_read_only = on'))
        drop_every_connection(pg_store)
        with pytest.raises(StoreUnavailable) as refused:
            pg_store.update("k", ANY, lambda r: r.with_progress("refused", 2))
        assert refused.value.reason == (
            "ReadOnlySqlTransaction: the database is read-only (a standby, or default_transaction_read_only)"
        )
    finally:
        holder.dispose()
        admin.dispose()
