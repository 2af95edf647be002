"""PostgreSQL's driver-level writes (store/pg_writes.py): what the locking path and Core write, in fewer round trips.

Against a real PostgreSQL: the row written is the row Core writes (JSON `null` included),
the hint rides the UPDATE and arrives at commit, two driver-level statements per update
(the locked read, the write), a failed write surfaces as SQLAlchemy's errors do and leaves
the pool clean, and a connection dropped between the read and the write costs nothing but
the retry.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa

from celery_mcp_tasks.model import TaskRecord, TaskStatus
from celery_mcp_tasks.notify.postgres import CHANNEL, pg_notify_hook
from celery_mcp_tasks.store import ANY
from celery_mcp_tasks.store.engine import normalize_url
from celery_mcp_tasks.store.sql import SqlStore
from tests.store.test_reconnect import drop_every_connection

pytestmark = pytest.mark.postgres


def make(key: str, **changes: Any) -> TaskRecord:
    values: dict[str, Any] = dict(
        key=key, owner="sub:alice", tool="t", status=TaskStatus.WORKING, created_at=1, updated_at=1, ttl_ms=60_000
    )
    values.update(changes)
    return TaskRecord(**values)


def stored(store: SqlStore, key: str) -> dict[str, Any]:
    """The row as PostgreSQL holds it (JSON text, SQL NULLs), the key and version left out."""
    with store.engine.connect() as conn:
        row = conn.execute(
            sa.text("SELECT row_to_json(t)::text FROM mcp_tasks_task t WHERE key = :key"), {"key": key}
        ).scalar_one()
    values = dict(json.loads(row))
    values.pop("key")
    return values


def test_the_short_swap_writes_what_the_locking_swap_writes(pg_store: SqlStore) -> None:
    answered = dict(input_responses={"a": {"ok": True}}, issued_keys=("a",), result=None, error=None)
    for key in ("a" * 64, "b" * 64):
        pg_store.create(make(key, arguments={"n": 1, "s": "é"}), max_rows=None)

    def transition(record: TaskRecord) -> TaskRecord:
        return dataclasses.replace(record, version=record.version + 1, status_message="halfway", **answered)

    short = pg_store.update("a" * 64, "sub:alice", transition)
    locking = pg_store._swap("b" * 64, "sub:alice", transition)  # the path every later attempt takes
    assert locking is not None and dataclasses.replace(locking, key=short.key) == short
    assert stored(pg_store, "a" * 64) == stored(pg_store, "b" * 64)
    assert stored(pg_store, "a" * 64)["result"] is None  # JSON null, as Core writes it (row_to_json: null either way)
    with pg_store.engine.connect() as conn:
        nulls = conn.execute(sa.text("SELECT result IS NULL, result::text FROM mcp_tasks_task ORDER BY key")).all()
    assert nulls == [(False, "null"), (False, "null")]


def test_two_statements_per_update_and_the_owner_still_scopes_it(pg_store: SqlStore) -> None:
    pg_store.create(make("c" * 64), max_rows=None)
    statements: list[str] = []
    sa.event.listen(pg_store.engine, "before_cursor_execute", lambda _c, _cur, sql, *_: statements.append(sql))
    done = pg_store.update("c" * 64, "sub:alice", lambda r: r.with_progress("step", 2))
    assert [sql.split()[0] for sql in statements] == ["SELECT", "UPDATE"]  # no BEGIN/COMMIT statements: the driver's
    assert "FOR UPDATE" in statements[0] and "version" in statements[1]
    assert done.version == 2 and pg_store.get("c" * 64) == done
    from celery_mcp_tasks.store import TaskNotFound

    with pytest.raises(TaskNotFound):
        pg_store.update("c" * 64, "sub:bob", lambda r: r.with_progress("not yours", 3))
    assert pg_store.get("c" * 64) == done


def test_the_hint_rides_the_update_and_arrives_at_commit(pg_store: SqlStore) -> None:
    pg_store.write_hook = pg_notify_hook
    record = make("d" * 64, poll_interval_ms=500)
    pg_store.create(record, max_rows=None)
    url = normalize_url(pg_store.engine.url.render_as_string(hide_password=False)).replace("+psycopg", "")
    with psycopg.connect(url, autocommit=True) as listener:
        listener.execute(f"LISTEN {CHANNEL}")
        written = pg_store.update(record.key, ANY, lambda r: r.with_progress("step", 2))
        payloads = [note.payload for note in listener.notifies(timeout=5, stop_after=1)]
    assert payloads == [f"{record.key}:{written.version}"]


def test_a_connection_dropped_between_the_read_and_the_write_is_applied_once(pg_store: SqlStore) -> None:
    pg_store.create(make("e" * 64), max_rows=None)
    calls = 0

    def transition(record: TaskRecord) -> TaskRecord:
        nonlocal calls
        calls += 1
        if calls == 1:
            assert drop_every_connection(pg_store) >= 1  # the read's own connection, its transaction open
        return record.with_progress(f"call {calls}", 2)

    done = pg_store.update("e" * 64, ANY, transition)
    assert calls == 2 and done.version == 2 and done.status_message == "call 2"
    assert pg_store.get("e" * 64) == done


def test_a_write_the_database_refuses_is_store_unavailable_and_the_pool_stays_clean(pg_store: SqlStore) -> None:
    from celery_mcp_tasks.store import StoreUnavailable

    one = SqlStore.from_url(pg_store.engine.url.render_as_string(hide_password=False), pool_size=1, max_overflow=0)
    try:
        one.create(make("f" * 64), max_rows=None)
        operations: list[str] = []
        sa.event.listen(one.engine, "handle_error", lambda context: operations.append(context.statement.split()[0]))
        too_long = lambda r: dataclasses.replace(r, version=r.version + 1, tool="t" * 200)  # noqa: E731 - varchar(128)
        with pytest.raises(StoreUnavailable) as refused:
            one.update("f" * 64, ANY, too_long)
        assert str(refused.value) == StoreUnavailable.MESSAGE and operations == ["UPDATE"]  # the error metric sees it
        assert one.update("f" * 64, ANY, lambda r: r).version == 1  # nothing to write: the same record
        done = one.update("f" * 64, ANY, lambda r: r.with_progress("after", 2))  # the pool's one connection, clean
        assert done.version == 2 and one.get("f" * 64) == done
    finally:
        one.dispose()


def test_a_creation_writes_what_core_writes_and_the_row_cap_still_refuses(pg_store: SqlStore) -> None:
    from celery_mcp_tasks.store import TaskLimitReached
    from celery_mcp_tasks.store.schema import tasks
    from celery_mcp_tasks.store.sql import _to_row

    fields = dict(arguments={"n": 1, "s": "é"}, issued_keys=("a",), result=None, progress=0.5, trace_context="00-x")
    pg_store.create(make("1" * 64, **fields), max_rows=None)  # the driver-level INSERT
    with pg_store.engine.begin() as conn:
        conn.execute(tasks.insert(), _to_row(make("2" * 64, **fields)))  # Core's
    assert stored(pg_store, "1" * 64) == stored(pg_store, "2" * 64)
    assert pg_store.get("1" * 64) == make("1" * 64, **fields)
    pg_store.create(make("3" * 64), max_rows=4)  # the capped INSERT: room for one more
    with pytest.raises(TaskLimitReached):
        pg_store.create(make("4" * 64), max_rows=3)
    assert pg_store.get("4" * 64) is None
