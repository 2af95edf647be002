"""The metrics observer: real service transitions on a real store, counted and timed from (before, after) alone."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from celery_mcp_tasks.config import Settings
from celery_mcp_tasks.model import Run, TaskRecord, TaskStatus, TerminalTask, failure
from celery_mcp_tasks.observe import Observers
from celery_mcp_tasks.ops.logs import lifecycle_events
from celery_mcp_tasks.ops.metrics import OTHER, Counts, Families
from celery_mcp_tasks.service import TaskService
from celery_mcp_tasks.store.sql import SqlStore
from celery_mcp_tasks.store.sweeps import count_by_status
from celery_mcp_tasks.worker.janitor import EXPIRED_UNFINISHED, METRIC, sweep
from tests.builders import Clock, record

STALE_MS = 3_000


class Broker:
    """The dispatcher: records sends, or refuses them like a broker that is down."""

    def __init__(self) -> None:
        self.down = False
        self.sent: list[TaskRecord] = []

    def send(self, sent: TaskRecord) -> None:
        if self.down:
            raise ConnectionError("broker down")
        self.sent.append(sent)

    def revoke(self, record: TaskRecord) -> None:
        pass


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


@pytest.fixture
def metrics(registry: CollectorRegistry) -> Families:
    return Families(registry)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def broker() -> Broker:
    return Broker()


class Changes:
    """An observer that keeps every committed (before, after), e.g. for the log's view of the same change."""

    def __init__(self) -> None:
        self.seen: list[tuple[TaskRecord | None, TaskRecord]] = []

    def task_changed(self, before: TaskRecord | None, after: TaskRecord) -> None:
        self.seen.append((before, after))


@pytest.fixture
def changes() -> Changes:
    return Changes()


@pytest.fixture
def service(store: SqlStore, clock: Clock, broker: Broker, metrics: Families, changes: Changes) -> TaskService:
    observers = Observers([Counts({"report", "ask"}, lambda: metrics), changes])
    return TaskService(store, dispatcher=broker, clock=clock, observer=observers, default_ttl_ms=60_000)


def value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    return registry.get_sample_value(name, labels) or 0.0


def histogram(registry: CollectorRegistry, name: str, **labels: str) -> tuple[float, float]:
    """(count, sum) of a histogram's series."""
    return value(registry, f"{name}_count", **labels), value(registry, f"{name}_sum", **labels)


def test_a_run_is_counted_and_timed_from_creation_to_completion(
    service: TaskService, clock: Clock, registry: CollectorRegistry
) -> None:
    _, created = service.create(owner=None, tool="report", arguments={"secret": "x"})
    clock.now += 250  # in the queue
    service.begin(created.key, Run(1), stale_before_ms=clock.now - STALE_MS)
    clock.now += 2_000  # running
    service.complete(created.key, {"content": []}, run=Run(1))

    assert value(registry, "mcp_tasks_created_total", tool="report") == 1
    assert value(registry, "mcp_tasks_finished_total", tool="report", status="completed") == 1
    assert histogram(registry, "mcp_tasks_queue_wait_seconds", tool="report") == pytest.approx((1, 0.25))
    assert histogram(registry, "mcp_tasks_run_seconds", tool="report") == pytest.approx((1, 2.0))
    assert histogram(registry, "mcp_tasks_duration_seconds", tool="report", status="completed") == pytest.approx(
        (1, 2.25)
    )
    assert value(registry, "mcp_tasks_enqueue_failures_total", tool="report") == 0


def test_a_question_ends_the_run_and_the_answer_times_the_wait_and_queues_the_next_run(
    service: TaskService, clock: Clock, registry: CollectorRegistry
) -> None:
    task_id, created = service.create(owner="alice", tool="ask", arguments={})
    service.begin(created.key, Run(1), stale_before_ms=clock.now - STALE_MS)
    clock.now += 500
    service.require_input(created.key, {"confirm": {"method": "elicitation/create"}}, run=Run(1))
    clock.now += 30_000  # the user thinks
    service.answer(task_id, "alice", {"confirm": {"action": "accept", "content": {}}})
    clock.now += 100
    service.begin(created.key, Run(2), stale_before_ms=clock.now - STALE_MS)
    clock.now += 400
    service.complete(created.key, {"content": []}, run=Run(2))

    assert histogram(registry, "mcp_tasks_input_wait_seconds", tool="ask") == pytest.approx((1, 30.0))
    assert histogram(registry, "mcp_tasks_run_seconds", tool="ask") == pytest.approx(
        (2, 0.9)
    )  # the run that asked, the one after
    assert histogram(registry, "mcp_tasks_queue_wait_seconds", tool="ask") == pytest.approx(
        (2, 0.1)
    )  # the first started at once
    assert value(registry, "mcp_tasks_finished_total", tool="ask", status="completed") == 1


def test_a_parked_question_does_not_end_the_run(
    service: TaskService, clock: Clock, registry: CollectorRegistry
) -> None:
    task_id, created = service.create(owner=None, tool="ask", arguments={})
    service.begin(created.key, Run(1), stale_before_ms=clock.now - STALE_MS)
    service.require_input(created.key, {"q": {}}, park=True, run=Run(1))
    clock.now += 5_000
    service.answer(task_id, None, {"q": {"action": "accept"}})
    service.complete(created.key, {"content": []}, run=Run(1))

    assert histogram(registry, "mcp_tasks_run_seconds", tool="ask") == pytest.approx(
        (1, 5.0)
    )  # one run, waiting included
    assert histogram(registry, "mcp_tasks_input_wait_seconds", tool="ask") == pytest.approx((1, 5.0))


def test_a_job_that_could_not_be_sent_is_an_enqueue_failure_and_a_failed_task(
    service: TaskService, broker: Broker, registry: CollectorRegistry
) -> None:
    broker.down = True
    _, sent = service.create(owner=None, tool="report", arguments={})

    assert sent.status is TaskStatus.FAILED
    assert value(registry, "mcp_tasks_created_total", tool="report") == 1
    assert value(registry, "mcp_tasks_enqueue_failures_total", tool="report") == 1
    assert value(registry, "mcp_tasks_finished_total", tool="report", status="failed") == 1
    assert histogram(registry, "mcp_tasks_queue_wait_seconds", tool="report")[0] == 0  # it never started


def test_a_failure_and_a_cancel_count_once_each_and_a_late_write_counts_nothing(
    service: TaskService, clock: Clock, registry: CollectorRegistry
) -> None:
    _, failing = service.create(owner=None, tool="report", arguments={})
    service.begin(failing.key, Run(1), stale_before_ms=clock.now - STALE_MS)
    service.fail(failing.key, failure("boom"), run=Run(1))
    cancelled_id, _ = service.create(owner=None, tool="report", arguments={})
    service.cancel(cancelled_id, None)
    service.cancel(cancelled_id, None)  # already final: no change, no count

    assert value(registry, "mcp_tasks_finished_total", tool="report", status="failed") == 1
    assert value(registry, "mcp_tasks_finished_total", tool="report", status="cancelled") == 1
    assert value(registry, "mcp_tasks_enqueue_failures_total", tool="report") == 0
    assert histogram(registry, "mcp_tasks_run_seconds", tool="report")[0] == 1  # the cancelled one never ran


def test_a_retry_s_countdown_is_not_queue_wait_in_the_metric_nor_the_log(
    service: TaskService, clock: Clock, registry: CollectorRegistry, changes: Changes
) -> None:
    _, created = service.create(owner=None, tool="report", arguments={}, ttl_ms=3_600_000)  # outlives the countdown
    clock.now += 100
    service.begin(created.key, Run(1), stale_before_ms=clock.now - STALE_MS)
    clock.now += 1_000
    service.retrying(created.key, Run(1, attempt=1), start_by_ms=clock.now + 60_000)  # countdown=60
    clock.now += 60_000 + 300  # the countdown, then 0.3 s in the queue
    service.begin(created.key, Run(1, attempt=1), stale_before_ms=clock.now - STALE_MS)

    assert histogram(registry, "mcp_tasks_queue_wait_seconds", tool="report") == pytest.approx((2, 0.4))
    waits = [
        fields["queue_wait_ms"]
        for before, after in changes.seen
        for event, _, fields in lifecycle_events(before, after)
        if event == "task.started"
    ]
    assert waits == [100, 300]  # the JSON log says what the metric says


def test_a_cancel_ends_the_task_not_the_run_and_the_job_s_late_end_counts_nothing(
    service: TaskService, clock: Clock, registry: CollectorRegistry
) -> None:
    task_id, created = service.create(owner=None, tool="report", arguments={})
    service.begin(created.key, Run(1), stale_before_ms=clock.now - STALE_MS)
    clock.now += 5_000
    service.cancel(task_id, None)  # the web process: the job is still running
    clock.now += 20_000
    with pytest.raises(TerminalTask):
        service.complete(created.key, {"content": []}, run=Run(1))  # the job's real end: refused, unseen

    assert value(registry, "mcp_tasks_finished_total", tool="report", status="cancelled") == 1
    assert histogram(registry, "mcp_tasks_duration_seconds", tool="report", status="cancelled") == pytest.approx(
        (1, 5.0)
    )
    assert histogram(registry, "mcp_tasks_run_seconds", tool="report")[0] == 0  # time-to-cancel is not a run


def test_created_equals_finished_plus_in_flight_when_the_ttl_removes_unfinished_tasks(
    service: TaskService, clock: Clock, registry: CollectorRegistry, metrics: Families, store: SqlStore
) -> None:
    keys = [service.create(owner=None, tool="report", arguments={})[1].key for _ in range(5)]
    asking = service.create(owner=None, tool="ask", arguments={})[1].key
    service.create(owner=None, tool="report", arguments={}, ttl_ms=None)  # in flight for good
    for key in keys[:3]:
        service.begin(key, Run(1), stale_before_ms=clock.now - STALE_MS)
        service.complete(key, {"content": []}, run=Run(1))
    service.begin(asking, Run(1), stale_before_ms=clock.now - STALE_MS)
    service.require_input(asking, {"q": {}}, run=Run(1))

    # Their TTL (60 s from a clock at 100 s) ran out long ago: the janitor removes all six.
    hook = Counts({"report", "ask"}, lambda: metrics)
    assert sweep(service, Settings(), metric=hook.swept).removed == 6

    def total(name: str) -> float:
        return sum(s.value for f in registry.collect() for s in f.samples if s.name == name)

    statuses = count_by_status(store.engine)
    in_flight = statuses.get("working", 0) + statuses.get("input_required", 0)
    assert (total("mcp_tasks_created_total"), total("mcp_tasks_finished_total"), in_flight) == (7, 6, 1)
    assert value(registry, "mcp_tasks_finished_total", tool="report", status="expired") == 2
    assert value(registry, "mcp_tasks_finished_total", tool="ask", status="expired") == 1
    assert value(registry, "mcp_tasks_janitor_sweeps_total") == 1  # one sweep, though the hook heard twice


def test_a_tool_the_app_does_not_register_is_labelled_other(metrics: Families, registry: CollectorRegistry) -> None:
    observer = Counts({"report"}, lambda: metrics)
    observer.task_changed(None, record(tool="k" * 43))

    assert value(registry, "mcp_tasks_created_total", tool=OTHER) == 1
    assert value(registry, "mcp_tasks_created_total", tool="k" * 43) == 0


def test_a_clock_behind_another_process_never_makes_a_negative_duration(
    metrics: Families, registry: CollectorRegistry
) -> None:
    observer = Counts({"t"}, lambda: metrics)
    queued = record(updated_at=5_000)
    started = record(updated_at=5_000, started_at=4_000, version=2)  # the worker's clock is a second behind
    observer.task_changed(queued, started)

    assert histogram(registry, "mcp_tasks_queue_wait_seconds", tool="t") == (1, 0.0)


def test_tools_declared_after_install_are_labelled_by_name(metrics: Families, registry: CollectorRegistry) -> None:
    tools: dict[str, object] = {}
    observer = Counts(tools.keys(), lambda: metrics)
    tools["late"] = object()
    observer.task_changed(None, record(tool="late"))

    assert value(registry, "mcp_tasks_created_total", tool="late") == 1


def test_expired_unfinished_tasks_are_finished_as_expired_with_a_bounded_tool(
    metrics: Families, registry: CollectorRegistry
) -> None:
    hook = Counts({"report"}, lambda: metrics).swept
    hook(EXPIRED_UNFINISHED, {"report": 2, "k" * 43: 1})
    hook("celery_mcp_tasks.janitor.some_future_event", {"report": 5})  # an unknown name counts nothing

    assert value(registry, "mcp_tasks_finished_total", tool="report", status="expired") == 2
    assert value(registry, "mcp_tasks_finished_total", tool=OTHER, status="expired") == 1
    assert value(registry, "mcp_tasks_janitor_sweeps_total") == 0
    assert METRIC != EXPIRED_UNFINISHED


def test_the_janitor_hook_counts_sweeps_and_known_actions_only(metrics: Families, registry: CollectorRegistry) -> None:
    hook = Counts(metrics=lambda: metrics).swept
    hook("celery_mcp_tasks.janitor.sweep", {"removed": 4, "resent": 1, "failed": 2, "expired_inputs": 3, "new": 9})
    hook("celery_mcp_tasks.janitor.sweep", {"removed": 0, "resent": 0, "failed": 0})

    assert value(registry, "mcp_tasks_janitor_sweeps_total") == 2
    assert value(registry, "mcp_tasks_janitor_tasks_total", action="evicted") == 4
    assert value(registry, "mcp_tasks_janitor_tasks_total", action="resent") == 1
    assert value(registry, "mcp_tasks_janitor_tasks_total", action="failed_lost") == 2
    assert value(registry, "mcp_tasks_janitor_tasks_total", action="expired_input") == 3
    assert {s.labels["action"] for s in registry.collect() for s in s.samples if "action" in s.labels} == {
        "evicted",
        "resent",
        "failed_lost",
        "expired_input",
    }


def test_push_metrics_follow_streams_and_time_notifications(metrics: Families, registry: CollectorRegistry) -> None:
    push = Counts(metrics=lambda: metrics)
    push.stream_opened()
    push.stream_opened()
    push.stream_closed()
    push.stream_notified(0.003)

    assert value(registry, "mcp_tasks_listen_streams") == 1
    assert histogram(registry, "mcp_tasks_push_notify_latency_seconds") == pytest.approx((1, 0.003))
