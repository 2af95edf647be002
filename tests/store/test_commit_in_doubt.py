"""A connection lost during COMMIT: the store never applies a write twice, nor fails one that landed.

The fault is injected in the dialect's `do_commit` (a transaction's COMMIT), or in
its `do_execute` for a write that is one statement in autocommit (a creation, an
update on the record the caller expects), on SQLite and PostgreSQL: `applied`
commits for real and then loses the connection (the server committed, the client
never heard), `lost` rolls back (or never sends the statement) and loses it
(nothing committed). Both read as a dropped connection to SQLAlchemy, which
invalidates the pool as it would after a server restart.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy as sa

from celery_mcp_tasks.model import TaskRecord, TaskStatus
from celery_mcp_tasks.service import TaskService
from celery_mcp_tasks.store.base import ANY, StoreUnavailable
from celery_mcp_tasks.store.sql import SqlStore

ELICIT = {"method": "elicitation/create", "params": {"message": "ok?", "requestedSchema": {"type": "object"}}}


DROPPED = "injected: server closed the connection unexpectedly"


class CommitFault:
    """Arms one COMMIT to fail after (`applied`) or instead of (`lost`) really committing."""

    def __init__(self, store: SqlStore) -> None:
        self.mode: str | None = None
        self.statement_mode: str | None = None
        self.fired = 0
        self.before_raising: Callable[[], None] | None = None
        dialect = store.engine.dialect
        real = dialect.do_commit

        def do_commit(dbapi_connection: Any) -> None:
            mode, self.mode = self.mode, None
            if mode is None:
                return real(dbapi_connection)
            self.fired += 1
            if mode == "applied":
                real(dbapi_connection)
            else:
                dbapi_connection.rollback()
            if self.before_raising is not None:
                self.before_raising()
            raise dialect.loaded_dbapi.OperationalError(DROPPED)  # the driver's own error type

        dialect.do_commit = do_commit  # type: ignore[method-assign]
        real_execute = dialect.do_execute

        def do_execute(cursor: Any, statement: str, parameters: Any, context: Any = None) -> None:
            mode, self.statement_mode = self.statement_mode, None
            if mode is None:
                return real_execute(cursor, statement, parameters, context)
            self.fired += 1
            if mode == "applied":
                real_execute(cursor, statement, parameters, context)
                if cursor.description is not None:
                    cursor.fetchall()  # the statement runs to its end (SQLite commits it only then)
            if self.before_raising is not None:
                self.before_raising()
            raise dialect.loaded_dbapi.OperationalError(DROPPED)

        dialect.do_execute = do_execute  # type: ignore[method-assign]

        @sa.event.listens_for(store.engine, "handle_error")
        def as_disconnect(context: Any) -> None:
            if DROPPED in str(context.original_exception):
                context.is_disconnect = True

    def arm(self, mode: str) -> None:
        self.mode = mode

    def arm_statement(self, mode: str) -> None:
        """The next statement (a write in autocommit) lands (`applied`) or not (`lost`), then the connection drops."""
        self.statement_mode = mode


@pytest.fixture
def fault(store: SqlStore) -> CommitFault:
    store.get("warm-up")  # the engine's first connection (its dialect's own queries) before any fault
    return CommitFault(store)


class Sent:
    def __init__(self) -> None:
        self.records: list[TaskRecord] = []

    def send(self, record: TaskRecord) -> None:
        self.records.append(record)

    def revoke(self, record: TaskRecord) -> None:
        pass


def _record(key: str = "k") -> TaskRecord:
    return TaskRecord(
        key=key,
        owner="sub:alice",
        tool="t",
        status=TaskStatus.WORKING,
        created_at=1,
        updated_at=1,
        ttl_ms=None,
        arguments={"items": [1, 2]},
        issued_keys=("a",),
    )


def _rows(store: SqlStore) -> int:
    with store.engine.connect() as conn:
        return int(conn.execute(sa.text("SELECT count(*) FROM mcp_tasks_task")).scalar_one())


def test_a_create_whose_commit_landed_succeeds_once(store: SqlStore, fault: CommitFault) -> None:
    fault.arm_statement("applied")
    store.create(_record(), max_rows=100)  # before: the blind retry hit the row it had just inserted
    assert fault.fired == 1
    assert store.get("k") == _record() and _rows(store) == 1


@pytest.mark.parametrize("max_rows", [None, 100], ids=["uncapped", "counting-the-rows"])
def test_a_create_whose_commit_was_lost_is_inserted_again(
    store: SqlStore, fault: CommitFault, max_rows: int | None
) -> None:
    """Capped, the process's first creation counts the rows in its INSERT: a database restarted meanwhile drops
    that statement, and the creation must still land (the count once ran as a statement of its own, unguarded)."""
    fault.arm_statement("lost")
    store.create(_record(), max_rows=max_rows)
    assert fault.fired == 1
    assert store.get("k") == _record() and _rows(store) == 1


def test_an_answer_whose_commit_landed_still_resumes_and_sends_the_job(store: SqlStore, fault: CommitFault) -> None:
    sent = Sent()
    service = TaskService(store, dispatcher=sent)
    task_id, record = service.create(owner="sub:alice", tool="t", arguments={})
    service.require_input(record.key, {"q": ELICIT})
    sent.records.clear()
    fault.arm("applied")
    resumed = service.answer(task_id, "sub:alice", {"q": {"action": "accept", "content": {}}})
    # Before: the retry recomputed on the already answered row, found nothing outstanding
    # ("invalid transition"), and the new run was never sent.
    assert fault.fired == 1
    assert resumed.status is TaskStatus.WORKING and resumed.dispatches == record.dispatches + 1
    assert [r.dispatches for r in sent.records] == [resumed.dispatches]
    assert store.get(record.key) == resumed


def test_an_update_whose_commit_was_lost_is_applied_once(store: SqlStore, fault: CommitFault) -> None:
    store.create(_record(), max_rows=None)
    fault.arm("lost")
    written = store.update("k", ANY, lambda r: r.with_progress("half way", 2))
    assert fault.fired == 1
    assert written.version == 2 and store.get("k") == written


def test_an_update_that_cannot_tell_whether_it_landed_fails_rather_than_applying_twice(
    store: SqlStore, fault: CommitFault
) -> None:
    store.create(_record(), max_rows=None)
    other = SqlStore(sa.create_engine(store.engine.url))  # another writer moves the row on meanwhile

    def another_write() -> None:
        fault.before_raising = None
        other.update("k", ANY, lambda r: r.with_progress("someone else", 3))

    fault.before_raising = another_write
    fault.arm("applied")
    with pytest.raises(StoreUnavailable) as raised:
        store.update("k", ANY, lambda r: r.with_progress("mine", 2))
    assert str(raised.value) == "The task store is unavailable" and raised.value.operation == "update"
    final = store.get("k")
    assert final is not None and (final.version, final.status_message) == (3, "someone else")
    other.dispose()


@pytest.mark.parametrize("mode", ["applied", "lost"])
def test_an_update_on_the_expected_record_lost_in_flight_is_applied_once(
    store: SqlStore, fault: CommitFault, mode: str
) -> None:
    store.create(_record(), max_rows=None)
    expected = store.get("k")
    assert expected is not None
    fault.arm_statement(mode)
    written = store.update("k", ANY, lambda r: r.with_progress("half way", 2), expected=expected)
    assert fault.fired == 1
    assert written.version == 2 and written.status_message == "half way" and store.get("k") == written


def test_an_update_on_the_expected_record_that_cannot_tell_fails_rather_than_applying_twice(
    store: SqlStore, fault: CommitFault
) -> None:
    store.create(_record(), max_rows=None)
    expected = store.get("k")
    other = SqlStore(sa.create_engine(store.engine.url))

    def another_write() -> None:
        fault.before_raising = None
        other.update("k", ANY, lambda r: r.with_progress("someone else", 3))

    fault.before_raising = another_write
    # PostgreSQL: the autocommit statement itself is the commit; SQLite: its COMMIT after BEGIN IMMEDIATE.
    fault.arm_statement("applied") if store.dialect == "postgresql" else fault.arm("applied")
    with pytest.raises(StoreUnavailable):
        store.update("k", ANY, lambda r: r.with_progress("mine", 2), expected=expected)
    final = store.get("k")
    assert final is not None and (final.version, final.status_message) == (3, "someone else")
    other.dispose()
