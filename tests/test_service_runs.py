"""`TaskService.begin`: one copy of a run's message runs the body, however often the broker delivers it.

Redis hands an unacknowledged message out again after its visibility timeout, while
the first copy may still be running. The first copy claims the run; a second copy
of the same run stands aside while the first one heartbeats, and takes over once
the heartbeat is stale (the first copy died with its worker).
"""

from __future__ import annotations

import pytest

from celery_mcp_tasks.model import Run, RunInProgress, Superseded, TaskRecord, TaskStatus
from celery_mcp_tasks.service import TaskService
from celery_mcp_tasks.store.sql import SqlStore
from tests.builders import Clock

STALE_MS = 3_000


class Seen:
    def __init__(self) -> None:
        self.notified: list[TaskRecord] = []
        self.sent: list[TaskRecord] = []

    def task_changed(self, record: TaskRecord) -> None:
        self.notified.append(record)

    def send(self, record: TaskRecord) -> None:
        self.sent.append(record)

    def revoke(self, record: TaskRecord) -> None:
        pass


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def seen() -> Seen:
    return Seen()


@pytest.fixture
def service(store: SqlStore, clock: Clock, seen: Seen) -> TaskService:
    return TaskService(store, notifier=seen, dispatcher=seen, clock=clock)


def _begin(service: TaskService, clock: Clock, key: str, run: Run) -> TaskRecord:
    return service.begin(key, run, stale_before_ms=clock.now - STALE_MS)


def test_the_first_copy_claims_the_run_and_a_second_copy_stands_aside(
    service: TaskService, clock: Clock, seen: Seen
) -> None:
    _, created = service.create(owner=None, tool="t", arguments={})
    seen.notified.clear()
    clock.now += 10
    first = _begin(service, clock, created.key, Run(1))
    assert (first.started_at, first.heartbeat_at) == (clock.now, clock.now)
    assert (first.status_message, first.updated_at) == ("Started", clock.now) and seen.notified == [first]
    seen.notified.clear()
    clock.now += STALE_MS - 1  # the first copy's heartbeat is still fresh
    with pytest.raises(RunInProgress):
        _begin(service, clock, created.key, Run(1))
    service.heartbeat(created.key, Run(1))
    clock.now += STALE_MS - 1
    with pytest.raises(RunInProgress):
        _begin(service, clock, created.key, Run(1))
    assert seen.notified == []  # a copy standing aside writes nothing


def test_a_copy_takes_over_once_the_first_ones_heartbeat_is_stale(service: TaskService, clock: Clock) -> None:
    _, created = service.create(owner=None, tool="t", arguments={})
    _begin(service, clock, created.key, Run(1))
    clock.now += STALE_MS + 1  # the first copy died with its worker: nobody beats
    taken = _begin(service, clock, created.key, Run(1))
    assert (taken.started_at, taken.heartbeat_at) == (clock.now, clock.now)
    assert taken.status_message == "Started again after the worker was lost"
    with pytest.raises(RunInProgress):  # and now this copy is the one that runs
        _begin(service, clock, created.key, Run(1))


def test_every_new_run_or_attempt_is_claimed_afresh(service: TaskService, clock: Clock, seen: Seen) -> None:
    task_id, created = service.create(owner=None, tool="t", arguments={})
    _begin(service, clock, created.key, Run(1))
    retried = _begin(service, clock, created.key, Run(1, 1))  # Celery's next attempt (its retry signal was late)
    assert retried.attempt == 1 and retried.status_message == "Started (attempt 2)"
    assert seen.notified[-1] == retried  # that one clients see
    service.require_input(created.key, {"q": {"method": "roots/list", "params": {}}}, run=Run(1, 1))
    resumed = service.answer(task_id, None, {"q": {"roots": []}})
    assert resumed.dispatches == 2 and resumed.started_at is None
    again = _begin(service, clock, created.key, Run(2))
    assert again.started_at == clock.now and again.status_message == "Resumed with the answers"
    with pytest.raises(Superseded):  # a copy of the old run stays superseded, not "in progress"
        _begin(service, clock, created.key, Run(1, 1))


def test_a_retry_scheduled_for_later_is_claimed_when_it_starts(service: TaskService, clock: Clock) -> None:
    _, created = service.create(owner=None, tool="t", arguments={})
    _begin(service, clock, created.key, Run(1))
    scheduled = service.retrying(created.key, Run(1, 1), start_by_ms=clock.now + 60_000)  # the heartbeat moves ahead
    assert scheduled.status_message == "Retrying (attempt 2)"
    clock.now += 10
    started = _begin(service, clock, created.key, Run(1, 1))
    assert (started.started_at, started.status_message) == (clock.now, "Started (attempt 2)")
    record = service.record(created.key)
    assert record is not None and record.status is TaskStatus.WORKING


def test_a_start_is_visible_once_and_a_start_that_changes_nothing_is_not_notified(
    service: TaskService, clock: Clock, seen: Seen
) -> None:
    """A job that never reports: its start moves lastUpdatedAt and the version, and clients hear of it."""
    _, created = service.create(owner=None, tool="t", arguments={}, status_message="Queued")
    clock.now += 10
    started = _begin(service, clock, created.key, Run(1))
    assert started.status_message == "Started" and started.updated_at == clock.now > created.updated_at
    assert started.version > created.version and seen.notified[-1] == started
    clock.now += STALE_MS + 1  # taken over twice: the second take-over has nothing new to say
    _begin(service, clock, created.key, Run(1))
    notified = len(seen.notified)
    clock.now += STALE_MS + 1
    quiet = _begin(service, clock, created.key, Run(1))
    assert quiet.started_at == clock.now and quiet.updated_at < clock.now and len(seen.notified) == notified


def test_a_waiting_message_beats_its_task_only_while_no_copy_of_its_run_started(
    service: TaskService, clock: Clock
) -> None:
    """A worker holding a message it has not started keeps the task alive (`worker.held`), but never a run
    another copy started: if that copy died, a waiting copy's beat would hide it from the reaper."""
    _, created = service.create(owner=None, tool="t", arguments={})
    assert service.heartbeat(created.key, Run(1), waiting=True)  # queued: nobody started it
    _begin(service, clock, created.key, Run(1))
    assert not service.heartbeat(created.key, Run(1), waiting=True)  # a copy runs: its own beats speak for it
    clock.now += STALE_MS + 1
    assert service.heartbeat(created.key, Run(1, 1), waiting=True)  # Celery's next attempt, its retry signal late
    assert service.heartbeat(created.key, Run(1))  # a running copy's beat is unconditional
    service.retrying(created.key, Run(1, 2), start_by_ms=clock.now)  # attempt 2 scheduled, not started
    assert not service.heartbeat(created.key, Run(1, 1), waiting=True)  # an older attempt's copy: not its to keep
    assert service.heartbeat(created.key, Run(1, 2), waiting=True)


def test_a_dropped_message_fails_its_task_naming_the_tool_and_what_to_do(service: TaskService, seen: Seen) -> None:
    """A worker of an older release drops a message of a tool it does not know (Celery's `task_unknown`)."""
    _, created = service.create(owner=None, tool="t", arguments={})
    assert service.dropped(created.key, Run(1, 0, created.created_at), tool="t")
    failed = service.record(created.key)
    assert failed is not None and failed.status is TaskStatus.FAILED and len(seen.sent) == 1
    said = "The worker that got the job does not know tool 't': restart the workers with the code that defines it"
    assert failed.status_message == said and failed.error is not None and failed.error["message"] == said
    assert not service.dropped(created.key, Run(1, 0, created.created_at), tool="t")  # a redelivery: final already


def test_a_dropped_message_of_another_run_or_task_or_of_a_started_run_changes_nothing(
    service: TaskService, clock: Clock
) -> None:
    _, created = service.create(owner=None, tool="t", arguments={})
    born = created.created_at
    assert not service.dropped(created.key, Run(1, 0, born - 1), tool="t")  # an earlier task under the key
    assert not service.dropped(created.key, Run(0, 0, born), tool="t")  # an earlier dispatch
    _begin(service, clock, created.key, Run(1, 0, born))  # another copy of the message started
    assert not service.dropped(created.key, Run(1, 0, born), tool="t")
    record = service.record(created.key)
    assert record is not None and record.status is TaskStatus.WORKING


def test_a_dropped_retry_fails_the_task_even_before_the_retry_signal_said_so(
    service: TaskService, clock: Clock
) -> None:
    """Celery sends a retry's message before `task_retry`: the row still shows attempt 0 started."""
    _, created = service.create(owner=None, tool="t", arguments={})
    born = created.created_at
    _begin(service, clock, created.key, Run(1, 0, born))
    assert not service.dropped(created.key, Run(1, 0, born), tool="t")  # attempt 0's own copy: it started
    assert service.dropped(created.key, Run(1, 1, born), tool="t")  # attempt 1's message, dropped
    record = service.record(created.key)
    assert record is not None and record.status is TaskStatus.FAILED
