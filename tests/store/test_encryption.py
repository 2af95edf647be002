"""Encryption at rest on SQLite and PostgreSQL: what a dump of the table holds, the key ring, re-encryption."""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest
import sqlalchemy as sa

from celery_mcp_tasks.model import TaskRecord, TaskStatus, TaskUnreadable, TerminalTask
from celery_mcp_tasks.service import TaskService
from celery_mcp_tasks.store import ANY
from celery_mcp_tasks.store.codec import KeyRing, UnreadablePayload, new_key, payload_bytes
from celery_mcp_tasks.store.rekeying import newest_sealed_key, reencrypt, ring_check
from celery_mcp_tasks.store.schema import tasks
from celery_mcp_tasks.store.sql import SqlStore
from tests.builders import SendOnly

SECRETS = ["the-argument-secret", "the-question-secret", "the-answer-secret", "the-result-secret"]
OLD, NEW = new_key(), new_key()


def make(key: str, **changes: Any) -> TaskRecord:
    values: dict[str, Any] = dict(
        key=key, owner="sub:alice", tool="t", status=TaskStatus.WORKING, created_at=1_000, updated_at=1_000, ttl_ms=None
    )
    values.update(changes)
    return TaskRecord(**values)


def dump(url: str) -> str:
    """Every column of every row, as the database returns it (pg_dump is not needed to read a table)."""
    engine = sa.create_engine(url.replace("postgresql://", "postgresql+psycopg://", 1))
    try:
        with engine.connect() as conn:
            text_columns = [sa.cast(column, sa.Text).label(column.name) for column in tasks.columns]
            rows = conn.execute(sa.select(*text_columns)).all()
    finally:
        engine.dispose()
    return "\n".join(repr(tuple(row)) for row in rows)


def raw(url: str, key: str) -> dict[str, Any]:
    engine = sa.create_engine(url.replace("postgresql://", "postgresql+psycopg://", 1))
    try:
        with engine.connect() as conn:
            return dict(conn.execute(sa.select(tasks).where(tasks.c.key == key)).mappings().one())
    finally:
        engine.dispose()


def with_ring(url: str, *keys: str) -> SqlStore:
    return SqlStore.from_url(url, ring=KeyRing.parse(keys))


def fill(store: SqlStore, key: str) -> TaskRecord:
    """A task through its life: arguments, a question, an answer, a result."""
    store.create(make(key, arguments={"password": SECRETS[0]}), max_rows=None)
    store.update(key, ANY, lambda r: r.requiring_input({"q": {"message": SECRETS[1]}}, 2_000))
    store.update(key, ANY, lambda r: r.answered({"q": {"action": "accept", "content": {"x": SECRETS[2]}}}, 3_000)[0])
    return store.update(key, ANY, lambda r: r.completed({"content": [{"type": "text", "text": SECRETS[3]}]}, 4_000))


def test_a_dump_with_encryption_on_holds_no_payload_in_clear(store_url: str):
    store = with_ring(store_url, NEW)
    try:
        done = fill(store, "k1")
        # Mid-life too: a task waiting for its answer holds its question sealed.
        store.create(make("k2", arguments={"a": SECRETS[0]}), max_rows=None)
        store.update("k2", ANY, lambda r: r.requiring_input({"q": {"message": SECRETS[1]}}, 2_000))
        assert store.get("k1") == done and done.result == {"content": [{"type": "text", "text": SECRETS[3]}]}
        assert store.get("k2").input_requests == {"q": {"message": SECRETS[1]}}
    finally:
        store.dispose()
    text = dump(store_url)
    assert "k1" in text and "mcpenc1:" in text
    for secret in SECRETS:
        assert secret not in text
    assert "password" not in text and "accept" not in text


def test_without_a_ring_payloads_are_stored_as_they_were(store_url: str):
    store = SqlStore.from_url(store_url)
    try:
        fill(store, "k1")
    finally:
        store.dispose()
    assert SECRETS[0] in dump(store_url)


def test_a_payload_moved_to_another_row_does_not_open(store_url: str):
    store = with_ring(store_url, NEW)
    try:
        store.create(make("k1", arguments={"a": SECRETS[0]}), max_rows=None)
        store.create(make("k2", arguments={"a": "other"}), max_rows=None)
        sealed = raw(store_url, "k1")["arguments"]
        with store.engine.begin() as conn:
            conn.execute(tasks.update().where(tasks.c.key == "k2").values(arguments=sealed))
        moved = store.get("k2")
        assert moved is not None and moved.status is TaskStatus.FAILED
        assert "does not decrypt" in moved.error["message"] and moved.arguments == {}
    finally:
        store.dispose()


def test_a_row_sealed_with_a_retired_key_reads_as_a_failed_task_that_nothing_moves(store_url: str):
    old = with_ring(store_url, OLD)
    old.create(make("k1", arguments={"a": SECRETS[0]}), max_rows=None)
    old.dispose()
    new = with_ring(store_url, NEW)
    try:
        found = new.get("k1")
        assert found is not None and found.status is TaskStatus.FAILED and found.terminal
        message = found.error["message"]
        assert "MCP_TASKS_ENCRYPTION_KEYS" in message and "not in" in message and SECRETS[0] not in message
        with pytest.raises(TerminalTask):
            new.update("k1", ANY, lambda r: r.completed({"content": []}, 5_000))
        assert raw(store_url, "k1")["status"] == "working"  # the row is left as it is
    finally:
        new.dispose()


def test_an_answer_or_a_cancel_for_a_row_this_process_cannot_open_is_refused_not_dropped(store_url: str):
    """A process left with an older ring reads a newer key's row as failed: an answer acknowledged there (a
    failed task ignores answers) would be lost while the row still waits for it. Refused instead, saying why."""
    sent: list[TaskRecord] = []
    newer = with_ring(store_url, NEW, OLD)
    task_id, record = TaskService(newer, dispatcher=SendOnly(sent.append)).create(
        owner="sub:alice", tool="t", arguments={"a": SECRETS[0]}
    )
    newer.update(record.key, ANY, lambda r: r.requiring_input({"q": {"message": SECRETS[1]}}, 2_000))
    newer.dispose()
    older = with_ring(store_url, OLD)
    try:
        service = TaskService(older, dispatcher=SendOnly(sent.append))
        assert service.get(task_id, "sub:alice").status is TaskStatus.FAILED  # as every reader here sees it
        with pytest.raises(TaskUnreadable, match="MCP_TASKS_ENCRYPTION_KEYS"):
            service.answer(task_id, "sub:alice", {"q": {"action": "accept", "content": {}}})
        with pytest.raises(TaskUnreadable, match="cannot be read"):
            service.cancel(task_id, "sub:alice")
        row = raw(store_url, record.key)
        assert row["status"] == "input_required" and row["version"] == record.version + 1  # untouched
    finally:
        older.dispose()


def test_an_idempotent_retry_on_a_row_this_process_cannot_open_is_refused_saying_why(store_url: str):
    """Not "already used with other arguments": the arguments it holds are out of this process's reach."""
    newer = with_ring(store_url, NEW, OLD)
    first = TaskService(newer, dispatcher=SendOnly(lambda _: None), idempotency_secret=b"s" * 32)
    _, record = first.create(owner="sub:a", tool="t", arguments={"a": 1}, idempotency_key="k")
    newer.dispose()
    older = with_ring(store_url, OLD)
    try:
        retry = TaskService(older, dispatcher=SendOnly(lambda _: None), idempotency_secret=b"s" * 32)
        with pytest.raises(TaskUnreadable, match="MCP_TASKS_ENCRYPTION_KEYS"):
            retry.create(owner="sub:a", tool="t", arguments={"a": 1}, idempotency_key="k")
        assert raw(store_url, record.key)["version"] == record.version  # untouched
    finally:
        older.dispose()


def test_the_ring_reads_with_every_key_and_writes_with_the_first(store_url: str):
    old = with_ring(store_url, OLD)
    old.create(make("k1", arguments={"a": 1}), max_rows=None)
    old.dispose()
    both = with_ring(store_url, NEW, OLD)
    try:
        assert both.get("k1").arguments == {"a": 1}
        both.update("k1", ANY, lambda r: r.completed({"content": []}, 2_000))
        row = raw(store_url, "k1")
        new_id, old_id = KeyRing.parse([NEW]).primary_id, KeyRing.parse([OLD]).primary_id
        assert row["result"].startswith(f"mcpenc1:{new_id}:") and row["arguments"].startswith(f"mcpenc1:{old_id}:")
    finally:
        both.dispose()


def test_reencrypt_seals_every_row_with_the_first_key_and_retires_the_old_one(store_url: str):
    plain = SqlStore.from_url(store_url)
    plain.create(make("plain", arguments={"a": "before encryption"}), max_rows=None)
    plain.dispose()
    old = with_ring(store_url, OLD)
    for n in range(7):
        fill(old, f"k{n}")
    old.dispose()
    ring = KeyRing.parse([NEW, OLD])
    store = SqlStore.from_url(store_url, ring=ring)
    try:
        before = {key: store.get(key) for key in ["plain", *(f"k{n}" for n in range(7))]}
        done = reencrypt(store.engine, ring, batch_size=3)
        assert (done.rewritten, done.unreadable, done.busy) == (8, 0, 0)
        assert reencrypt(store.engine, ring).current == 8  # a second pass has nothing left to do
    finally:
        store.dispose()
    assert "before encryption" not in dump(store_url)
    retired = with_ring(store_url, NEW)  # the old key is gone from the ring: everything still reads
    try:
        assert {key: retired.get(key) for key in before} == before
    finally:
        retired.dispose()


def test_reencrypt_loses_no_concurrent_write(store_url: str):
    old = with_ring(store_url, OLD)
    for n in range(40):
        old.create(make(f"k{n:02}", arguments={"n": n}), max_rows=None)
    old.dispose()
    ring = KeyRing.parse([NEW, OLD])
    store = SqlStore.from_url(store_url, ring=ring)
    stop = threading.Event()
    written: list[str] = []

    def writer() -> None:
        for n in range(40):
            key = f"k{n:02}"
            store.update(key, ANY, lambda r, n=n: r.with_progress(f"step {n}", 2_000 + n))
            store.update(key, ANY, lambda r, n=n: r.completed({"n": n}, 3_000 + n))
            written.append(key)
        stop.set()

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        while not stop.is_set():
            reencrypt(store.engine, ring, batch_size=5)
        thread.join()
        reencrypt(store.engine, ring)
        for n in range(40):
            found = store.get(f"k{n:02}")
            assert found.status is TaskStatus.COMPLETED and found.result == {"n": n} and found.arguments == {"n": n}
        new_only = KeyRing.parse([NEW])
        assert all(
            new_only.is_current(raw(store_url, f"k{n:02}")[c]) for n in range(40) for c in ("arguments", "result")
        )
    finally:
        store.dispose()


def test_the_start_up_check_refuses_a_missing_or_wrong_ring(store_url: str):
    store = with_ring(store_url, OLD)
    store.create(make("k1", arguments={"a": 1}), max_rows=None)
    store.dispose()
    engine = SqlStore.from_url(store_url).engine
    try:
        with engine.connect() as conn:
            assert ring_check(conn, KeyRing.parse([OLD])) is None
            assert ring_check(conn, KeyRing.parse([NEW, OLD])) is None
            missing = ring_check(conn, None)
            wrong = ring_check(conn, KeyRing.parse([NEW]))
    finally:
        engine.dispose()
    assert missing is not None and missing.startswith("MCP_TASKS_ENCRYPTION_KEYS: unset")
    assert wrong is not None and wrong.startswith("MCP_TASKS_ENCRYPTION_KEYS: none of its keys")


def test_the_key_processes_seal_with_is_read_from_the_tasks_created_last(store_url: str):
    """`db reencrypt` goes ahead once the running processes seal with the ring's first key. A task created
    under the old key and finished after the change (its row the last one written) does not hide a task
    created since: its arguments were sealed before the change."""
    old = with_ring(store_url, OLD)
    old.create(make("long-job", arguments={"a": 1}), max_rows=None)
    old.dispose()
    both = with_ring(store_url, NEW, OLD)
    try:
        both.create(make("created-since", arguments={"a": 2}, created_at=2_000, updated_at=2_000), max_rows=None)
        both.update("long-job", ANY, lambda r: r.completed({"content": []}, 5_000))
        with both.engine.connect() as conn:
            assert newest_sealed_key(conn) == KeyRing.parse([NEW]).primary_id
            assert ring_check(conn, KeyRing.parse([NEW])) is None
    finally:
        both.dispose()


def test_a_ring_refuses_malformed_keys_naming_the_setting():
    for bad in (["not base64!"], [new_key()[:20]], [NEW, "c2hvcnQ="]):
        with pytest.raises(ValueError, match=r"^MCP_TASKS_ENCRYPTION_KEYS: key \d of \d is not a base64 32-byte key"):
            KeyRing.parse(bad)
    assert KeyRing.parse([NEW.rstrip("=")]).primary_id == KeyRing.parse([NEW]).primary_id  # padding optional


def test_an_altered_payload_is_refused():
    ring = KeyRing.parse([NEW])
    sealed = ring.seal({"a": 1}, row="k", column="arguments")
    assert ring.open(sealed, row="k", column="arguments") == {"a": 1}
    flipped = sealed[:-2] + ("A" if sealed[-2] != "A" else "B") + sealed[-1]
    with pytest.raises(UnreadablePayload, match="does not decrypt"):
        ring.open(flipped, row="k", column="arguments")
    with pytest.raises(UnreadablePayload):
        ring.open(sealed, row="k", column="result")


def test_payload_size_is_the_compact_json_in_utf8_bytes():
    assert payload_bytes({"a": "é"}) == len(json.dumps({"a": "é"}, separators=(",", ":"), ensure_ascii=False).encode())
    assert payload_bytes({"a": "é"}) == 10


def test_a_reencrypt_the_store_fails_part_way_is_one_line_and_what_was_done_stays(
    store_url: str, capsys: pytest.CaptureFixture[str]
):
    """`db reencrypt` with the database going away after two rows (injected where the driver runs the third
    UPDATE): one line saying to run it again, exit 1, and the two rows re-encrypted stay so."""
    import sqlalchemy as sa

    from celery_mcp_tasks.cli.db import _reencrypt
    from celery_mcp_tasks.config import Settings
    from tests.support import database_gone_at

    old = with_ring(store_url, OLD)
    for n in range(4):
        fill(old, f"k{n}")
    old.dispose()
    with database_gone_at(sa.engine.Engine, "UPDATE", 3):
        # forced: the rows were written by processes sealing with OLD (what the guard looks at)
        assert _reencrypt(Settings(database_url=store_url, encryption_keys=(NEW, OLD)), force=True) == 1
    err = capsys.readouterr().err
    assert err == (
        "celery-mcp-tasks db reencrypt: the task store failed part-way (server closed the connection "
        "unexpectedly); the rows re-encrypted so far stay so: run it again\n"
    )
    new_id = KeyRing.parse([NEW]).primary_id
    assert sum(raw(store_url, f"k{n}")["arguments"].startswith(f"mcpenc1:{new_id}:") for n in range(4)) == 2
