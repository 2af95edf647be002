"""A write on the record the caller expects: one conditional UPDATE while the row is still at its version.

`Store.update(..., expected=record)` computes the transition on `record` and writes only
the columns it changed, `WHERE key AND version [AND owner]`, in autocommit. When another
writer moved the row on (or the transition refuses the expected record), the locking
path decides on the row as it is, so the answer is the one it would have been anyway.
"""

from __future__ import annotations

import select
from dataclasses import replace
from typing import Any

import pytest
import sqlalchemy as sa

from celery_mcp_tasks.model import Run, RunInProgress, Superseded, TaskRecord, TaskStatus, TerminalTask
from celery_mcp_tasks.notify.postgres import CHANNEL, PG_HINT, hint_payload, libpq_url
from celery_mcp_tasks.service import TaskService
from celery_mcp_tasks.store.base import ANY, Quota, TaskNotFound
from celery_mcp_tasks.store.quotas import ROOM_CHECK_S, RowGauge
from celery_mcp_tasks.store.sql import SqlStore
from tests.builders import SendOnly


def _record(key: str = "k", owner: str | None = "sub:alice") -> TaskRecord:
    return TaskRecord(
        key=key,
        owner=owner,
        tool="t",
        status=TaskStatus.WORKING,
        created_at=1,
        updated_at=1,
        ttl_ms=None,
        dispatches=1,
        heartbeat_at=100,
        arguments={"items": [1, 2]},
    )


class Statements:
    """Every statement and transaction boundary the store sends, by its first word."""

    def __init__(self, store: SqlStore) -> None:
        self.seen: list[str] = []
        self.texts: list[str] = []

        @sa.event.listens_for(store.engine, "before_cursor_execute")
        def statement(conn: Any, cursor: Any, sql: str, *_: Any) -> None:
            self.seen.append(sql.split()[0].upper())
            self.texts.append(sql)

        @sa.event.listens_for(store.engine, "commit")
        def commit(conn: Any) -> None:
            if (
                getattr(conn.connection.driver_connection, "autocommit", None) is not True
            ):  # else none reaches the server
                self.seen.append("COMMIT")


@pytest.fixture
def created(store: SqlStore) -> TaskRecord:
    store.create(_record(), max_rows=None)
    found = store.get("k")
    assert found is not None
    return found


def test_the_conditional_update_wins_in_one_statement(store: SqlStore, created: TaskRecord) -> None:
    seen = Statements(store)
    written = store.update("k", ANY, lambda r: r.with_progress("half way", 5), expected=created)
    # One UPDATE: no locking read. On PostgreSQL in autocommit (one round trip); on SQLite inside the
    # BEGIN IMMEDIATE that waits for the write lock in short steps, then its COMMIT (a local file, no round trip).
    assert seen.seen == (["UPDATE", "COMMIT"] if store.dialect == "sqlite" else ["UPDATE"])
    assert (written.version, written.status_message) == (2, "half way")
    assert store.get("k") == written


def test_a_write_that_need_not_be_durable_is_the_same_one_statement_and_seen_at_once(
    store: SqlStore, created: TaskRecord
) -> None:
    """A run's claim (`durable=False`): as atomic and as visible as any write; on PostgreSQL its commit alone
    does not wait for the WAL flush, and the connection goes back to the pool as durable as it came."""
    sent: list[str] = []
    sa.event.listen(store.engine, "before_cursor_execute", lambda conn, cursor, sql, *_: sent.append(sql))
    written = store.update("k", ANY, lambda r: r.with_progress("claimed", 5), expected=created, durable=False)
    other = SqlStore.from_url(store.engine.url.render_as_string(hide_password=False))
    try:
        assert other.get("k") == written  # seen by another connection as soon as the call returned
    finally:
        other.dispose()
    durable = store.update("k", ANY, lambda r: r.with_progress("durable", 6), expected=written)
    if store.dialect == "postgresql":
        assert ["set_config" in sql for sql in sent] == [True, False]  # folded into the claim, not the next write
        with store.engine.connect() as conn:
            assert conn.exec_driver_sql("SHOW synchronous_commit").scalar() == "on"
    else:  # SQLite waits for no flush at a commit (WAL, synchronous=NORMAL): the same statements either way
        assert not any("set_config" in sql for sql in sent)
    assert durable.version == 3


def test_a_creation_is_one_statement(store: SqlStore) -> None:
    """The row cap is counted in the INSERT once a second per process (and near the cap): never a statement more,
    but for the janitor's last count of the rows, where that count starts, read by key every `BASE_REFRESH_S`."""
    now = [0.0]
    store._row_gauge = RowGauge(clock=lambda: now[0])  # the clock stands still: the second's one count, then none
    seen = Statements(store)
    store.create(_record("c1"), max_rows=None)
    store.create(_record("c2"), max_rows=1_000)  # the process's first creation under the cap counts the rows
    store.create(_record("c3"), max_rows=1_000)
    now[0] += ROOM_CHECK_S
    store.create(_record("c4"), max_rows=1_000)  # counts again, from the base it read a second ago
    per_write = ["INSERT", "COMMIT"] if store.dialect == "sqlite" else ["INSERT"]
    assert seen.seen == [*per_write, "SELECT", *per_write * 3]
    assert "mcp_tasks_sweep" in seen.texts[1]  # texts: statements only
    inserts = [text.lower() for text in seen.texts if text.lstrip().upper().startswith("INSERT")]
    assert ["count" in text for text in inserts] == [False, True, False, True]


def test_a_creation_that_need_not_be_durable_is_the_same_one_statement_and_seen_at_once(store: SqlStore) -> None:
    """A synchronous call's hidden task (`durable=False`), capped or not, within a quota or not: on PostgreSQL its
    INSERT alone skips the WAL flush at commit, and its connection goes back to the pool durable again."""
    seen = Statements(store)
    store.create(_record("c1"), max_rows=None, durable=False)
    store.create(_record("c2"), max_rows=1_000, durable=False)
    store.create(_record("c3"), max_rows=1_000, quota=Quota(active=5), durable=False)
    store.create(_record("c4"), max_rows=None)
    other = SqlStore.from_url(store.engine.url.render_as_string(hide_password=False))
    try:
        assert set(other.get_many(["c1", "c2", "c3", "c4"])) == {"c1", "c2", "c3", "c4"}  # at once, elsewhere
    finally:
        other.dispose()
    inserts = [text for text in seen.texts if text.lstrip().upper().startswith("INSERT")]
    flushed = ["set_config" not in text for text in inserts]
    assert flushed == ([False, False, False, True] if store.dialect == "postgresql" else [True] * 4)
    if store.dialect == "postgresql":
        with store.engine.connect() as conn:
            assert conn.exec_driver_sql("SHOW synchronous_commit").scalar() == "on"


def test_a_concurrent_writer_makes_it_fall_back_and_the_result_is_still_right(
    store: SqlStore, created: TaskRecord
) -> None:
    moved = store.update("k", ANY, lambda r: r.with_progress("by another writer", 3, current=7))
    assert moved.version == 2
    seen = Statements(store)
    done = store.update("k", ANY, lambda r: r.completed({"content": []}, 9), expected=created)
    assert done.status is TaskStatus.COMPLETED and done.version == 3
    assert done.progress == 7  # computed on the row as it is, not on the stale record
    assert store.get("k") == done
    assert seen.seen[0] == "UPDATE" and "SELECT" in seen.seen  # the miss, then the locking path


def test_a_terminal_row_is_never_overwritten_from_a_stale_expected_record(store: SqlStore, created: TaskRecord) -> None:
    cancelled = store.update("k", ANY, lambda r: r.cancelled(3))
    with pytest.raises(TerminalTask):
        store.update("k", ANY, lambda r: r.completed({"content": []}, 9), expected=created)
    assert store.get("k") == cancelled


def test_a_refusal_of_the_expected_record_is_decided_on_the_row(store: SqlStore, created: TaskRecord) -> None:
    stale = replace(created, dispatches=0)  # the caller's copy says another run owns the task; the row does not
    written = store.update(
        "k", ANY, lambda r: r.with_progress("mine", 4, Run(1)), expected=stale
    )  # Superseded on the copy only
    assert written.status_message == "mine" and written.version == 2
    with pytest.raises(Superseded):
        store.update("k", ANY, lambda r: r.with_progress("old run", 5, Run(0)), expected=written)


def test_the_heartbeat_a_touch_moved_is_never_rewound(store: SqlStore, created: TaskRecord) -> None:
    assert store.touch("k", 5_000)
    written = store.update("k", ANY, lambda r: r.with_progress("step", 6), expected=created)
    assert store.get("k").heartbeat_at == 5_000  # type: ignore[union-attr]
    assert written.heartbeat_at == 5_000  # what the row holds, not the expected record's 100
    # A transition that moves the heartbeat itself moves it forward only.
    began = store.update(
        "k", ANY, lambda r: r.began(Run(1), 200, stale_before_ms=0), expected=replace(written, heartbeat_at=100)
    )
    assert began.heartbeat_at == 5_000 and store.get("k") == began


def test_a_foreign_owner_on_the_fast_path_answers_like_a_missing_task(store: SqlStore, created: TaskRecord) -> None:
    with pytest.raises(TaskNotFound):
        store.update("k", "sub:mallory", lambda r: r.cancelled(3), expected=created)
    with pytest.raises(TaskNotFound):
        store.update("gone", ANY, lambda r: r.cancelled(3), expected=replace(created, key="gone"))
    assert store.get("k") == created


def test_the_service_propagates_the_expected_record(store: SqlStore) -> None:
    service = TaskService(store, dispatcher=SendOnly(lambda record: None))
    _, record = service.create(owner=None, tool="t", arguments={})
    seen = Statements(store)
    began = service.begin(record.key, Run(1), stale_before_ms=0, expected=record)
    done = service.complete(record.key, {"content": []}, run=Run(1), expected=began)
    # PostgreSQL: the claim is one statement with `synchronous_commit` off folded into its RETURNING.
    assert seen.seen == (["UPDATE", "COMMIT"] * 2 if store.dialect == "sqlite" else ["UPDATE", "UPDATE"])
    if store.dialect == "postgresql":
        claim, outcome = seen.texts
        assert "set_config" in claim and "set_config" not in outcome
    assert done.status is TaskStatus.COMPLETED and store.get(record.key) == done


# -- PostgreSQL: the autocommit pool ------------------------------------------------------------------


@pytest.mark.postgres
def test_an_autocommit_pool_takes_connections_back_without_a_rollback_and_never_in_a_transaction(
    pg_store: SqlStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write or read costs its statement alone, and a locking transaction that raised half way is still rolled
    back (by its `Connection`), so the next use of that connection starts outside any transaction."""
    from psycopg.pq import TransactionStatus

    store = pg_store
    store.create(_record(), max_rows=None)
    created = store.get("k")
    assert created is not None

    resets: list[object] = []
    real = store.engine.dialect.do_rollback
    monkeypatch.setattr(store.engine.dialect, "do_rollback", lambda conn: (resets.append(conn), real(conn)))
    store.update("k", ANY, lambda r: r.with_progress("half way", 5), expected=created)
    assert resets == []  # a write in autocommit: nothing to roll back, none sent
    pooled: list[Any] = []

    def raising_under_the_lock() -> None:
        with store._locking() as conn:
            conn.begin()
            store._select(conn, "k", ANY, for_update=True)
            pooled.append(conn.connection.driver_connection)
            assert pooled[0].info.transaction_status == TransactionStatus.INTRANS
            raise RuntimeError("a transition that raised under the row lock")

    with pytest.raises(RuntimeError):
        raising_under_the_lock()
    assert len(resets) == 1  # the Connection's own rollback of the transaction it opened
    assert pooled[0].info.transaction_status == TransactionStatus.IDLE  # back in the pool, outside any transaction
    assert pooled[0].autocommit  # and in autocommit again, as the pool hands it out
    assert store.update("k", ANY, lambda r: r.with_progress("again", 6)).version == 3


# -- PostgreSQL: the hint rides the write ------------------------------------------------------------


@pytest.fixture
def hinted(pg_store: SqlStore) -> SqlStore:
    return SqlStore(pg_store.engine, change_hint=PG_HINT)


def _listening(store: SqlStore) -> Any:
    import psycopg

    conn = psycopg.connect(libpq_url(store.engine.url.render_as_string(hide_password=False)), autocommit=True)
    conn.execute(f"LISTEN {CHANNEL}")
    return conn


def _heard(conn: Any, wait_s: float = 2.0) -> list[str]:
    payloads: list[str] = []
    if select.select([conn.fileno()], [], [], wait_s)[0]:
        payloads.extend(note.payload for note in conn.notifies(timeout=0.2))
    return payloads


@pytest.mark.postgres
def test_notify_is_delivered_with_the_fast_write_in_the_same_statement(hinted: SqlStore) -> None:
    hinted.create(_record(), max_rows=None)
    created = hinted.get("k")
    assert created is not None
    listener = _listening(hinted)
    try:
        seen = Statements(hinted)
        written = hinted.update("k", ANY, lambda r: r.with_progress("half way", 2), expected=created)
        assert seen.seen == ["UPDATE"] and "pg_notify" in seen.texts[0]  # UPDATE and pg_notify, one statement
        assert _heard(listener) == [hint_payload(written)]
        # A miss sends nothing of its own: only the locking path's write is heard, at its version.
        again = hinted.update("k", ANY, lambda r: r.with_progress("again", 3), expected=created)
        assert again.version == 3
        assert _heard(listener) == [hint_payload(again)]
    finally:
        listener.close()


def test_a_change_hint_is_postgresql_only(tmp_path: Any) -> None:
    with pytest.raises(ValueError, match="PostgreSQL"):
        SqlStore.from_url(f"sqlite:///{tmp_path / 'x.db'}", change_hint=PG_HINT)


def test_a_redelivered_copy_never_takes_over_a_run_that_beat_after_it_read(
    store: SqlStore, created: TaskRecord
) -> None:
    """A beat moves the heartbeat without a version bump: a takeover is decided under the row lock, not on the
    version the copy read (the conditional UPDATE alone would have let a live run be taken over)."""
    clock = [1_000]
    service = TaskService(store, clock=lambda: clock[0])
    run = Run(1, 0)
    service.begin("k", run, stale_before_ms=0, expected=created)  # the first copy claims the run
    seen_by_second = store.get("k")  # a redelivered copy reads the row: its heartbeat 1000
    assert seen_by_second is not None and seen_by_second.started_at == 1_000
    assert store.touch("k", 5_000, dispatch=1)  # the first copy beats: still alive
    with pytest.raises(RunInProgress):
        service.begin("k", run, stale_before_ms=2_000, expected=seen_by_second)  # 1000 < 2000 < 5000


def test_a_write_settled_as_lost_that_lands_later_is_not_applied_twice(
    store: SqlStore, created: TaskRecord, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An autocommit UPDATE holds no lock while it travels: settled as not applied, it may still land before
    the locking path reads the row. The locking path then finds it there and does not apply it again."""
    ghost = SqlStore(sa.create_engine(store.engine.url))
    real_execute = store.engine.dialect.do_execute
    armed = [True]

    def drop_the_next_update(cursor: Any, statement: str, parameters: Any, context: Any = None) -> None:
        if armed[0] and statement.lstrip().upper().startswith("UPDATE"):
            armed[0] = False
            raise store.engine.dialect.loaded_dbapi.OperationalError("injected: server closed the connection")
        real_execute(cursor, statement, parameters, context)

    @sa.event.listens_for(store.engine, "handle_error")
    def as_disconnect(context: Any) -> None:
        if "injected" in str(context.original_exception):
            context.is_disconnect = True

    monkeypatch.setattr(store.engine.dialect, "do_execute", drop_the_next_update)
    real_locked = store._locked

    def settle_then_the_statement_lands(key: str) -> TaskRecord | None:
        found = real_locked(key)
        ghost.update("k", ANY, lambda r: r.with_progress("half way", 2))  # the lost statement, landing late
        return found

    monkeypatch.setattr(store, "_locked", settle_then_the_statement_lands)
    written = store.update("k", ANY, lambda r: r.with_progress("half way", 2), expected=created)
    ghost.dispose()
    assert (written.version, written.status_message) == (2, "half way")
    stored = store.get("k")
    assert stored is not None and stored.version == 2  # once, not twice


def test_every_sqlite_write_waits_for_the_lock_in_short_steps(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """SQLite's own busy handler sleeps up to 100 ms a step: every write takes BEGIN IMMEDIATE through ours."""
    from celery_mcp_tasks.migrate import upgrade
    from celery_mcp_tasks.store import engine as engine_module

    url = f"sqlite:///{tmp_path / 'tasks.db'}"
    upgrade(url)
    store = SqlStore.from_url(url)
    store.create(_record(), max_rows=None)
    created = store.get("k")
    assert created is not None

    took: list[int] = []
    real = engine_module._begin_immediate

    def counted(connection: Any) -> None:
        took.append(1)
        real(connection)

    monkeypatch.setattr(engine_module, "_begin_immediate", counted)
    store.create(_record("k2"), max_rows=10)
    store.update("k", ANY, lambda r: r.with_progress("on", 2), expected=created)
    store.touch("k", 9_000)
    assert len(took) == 3  # the creation, the conditional UPDATE and the beat: none waits in SQLite's own steps
    stored = store.get("k")
    assert stored is not None and (stored.status_message, stored.heartbeat_at) == ("on", 9_000)
    store.dispose()
