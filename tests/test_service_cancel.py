"""The service's cancel paths ask the dispatcher to revoke the job: once, only when the cancel changed
the task, and a revoke that fails changes nothing about the cancel."""

from __future__ import annotations

import pytest

from celery_mcp_tasks.model import TaskRecord, TaskStatus
from celery_mcp_tasks.service import TaskService
from celery_mcp_tasks.store.sql import SqlStore
from tests.builders import SendOnly


class Runner:
    """A `Dispatcher` that records sends and revokes."""

    def __init__(self, revoke_fails: bool = False) -> None:
        self.sent: list[TaskRecord] = []
        self.revoked: list[TaskRecord] = []
        self.revoke_fails = revoke_fails

    def send(self, record: TaskRecord) -> None:
        self.sent.append(record)

    def revoke(self, record: TaskRecord) -> None:
        self.revoked.append(record)
        if self.revoke_fails:
            raise ConnectionError("broker down")


def test_tasks_cancel_revokes_once_and_a_second_cancel_does_not(store: SqlStore) -> None:
    runner = Runner()
    service = TaskService(store, dispatcher=runner)
    task_id, _ = service.create(owner="sub:a", tool="t", arguments={})
    cancelled, changed = service.cancel(task_id, "sub:a")
    assert changed and runner.revoked == [cancelled] and cancelled.status is TaskStatus.CANCELLED
    service.cancel(task_id, "sub:a")
    assert runner.revoked == [cancelled]


def test_cancel_by_key_revokes_too_but_not_a_task_that_already_ended(store: SqlStore) -> None:
    runner = Runner()
    service = TaskService(store, dispatcher=runner)
    _, running = service.create(owner=None, tool="t", arguments={})
    _, done = service.create(owner=None, tool="t", arguments={})
    service.complete(done.key, {"content": []})
    cancelled, _ = service.cancel_by_key(running.key, "The synchronous caller cancelled the request")
    service.cancel_by_key(done.key, "The synchronous caller cancelled the request")
    assert runner.revoked == [cancelled]


@pytest.mark.parametrize("runner", [Runner(revoke_fails=True), None], ids=["revoke fails", "no revoke"])
def test_the_cancel_stands_whatever_the_revoke_does(store: SqlStore, runner: Runner | None) -> None:
    sent: list[TaskRecord] = []
    service = TaskService(store, dispatcher=runner if runner is not None else SendOnly(sent.append))
    task_id, _ = service.create(owner=None, tool="t", arguments={})
    record, changed = service.cancel(task_id, None)
    assert changed and record.status is TaskStatus.CANCELLED
    assert service.get(task_id, None).status is TaskStatus.CANCELLED
