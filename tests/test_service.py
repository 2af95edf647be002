"""`TaskService` on a real store (SQLite and PostgreSQL), with a recording dispatcher and notifier.

The dispatcher and notifier are the seams the composition root fills with Celery and the
push transports; here they record what the service asked of them, which is the contract.
"""

from __future__ import annotations

from typing import Any

import pytest

from celery_mcp_tasks.model import TaskRecord, TaskStatus, TerminalTask
from celery_mcp_tasks.service import TaskExpired, TaskService
from celery_mcp_tasks.store.base import ANY, TaskNotFound
from celery_mcp_tasks.store.sql import SqlStore
from tests.builders import SendOnly

ELICIT = {"method": "elicitation/create", "params": {"message": "ok?", "requestedSchema": {"type": "object"}}}


class Recorder:
    def __init__(self, fail: bool = False) -> None:
        self.sent: list[TaskRecord] = []
        self.notified: list[TaskRecord] = []
        self.fail = fail

    def dispatch(self, record: TaskRecord) -> None:
        if self.fail:
            raise ConnectionError("broker down")
        self.sent.append(record)

    def task_changed(self, record: TaskRecord) -> None:  # the Notifier protocol
        self.notified.append(record)


@pytest.fixture
def seen() -> Recorder:
    return Recorder()


@pytest.fixture
def service(store: SqlStore, seen: Recorder) -> TaskService:
    return TaskService(store, notifier=seen, dispatcher=SendOnly(seen.dispatch))


def _asking(service: TaskService, *keys: str) -> tuple[str, TaskRecord]:
    task_id, record = service.create(owner="sub:alice", tool="t", arguments={"x": 1})
    record = service.require_input(record.key, dict.fromkeys(keys, ELICIT), "Waiting")
    return task_id, record


def test_create_commits_the_row_before_it_sends_the_job(service: TaskService, store: SqlStore, seen: Recorder) -> None:
    task_id, record = service.create(owner="sub:alice", tool="t", arguments={"x": 1})
    assert [sent.key for sent in seen.sent] == [record.key]
    assert store.get(record.key, ANY) == record  # what was sent is exactly what is stored
    assert (record.status, record.dispatches) == (TaskStatus.WORKING, 1)
    assert service.get(task_id, "sub:alice") == record


def test_a_job_that_cannot_be_sent_leaves_a_failed_task_the_client_can_read(store: SqlStore) -> None:
    service = TaskService(store, dispatcher=SendOnly(Recorder(fail=True).dispatch))
    task_id, record = service.create(owner=None, tool="t", arguments={})
    assert record.status is TaskStatus.FAILED
    assert service.get(task_id, None).error == {"message": "Could not enqueue the job", "data": "ConnectionError"}


def test_the_last_answer_resumes_in_one_write_one_notification_one_send(service: TaskService, seen: Recorder) -> None:
    task_id, asked = _asking(service, "a", "b")
    seen.sent.clear()
    seen.notified.clear()
    partial = service.answer(task_id, "sub:alice", {"a": {"action": "accept", "content": {}}})
    assert partial.status is TaskStatus.INPUT_REQUIRED and set(partial.input_requests) == {"b"}
    assert seen.sent == [] and len(seen.notified) == 1
    resumed = service.answer(task_id, "sub:alice", {"b": {"action": "accept", "content": {}}, "zzz": {}})
    assert resumed.status is TaskStatus.WORKING and resumed.input_requests == {}
    assert resumed.version == partial.version + 1  # answers and the new run: one transition
    assert resumed.dispatches == asked.dispatches + 1
    assert seen.sent == [resumed] and seen.notified[-1] == resumed and len(seen.notified) == 2
    assert set(resumed.input_responses) == {"a", "b"}


def test_answering_nothing_outstanding_changes_nothing(service: TaskService, seen: Recorder) -> None:
    task_id, asked = _asking(service, "a")
    seen.notified.clear()
    assert service.answer(task_id, "sub:alice", {"never-issued": {}}) == asked
    assert seen.notified == []


def test_unknown_foreign_and_unencodable_ids_are_all_simply_not_found(service: TaskService) -> None:
    task_id, _ = service.create(owner="sub:alice", tool="t", arguments={})
    for who, which in (("sub:mallory", task_id), ("sub:alice", "no-such-task"), ("sub:alice", "\ud800")):
        with pytest.raises(TaskNotFound):
            service.get(which, who)
        with pytest.raises(TaskNotFound):
            service.cancel(which, who)
    assert service.get(task_id, "sub:alice").status is TaskStatus.WORKING  # nothing above changed it


def test_an_expired_task_reads_as_expired_before_the_janitor_evicts_it(store: SqlStore) -> None:
    clock = [1_000]
    service = TaskService(store, clock=lambda: clock[0])
    task_id, _ = service.create(owner=None, tool="t", arguments={}, ttl_ms=50, dispatch=False)
    clock[0] += 50
    with pytest.raises(TaskExpired):
        service.get(task_id, None)


def test_many_tasks_read_at_once_leave_out_what_get_refuses(store: SqlStore) -> None:
    """`get_many` (a listen stream's `taskIds`): the caller's unexpired tasks; missing, foreign, expired left out."""
    clock = [1_000]
    service = TaskService(store, clock=lambda: clock[0])
    mine, _ = service.create(owner="sub:alice", tool="t", arguments={}, dispatch=False)
    short, _ = service.create(owner="sub:alice", tool="t", arguments={}, ttl_ms=50, dispatch=False)
    theirs, _ = service.create(owner="sub:bob", tool="t", arguments={}, dispatch=False)
    clock[0] += 50
    found = service.get_many([mine, short, theirs, "no-such-task"], "sub:alice")
    assert found == {mine: service.get(mine, "sub:alice")}


def test_cancel_is_final_and_a_late_result_cannot_overwrite_it(service: TaskService, seen: Recorder) -> None:
    task_id, record = service.create(owner=None, tool="t", arguments={})
    cancelled, changed = service.cancel(task_id, None)
    assert changed and cancelled.status is TaskStatus.CANCELLED
    again, changed_again = service.cancel(task_id, None)
    assert not changed_again and again == cancelled
    with pytest.raises(TerminalTask):
        service.complete(record.key, {"content": []})
    assert service.get(task_id, None).status is TaskStatus.CANCELLED


def test_numeric_progress_is_stored_and_notified_and_bad_numbers_never_write(
    service: TaskService, seen: Recorder
) -> None:
    _, record = service.create(owner=None, tool="t", arguments={})
    counted = service.progress(record.key, "Section 2 of 3", current=2, total=3)
    assert (counted.status_message, counted.progress, counted.progress_total) == ("Section 2 of 3", 2.0, 3.0)
    assert seen.notified[-1] == counted and service.record(record.key) == counted
    notified = len(seen.notified)
    with pytest.raises(ValueError, match="total needs a current value"):
        service.progress(record.key, "x", total=3)
    with pytest.raises(ValueError, match="must not be negative"):
        service.progress(record.key, "x", current=-1)
    assert service.record(record.key) == counted and len(seen.notified) == notified
    done = service.complete(record.key, {"content": []})
    assert (done.progress, done.progress_total) == (3.0, 3.0)  # the work is done: its bar is full
    assert service.record(record.key) == done


@pytest.mark.parametrize("finish", ["complete", "fail"])
def test_each_final_state_refuses_every_later_write(service: TaskService, finish: str) -> None:
    _, record = service.create(owner=None, tool="t", arguments={})
    if finish == "complete":
        service.complete(record.key, {"content": []})
    else:
        service.fail(record.key, {"code": -32603, "message": "boom"})
    writes: list[Any] = [
        lambda: service.progress(record.key, "late"),
        lambda: service.complete(record.key, {"content": []}),
        lambda: service.fail(record.key, {"code": -32603, "message": "late"}),
        lambda: service.require_input(record.key, {"k": ELICIT}),
    ]
    for write in writes:
        with pytest.raises(TerminalTask):
            write()
