"""The janitor's sweep on SQLite and PostgreSQL: eviction in batches, the stale reaper, reporting."""

from __future__ import annotations

import logging
import threading
from dataclasses import replace
from typing import Any

import pytest

from celery_mcp_tasks.config import Settings
from celery_mcp_tasks.model import TaskRecord, TaskStatus, now_ms
from celery_mcp_tasks.service import TaskService
from celery_mcp_tasks.store.base import ANY
from celery_mcp_tasks.store.sql import SqlStore
from celery_mcp_tasks.worker.janitor import EXPIRED_UNFINISHED, METRIC, SweepReport, sweep

SETTINGS = Settings(stale_timeout_s=60, max_sends=3, retention_ms=3_600_000)
MINUTE = 60_000


class Sends:
    """A dispatcher that records what the reaper sent (and can fail like a broker that is down)."""

    def __init__(self, error: Exception | None = None) -> None:
        self.sent: list[TaskRecord] = []
        self.error = error
        self.lock = threading.Lock()

    def send(self, record: TaskRecord) -> None:
        with self.lock:
            self.sent.append(record)
        if self.error is not None:
            raise self.error

    def revoke(self, record: TaskRecord) -> None:
        pass


def add(store: SqlStore, key: str, *, age_ms: int = 0, **changes: Any) -> TaskRecord:
    at = now_ms() - age_ms
    values: dict[str, Any] = dict(
        key=key,
        owner=None,
        tool="t",
        status=TaskStatus.WORKING,
        created_at=at,
        updated_at=at,
        ttl_ms=3_600_000,
        dispatches=1,
        heartbeat_at=at,
    )
    values.update(changes)
    record = TaskRecord(**values)
    store.create(record, max_rows=None)
    return record


def service(store: SqlStore, sends: Sends | None = None) -> TaskService:
    return TaskService(store, dispatcher=sends or Sends())


# -- eviction --------------------------------------------------------------------------------


def test_expired_tasks_are_evicted_in_batches_by_ttl_from_creation(store: SqlStore) -> None:
    for n in range(7):
        add(store, f"old{n}", age_ms=2 * MINUTE, ttl_ms=MINUTE, status=TaskStatus.COMPLETED)
    add(store, "busy-but-expired", age_ms=2 * MINUTE, ttl_ms=MINUTE)  # TTL counts from createdAt, whatever the status
    add(store, "young", age_ms=2 * MINUTE, ttl_ms=5 * MINUTE)
    report = sweep(service(store), SETTINGS, batch_size=3)
    assert report.removed == 8
    assert store.get("young") is not None and store.get("old0") is None and store.get("busy-but-expired") is None


def test_unlimited_tasks_go_only_once_final_and_older_than_the_retention(store: SqlStore) -> None:
    hour = 3_600_000
    add(store, "final-old", age_ms=2 * hour, ttl_ms=None, status=TaskStatus.FAILED)
    add(store, "final-recent", age_ms=10 * MINUTE, ttl_ms=None, status=TaskStatus.CANCELLED)
    add(store, "working-old", age_ms=2 * hour, ttl_ms=None, heartbeat_at=now_ms())
    add(store, "waiting-old", age_ms=2 * hour, ttl_ms=None, status=TaskStatus.INPUT_REQUIRED)
    assert sweep(service(store), SETTINGS).removed == 1
    assert store.get("final-old") is None
    assert all(store.get(k) is not None for k in ("final-recent", "working-old", "waiting-old"))


# -- the stale reaper ------------------------------------------------------------------------


def lose(store: SqlStore, key: str, *, started: bool = True) -> None:
    """Make the task's last sign of life two minutes old (as if its worker died then, having started the job)."""
    at = now_ms() - 2 * MINUTE
    store.update(
        key,
        ANY,
        lambda r: replace(r, heartbeat_at=at, started_at=at if started else None, version=r.version + 1),
    )


def test_a_stale_working_task_is_sent_again_then_failed_once_its_sends_are_spent(
    store: SqlStore, caplog: pytest.LogCaptureFixture
) -> None:
    sends = Sends()
    svc = service(store, sends)
    add(store, "lost", heartbeat_at=now_ms() - 2 * MINUTE, started_at=now_ms() - 3 * MINUTE)

    with caplog.at_level(logging.WARNING, logger="celery_mcp_tasks.janitor"):
        assert sweep(svc, SETTINGS) == SweepReport(resent=1)
    assert [r.getMessage() for r in caplog.records] == ["janitor sweep: removed=0 resent=1 failed=0 expired_inputs=0"]
    record = store.get("lost")
    assert record is not None and (record.status, record.dispatches, record.resends) == (TaskStatus.WORKING, 2, 1)
    assert record.status_message == "The worker was lost; running the job again (send 2 of 3)"
    assert [r.dispatches for r in sends.sent] == [2]
    assert sweep(svc, SETTINGS) == SweepReport()  # the re-sent job has a fresh stale window

    lose(store, "lost")
    assert sweep(svc, SETTINGS) == SweepReport(resent=1)
    lose(store, "lost")
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="celery_mcp_tasks.janitor"):
        assert sweep(svc, SETTINGS) == SweepReport(failed=1)
    assert [r.getMessage() for r in caplog.records] == ["janitor sweep: removed=0 resent=0 failed=1 expired_inputs=0"]
    final = store.get("lost")
    assert final is not None and final.status is TaskStatus.FAILED and len(sends.sent) == 2
    assert final.error == {"message": "The job was lost: no worker reported for 60s (sent 3 times)"}


def test_a_job_no_worker_ever_started_is_not_called_lost_and_its_failure_says_to_check_the_queue(
    store: SqlStore,
) -> None:
    """A queue no worker consumes: no worker took the message (one holding it beats), so "the worker was lost"
    sent the operator looking for a crash."""
    svc = service(store, Sends())
    add(store, "unstarted", heartbeat_at=now_ms() - 2 * MINUTE)
    assert sweep(svc, SETTINGS) == SweepReport(resent=1)
    record = store.get("unstarted")
    assert record is not None and record.status_message == "No worker started the job; sending it again (send 2 of 3)"
    for _ in range(2):
        lose(store, "unstarted", started=False)
        sweep(svc, SETTINGS)
    final = store.get("unstarted")
    assert final is not None and final.status is TaskStatus.FAILED
    assert final.error == {
        "message": "The job was not started: no worker took it from its queue, or reached the task store, within "
        "60s (sent 3 times); check that a worker consumes the tool's queue"
    }


def test_a_tool_can_bound_its_own_sends(store: SqlStore) -> None:
    add(store, "lost", heartbeat_at=now_ms() - 2 * MINUTE)
    assert sweep(service(store), SETTINGS, max_sends=lambda tool: 1) == SweepReport(failed=1)


def test_live_waiting_or_promised_tasks_are_left_alone(store: SqlStore) -> None:
    now = now_ms()
    add(store, "beating", heartbeat_at=now - 1_000)
    add(store, "waiting", status=TaskStatus.INPUT_REQUIRED, heartbeat_at=now - 10 * MINUTE)
    add(store, "retry-due-later", heartbeat_at=now + 5 * MINUTE)  # a long retry countdown, or a hand-off
    assert sweep(service(store), SETTINGS) == SweepReport()


def test_a_resend_that_cannot_reach_the_broker_fails_the_task_and_is_counted_so(store: SqlStore) -> None:
    add(store, "lost", heartbeat_at=now_ms() - 2 * MINUTE)
    assert sweep(service(store, Sends(ConnectionError("broker down"))), SETTINGS) == SweepReport(failed=1)
    record = store.get("lost")
    assert record is not None and record.status is TaskStatus.FAILED
    assert record.error == {"message": "Could not enqueue the job", "data": "ConnectionError"}


def test_a_sweep_is_idempotent(store: SqlStore) -> None:
    add(store, "expired", age_ms=2 * MINUTE, ttl_ms=MINUTE)
    add(store, "lost", heartbeat_at=now_ms() - 2 * MINUTE)
    svc = service(store)
    assert sweep(svc, SETTINGS) == SweepReport(removed=1, resent=1)
    assert sweep(svc, SETTINGS) == SweepReport()


def test_two_janitors_at_once_act_on_each_task_once(store_url: str) -> None:
    """Two beats by mistake: every stale task is sent again exactly once, every expired row removed once."""
    stores = [SqlStore.from_url(store_url) for _ in range(2)]
    try:
        for n in range(40):
            add(stores[0], f"lost{n}", heartbeat_at=now_ms() - 2 * MINUTE)
            add(stores[0], f"expired{n}", age_ms=2 * MINUTE, ttl_ms=MINUTE)
        sends = Sends()
        reports: list[SweepReport] = []
        barrier = threading.Barrier(2)

        def janitor(store: SqlStore) -> None:
            barrier.wait()
            reports.append(sweep(service(store, sends), SETTINGS, batch_size=7))

        threads = [threading.Thread(target=janitor, args=(s,)) for s in stores]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert sum(r.resent for r in reports) == 40 and len(sends.sent) == 40
        assert len({r.key for r in sends.sent}) == 40
        assert sum(r.removed for r in reports) == 40
    finally:
        for s in stores:
            s.dispose()


# -- reporting --------------------------------------------------------------------------------


def test_counts_go_to_the_log_and_the_metric_hook_never_ids(store: SqlStore, caplog: pytest.LogCaptureFixture) -> None:
    add(store, "key-past-its-ttl", age_ms=2 * MINUTE, ttl_ms=MINUTE)
    seen: list[tuple[str, dict[str, int]]] = []
    with caplog.at_level(logging.INFO, logger="celery_mcp_tasks.janitor"):
        sweep(service(store), SETTINGS, metric=lambda name, counts: seen.append((name, counts)))
    assert seen == [
        (METRIC, {"removed": 1, "resent": 0, "failed": 0, "expired_inputs": 0}),
        (EXPIRED_UNFINISHED, {"t": 1}),  # it was still working: nothing else will ever count its end
    ]
    (line,) = [r for r in caplog.records if r.name == "celery_mcp_tasks.janitor"]
    said = "janitor sweep: removed=1 resent=0 failed=0 expired_inputs=0 (of the removed, 1 expired unfinished)"
    assert line.getMessage() == said  # the metric says it too, but only when metrics are on
    assert line.event == METRIC and line.removed == 1  # type: ignore[attr-defined]
    assert "key-past-its-ttl" not in caplog.text
    assert line.levelno == logging.INFO  # an eviction is routine; a lost job's re-send is a warning (below)


def test_the_hook_hears_the_expired_unfinished_tasks_by_tool_and_nothing_more_for_final_ones(
    store: SqlStore,
) -> None:
    for n in range(3):
        add(store, f"working{n}", age_ms=2 * MINUTE, ttl_ms=MINUTE, tool="report")
    add(store, "asking", age_ms=2 * MINUTE, ttl_ms=MINUTE, tool="ask", status=TaskStatus.INPUT_REQUIRED)
    add(store, "done", age_ms=2 * MINUTE, ttl_ms=MINUTE, tool="ask", status=TaskStatus.COMPLETED)
    seen: list[tuple[str, dict[str, int]]] = []

    def hook(name: str, counts: dict[str, int]) -> None:
        seen.append((name, counts))

    assert sweep(service(store), SETTINGS, metric=hook, batch_size=2).removed == 5
    add(store, "done-later", age_ms=2 * MINUTE, ttl_ms=MINUTE, status=TaskStatus.FAILED)
    assert sweep(service(store), SETTINGS, metric=hook).removed == 1

    assert [name for name, _ in seen] == [METRIC, EXPIRED_UNFINISHED, METRIC]  # the sweep's dict, unchanged
    assert seen[1][1] == {"report": 3, "ask": 1}
    assert set(seen[0][1]) == set(seen[2][1]) == {"removed", "resent", "failed", "expired_inputs"}


def test_an_idle_sweep_is_quiet_and_a_broken_metric_hook_is_contained(
    store: SqlStore, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(name: str, counts: dict[str, int]) -> None:
        raise RuntimeError("statsd is down")

    with caplog.at_level(logging.INFO, logger="celery_mcp_tasks.janitor"):
        assert sweep(service(store), SETTINGS, metric=broken) == SweepReport()
    assert [r.levelname for r in caplog.records] == ["ERROR"]  # only the contained hook failure


def test_a_store_failing_mid_sweep_still_reports_what_committed_in_one_line(
    store: SqlStore, caplog: pytest.LogCaptureFixture
) -> None:
    """Eviction commits batch by batch: a failure at the third batch (the database gone, injected where the
    driver runs the statement) leaves the first two deleted, and they are logged and told to the metric hook
    in one WARNING line saying the sweep stopped, not lost with the exception. The next sweep goes on."""
    from tests.support import database_gone_at

    for n in range(6):
        add(store, f"old{n}", age_ms=2 * MINUTE, ttl_ms=MINUTE, status=TaskStatus.COMPLETED)
    seen: list[tuple[str, dict[str, int]]] = []
    with database_gone_at(store.engine, "DELETE", 3), caplog.at_level(logging.INFO, logger="celery_mcp_tasks.janitor"):
        report = sweep(service(store), SETTINGS, batch_size=2, metric=lambda n, c: seen.append((n, c)))
    assert report.removed == 4 and sum(store.get(f"old{n}") is None for n in range(6)) == 4
    (line,) = [r for r in caplog.records if r.name == "celery_mcp_tasks.janitor"]
    assert line.levelname == "WARNING"
    assert line.getMessage() == (
        "janitor sweep stopped, the task store failed (evict: Exception), after removed=4 resent=0 failed=0 "
        "expired_inputs=0; the next sweep goes on"
    )
    assert seen == [(METRIC, {"removed": 4, "resent": 0, "failed": 0, "expired_inputs": 0})]
    assert service(store).ledger().last() is None  # an unfinished sweep is not recorded as one
    assert sweep(service(store), SETTINGS, batch_size=2).removed == 2


def test_the_janitor_task_whose_claim_the_store_cannot_take_logs_one_line_not_a_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from celery import Celery

    from celery_mcp_tasks.worker.janitor import JANITOR_TASK, install_janitor
    from tests.support import free_port

    down = SqlStore.from_url(f"postgresql://postgres@127.0.0.1:{free_port()}/tasks")  # nothing listens there
    app = Celery("janitor-claim", set_as_current=False)
    swept: list[bool] = []
    install_janitor(app, lambda: swept.append(True), None, ledger=down.ledger)
    try:
        with caplog.at_level(logging.INFO, logger="celery_mcp_tasks.janitor"):
            app.tasks[JANITOR_TASK].apply(kwargs={"claim_interval_s": 60}).get()
    finally:
        down.dispose()
    assert swept == []
    (line,) = [r for r in caplog.records if r.name == "celery_mcp_tasks.janitor"]
    assert line.getMessage() == "janitor: the task store failed (claim: OperationalError); trying again next interval"
    assert line.exc_info is None
