"""The SQL store on SQLite and PostgreSQL: owner scoping, CAS, row cap, eviction."""

import threading
import time
from pathlib import Path

import pytest
import sqlalchemy as sa

from celery_mcp_tasks.model import TaskRecord, TaskStatus, TerminalTask
from celery_mcp_tasks.store import ANY, TaskLimitReached, TaskNotFound
from celery_mcp_tasks.store.codec import same_json
from celery_mcp_tasks.store.sql import SqlStore


def make(key: str, owner: str | None = None, **changes: object) -> TaskRecord:
    values: dict[str, object] = dict(
        key=key, owner=owner, tool="t", status=TaskStatus.WORKING, created_at=1_000, updated_at=1_000, ttl_ms=60_000
    )
    values.update(changes)
    return TaskRecord(**values)  # type: ignore[arg-type]


def test_a_created_task_reads_back_whole(store: SqlStore):
    rec = make("k1", "sub:alice", arguments={"n": 1}, issued_keys=("a",), input_responses={"a": {"x": 1}})
    store.create(rec, max_rows=None)
    assert store.get("k1") == rec


def test_a_lone_surrogate_is_kept_as_the_replacement_character(store: SqlStore):
    """JSON's `"\\ud800"` is no character and UTF-8 cannot hold it (the write failed): the row keeps U+FFFD, in
    arguments and results alike, and what it holds compares equal to what was sent."""
    sent = {"label": "\ud800", "\udc00": "é"}
    store.create(make("k1", arguments=sent), max_rows=None)
    assert store.get("k1").arguments == {"label": "\ufffd", "\ufffd": "é"}
    assert same_json(store.get("k1").arguments, sent)
    done = store.update("k1", ANY, lambda r: r.completed({"content": [{"type": "text", "text": "a\udfffb"}]}, 2_000))
    assert store.get("k1").result == {"content": [{"type": "text", "text": "a\ufffdb"}]}
    assert store.get("k1").version == done.version


def test_numeric_progress_reads_back_exactly(store: SqlStore):
    store.create(make("k1"), max_rows=None)
    counted = store.update("k1", ANY, lambda r: r.with_progress("a third", 2_000, current=1 / 3, total=1))
    assert (counted.progress, counted.progress_total) == (1 / 3, 1.0) and store.get("k1") == counted
    unbounded = store.update("k1", ANY, lambda r: r.with_progress("more", 3_000, current=1e12))
    assert store.get("k1") == unbounded and unbounded.progress_total is None


def test_a_foreign_task_reads_exactly_like_a_missing_one(store: SqlStore):
    store.create(make("k1", "sub:alice"), max_rows=None)
    store.create(make("k2", None), max_rows=None)
    assert store.get("k1", "sub:alice") is not None
    assert store.get("k1", "sub:bob") is None and store.get("nope", "sub:bob") is None
    assert store.get("k1", None) is None  # unauthenticated callers never see an owned task
    assert store.get("k2", "sub:alice") is None and store.get("k2", None) is not None
    with pytest.raises(TaskNotFound):
        store.update("k1", "sub:bob", lambda r: r.cancelled(2))


def test_many_tasks_read_at_once_follow_the_owner_rule_of_one(store: SqlStore):
    """`get_many` (a listen stream's `taskIds`): one read, and for each key exactly what `get` answers."""
    store.create(make("k1", "sub:alice"), max_rows=None)
    store.create(make("k2", None), max_rows=None)
    store.create(make("k3", "sub:alice", arguments={"n": 3}), max_rows=None)
    keys = ["k1", "k2", "k3", "nope"]
    for owner in ("sub:alice", "sub:bob", None, ANY):
        expected = {key: record for key in keys if (record := store.get(key, owner)) is not None}
        assert store.get_many(keys, owner) == expected, owner
    assert set(store.get_many(keys, ANY)) == {"k1", "k2", "k3"} and store.get_many([], "sub:alice") == {}


def test_many_keys_are_read_in_batches_an_old_sqlite_can_bind(tmp_path):
    """SQLite before 3.32 binds at most 999 parameters in a statement; a listen may name 1 000 tasks."""
    import sqlite3

    from celery_mcp_tasks.migrate import upgrade

    url = f"sqlite:///{tmp_path / 'tasks.db'}"
    upgrade(url)
    store = SqlStore.from_url(url)
    sa.event.listen(store.engine, "connect", lambda conn, _: conn.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, 999))
    try:
        for n in range(1_100):
            store.create(make(f"k{n}", "sub:alice"), max_rows=None)
        keys = [f"k{n}" for n in range(1_200)]
        assert set(store.get_many(keys, "sub:alice")) == {f"k{n}" for n in range(1_100)}
        assert store.versions(keys) == {f"k{n}": 1 for n in range(1_100)}
    finally:
        store.dispose()


def test_row_cap_refuses_before_storing(store: SqlStore):
    for n in range(3):
        store.create(make(f"k{n}"), max_rows=3)
    with pytest.raises(TaskLimitReached):
        store.create(make("k3"), max_rows=3)
    assert store.get("k3") is None


def test_update_applies_the_transition_and_bumps_the_version(store: SqlStore):
    store.create(make("k1"), max_rows=None)
    out = store.update("k1", ANY, lambda r: r.with_progress("step 1", 2_000))
    assert out.version == 2 and store.get("k1") == out


def test_a_refused_transition_leaves_the_row_unchanged(store: SqlStore):
    store.create(make("k1"), max_rows=None)
    done = store.update("k1", ANY, lambda r: r.completed({"content": []}, 2_000))
    with pytest.raises(TerminalTask):
        store.update("k1", ANY, lambda r: r.cancelled(3_000))
    assert store.get("k1") == done


class InFlight:
    """The statement an engine's connection is executing right now, and since when.

    A connection counts from when it is taken: on SQLite a write transaction waits for the
    lock in the engine's own `begin` listener (in short steps), which no cursor event shows.
    """

    def __init__(self, engine: sa.Engine) -> None:
        self.since: float | None = None
        sa.event.listen(engine, "engine_connect", lambda *_: setattr(self, "since", time.monotonic()))
        sa.event.listen(engine, "before_cursor_execute", lambda *_: setattr(self, "since", time.monotonic()))
        sa.event.listen(engine, "after_cursor_execute", lambda *_: setattr(self, "since", None))

    def stuck(self, for_s: float) -> bool:
        since = self.since
        return since is not None and time.monotonic() - since >= for_s


def test_a_concurrent_writer_waits_and_then_sees_the_final_state(store: SqlStore, store_url: str):
    """A cancel that arrives while a completion is mid-write can never overwrite it.

    The completion's transaction stays open until the cancel (on an engine of its own, as
    another process would be) has either read the row - what a store without locking does,
    and then overwrites - or is blocked in the database on the completion's lock.
    """
    store.create(make("k1"), max_rows=None)
    other = SqlStore.from_url(store_url)
    in_flight = InFlight(other.engine)
    seen: list[TaskStatus] = []
    outcome: list[str] = []

    def cancel_transition(record: TaskRecord) -> TaskRecord:
        seen.append(record.status)
        return record.cancelled(3_000)

    def cancel() -> None:
        try:
            other.update("k1", ANY, cancel_transition)
            outcome.append("cancelled")
        except TerminalTask:
            outcome.append("refused")

    canceller = threading.Thread(target=cancel)

    def completion_while_the_cancel_is_under_way(record: TaskRecord) -> TaskRecord:
        canceller.start()
        deadline = time.monotonic() + 20
        while not (seen or in_flight.stuck(0.2)):  # read the row, or blocked on our lock
            assert time.monotonic() < deadline, "the cancel neither read the row nor waited for the lock"
            time.sleep(0.005)
        return record.completed({"content": []}, 2_000)

    try:
        store.update("k1", ANY, completion_while_the_cancel_is_under_way)
        canceller.join(20)
    finally:
        other.dispose()
    assert outcome == ["refused"]
    assert seen and seen[-1] is TaskStatus.COMPLETED  # it decided on the final row, not the one it raced
    assert store.get("k1").status is TaskStatus.COMPLETED  # type: ignore[union-attr]


def test_cleanup_evicts_expired_and_old_finished_unlimited_tasks_in_batches(store: SqlStore):
    for n in range(7):
        store.create(make(f"exp{n}", created_at=0, ttl_ms=10), max_rows=None)
    store.create(make("live", created_at=0, ttl_ms=10_000), max_rows=None)
    store.create(make("forever-working", created_at=0, ttl_ms=None), max_rows=None)
    store.create(
        make("forever-done", created_at=0, updated_at=0, ttl_ms=None, status=TaskStatus.COMPLETED), max_rows=None
    )
    assert store.evict(now_ms=5_000, retention_ms=1_000, batch_size=3).removed == 8
    assert store.get("live") and store.get("forever-working") and not store.get("forever-done")
    assert store.evict(now_ms=5_000, retention_ms=1_000, batch_size=3).removed == 0


def test_versions_and_stale_are_server_side_reads(store: SqlStore):
    store.create(make("a", heartbeat_at=100), max_rows=None)
    store.create(make("b", heartbeat_at=10_000), max_rows=None)
    store.create(make("c", status=TaskStatus.INPUT_REQUIRED, heartbeat_at=0), max_rows=None)
    assert store.versions(["a", "b", "missing"]) == {"a": 1, "b": 1}
    assert [r.key for r in store.stale(heartbeat_before_ms=5_000, limit=10)] == ["a"]


def test_a_signed_out_console_session_stays_refused_until_it_expires_then_is_forgotten(store: SqlStore):
    """What every console process reads: a sign-out is shared through the store, idempotent, and bounded."""
    assert not store.signed_out("s1")
    store.sign_out("s1", 2_000, now_ms=1_000)
    store.sign_out("s1", 2_000, now_ms=1_000)  # again (a retried sign-out): no error, still one row
    assert store.signed_out("s1") and not store.signed_out("s2")
    store.sign_out("s2", 9_000, now_ms=2_000)  # s1's cookie has expired, but a host's clock may be behind
    assert store.signed_out("s1") and store.signed_out("s2")
    store.sign_out("s3", 9_000_000, now_ms=2_000 + 3_600_000)  # an hour past s1's expiry: its row goes
    assert not store.signed_out("s1") and store.signed_out("s2")
    with store.engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM mcp_tasks_console_signout")).scalar() == 2


def test_a_corrupt_sqlite_file_is_named_by_the_failure_a_log_line_shows(tmp_path: Path) -> None:
    """The store's fixed error keeps the database's text out of what clients see; a log line may say SQLite's
    own first line, which never quotes a value: an operator reads "malformed", not just "DatabaseError"."""
    from celery_mcp_tasks.migrate import upgrade
    from celery_mcp_tasks.store import StoreUnavailable

    path = tmp_path / "tasks.db"
    upgrade(f"sqlite:///{path}")
    store = SqlStore.from_url(f"sqlite:///{path}")
    for n in range(100):
        store.create(make(f"k{n}", arguments={"text": "x" * 400}), max_rows=None)
    store.dispose()  # the last connection closed: the write-ahead log is checkpointed into the file
    with path.open("r+b") as file:
        file.seek(4 * 4096)  # past the schema's pages, over the rows'
        file.write(b"\xde\xad" * 10 * 4096)
    store = SqlStore.from_url(f"sqlite:///{path}")
    try:
        with pytest.raises(StoreUnavailable) as failed:
            store.get_many([f"k{n}" for n in range(100)])
    finally:
        store.dispose()
    assert str(failed.value) == StoreUnavailable.MESSAGE
    assert (failed.value.operation, failed.value.reason) == ("get_many", "database disk image is malformed")


def test_a_status_message_with_a_nul_is_stored_with_a_replacement_character(store: SqlStore) -> None:
    """A job's exception text or report may hold NUL, which PostgreSQL's text refuses: the write must not fail
    (a failure nobody can record re-runs the job until the reaper calls it lost)."""
    from celery_mcp_tasks.model import failure
    from celery_mcp_tasks.service import TaskService

    service = TaskService(store)
    _, record = service.create(owner=None, tool="t", arguments={}, dispatch=False)
    service.progress(record.key, "step\x001")
    assert store.get(record.key).status_message == "step\ufffd1"
    service.fail(record.key, failure("bad record: a\x00b"), "Job failed: ValueError: bad record: a\x00b")
    failed = store.get(record.key)
    assert (
        failed.status is TaskStatus.FAILED and failed.status_message == "Job failed: ValueError: bad record: a\ufffdb"
    )
    assert failed.error == failure("bad record: a\x00b")  # JSON keeps it, escaped
