"""In-process checks of the job, the bridge and the context: which run may write, and when a body runs.

Jobs run eagerly (`job.apply(headers=...)`), so Celery's signals fire in this
process and the bridge writes to a SQLite store in a temporary directory.
"""

from __future__ import annotations

import json
import logging
import pickle
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from celery import Celery
from celery.app.task import Context
from celery.exceptions import Retry, WorkerLostError
from mcp_types import CallToolResult, TextContent

from celery_mcp_tasks import McpTasks, TaskContext, elicit
from celery_mcp_tasks.app import internals
from celery_mcp_tasks.config import Settings
from celery_mcp_tasks.migrate import upgrade
from celery_mcp_tasks.model import Run, Superseded, TaskRecord, TaskStatus, TerminalTask, now_ms, task_key
from celery_mcp_tasks.service import TaskService
from celery_mcp_tasks.store.base import StoreUnavailable
from celery_mcp_tasks.store.sql import SqlStore
from celery_mcp_tasks.worker import bridge, outages
from celery_mcp_tasks.worker.context import InputTimeout
from celery_mcp_tasks.worker.dispatch import message_headers
from celery_mcp_tasks.worker.job import (
    DISPATCH_HEADER,
    KEY_HEADER,
    LAST_RECORD,
    OUTCOME,
    RECORD_HEADER,
    RUN_END,
    failure_text,
)
from tests.builders import SendOnly


def worker_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    """What the package's worker side said, in order."""
    return [r.getMessage() for r in caplog.records if r.name.startswith("celery_mcp_tasks.worker")]


@pytest.fixture
def tasks(tmp_path: Path) -> McpTasks:
    settings = Settings(data_dir=tmp_path, janitor_interval_s=None)
    upgrade(settings.store_url)
    return McpTasks("guards", celery=Celery("guards"), settings=settings)


def headers(task_id: str, dispatch: int = 1) -> dict[str, Any]:
    return {KEY_HEADER: task_key(task_id), DISPATCH_HEADER: dispatch}


def status(tasks: McpTasks, task_id: str) -> TaskRecord:
    record = internals(tasks).service().record(task_key(task_id))
    assert record is not None
    return record


def test_a_task_cancelled_before_its_job_starts_never_runs_the_body(tasks: McpTasks) -> None:
    calls: list[int] = []

    @tasks.mcp_task
    def cancelled_body(n: int) -> str:
        calls.append(n)
        return "ran"

    task_id, _ = internals(tasks).service().create(owner=None, tool="cancelled_body", arguments={"n": 1})
    internals(tasks).service().cancel(task_id, None)
    cancelled_body.apply(kwargs={"n": 1}, headers=headers(task_id))
    assert calls == [] and status(tasks, task_id).status is TaskStatus.CANCELLED


def test_a_message_that_waited_past_its_tasks_ttl_never_runs_the_body(
    tasks: McpTasks, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A queue nobody consumed for longer than the TTL: the client was told the task expired; a worker that
    starts then must not do the work (the row waits for the janitor's next sweep)."""
    calls: list[int] = []

    @tasks.mcp_task
    def late_work() -> str:
        calls.append(1)
        return "done"

    task_id, _ = internals(tasks).service().create(owner=None, tool="late_work", arguments={})
    expires = status(tasks, task_id).expires_at
    assert expires is not None
    later = TaskService(internals(tasks).service().store, clock=lambda: expires + 1)
    monkeypatch.setattr(tasks, "_service", lambda: later)
    with caplog.at_level(logging.INFO, logger="celery_mcp_tasks.worker"):
        late_work.apply(headers=headers(task_id))
    assert calls == [] and status(tasks, task_id).started_at is None
    assert "job for tool 'late_work' skipped: its task expired (its client was told so" in caplog.text


def test_a_message_for_a_task_this_store_does_not_hold_is_skipped_naming_a_shared_queue(
    tasks: McpTasks, caplog: pytest.LogCaptureFixture
) -> None:
    """A job for a deleted task, or another deployment's job taken from a queue both consume: the line says
    which setting keeps two deployments apart."""
    calls: list[int] = []

    @tasks.mcp_task
    def elsewhere() -> str:
        calls.append(1)
        return "done"

    task_id, _ = internals(tasks).service().create(owner=None, tool="elsewhere", arguments={})
    internals(tasks).service().cancel(task_id, None)
    assert internals(tasks).service().store.delete(task_key(task_id))
    with caplog.at_level(logging.INFO, logger="celery_mcp_tasks.worker"):
        elsewhere.apply(headers=headers(task_id))
    assert calls == []
    (line,) = [r for r in caplog.records if r.getMessage().startswith("job for tool 'elsewhere' skipped")]
    assert line.levelno == logging.WARNING  # seen at a worker's default level: it may be every job of a deployment
    assert "skipped: its task no longer exists (deleted before its job ran;" in caplog.text
    assert "(MCP_TASKS_DATABASE_URL)" in caplog.text and "give each deployment its own MCP_TASKS_QUEUE" in caplog.text
    assert task_id not in caplog.text


def test_a_message_of_an_older_dispatch_is_skipped_and_the_current_one_runs(tasks: McpTasks) -> None:
    calls: list[str] = []

    @tasks.mcp_task
    def superseded_body() -> str:
        calls.append("ran")
        return "ran"

    service = internals(tasks).service()
    task_id, record = service.create(owner=None, tool="superseded_body", arguments={})
    service.store.update(record.key, None, lambda r: r.dispatched(0, "sent again", resend=True))  # dispatch 2
    superseded_body.apply(headers=headers(task_id, dispatch=1))
    assert calls == [] and status(tasks, task_id).status is TaskStatus.WORKING
    superseded_body.apply(headers=headers(task_id, dispatch=2))
    assert calls == ["ran"] and status(tasks, task_id).status is TaskStatus.COMPLETED


def test_a_retry_signal_that_lands_after_the_next_attempt_changes_nothing(tasks: McpTasks) -> None:
    """Eager retries run the next attempt *inside* `self.retry()`: its task_retry fires after the retry finished."""

    @tasks.mcp_task(bind=True, max_retries=3)
    def flaky(self: Any, ctx: TaskContext) -> str:
        if self.request.retries < 2:
            raise self.retry(countdown=0)
        return f"attempt {ctx.attempt + 1}"

    task_id, _ = internals(tasks).service().create(owner=None, tool="flaky", arguments={})
    flaky.apply(headers=headers(task_id))
    done = status(tasks, task_id)
    assert done.status is TaskStatus.COMPLETED and done.result is not None
    assert done.result["content"][0]["text"] == "attempt 3" and done.attempt == 2

    late = Context(retries=0, headers=headers(task_id))
    bridge.on_retry(sender=flaky, request=late, reason=None)
    assert status(tasks, task_id) == done


def test_a_revoke_in_the_main_process_writes_only_to_a_task_not_final_yet(tasks: McpTasks) -> None:
    """The worker's main process hears revokes with no record of the run: it reads the task, unlocked, and a
    final one (our own cancel revoked it) gets no write and no write lock; another gets one conditional UPDATE."""

    @tasks.mcp_task
    def revoked_body() -> str:
        return "never"

    service = internals(tasks).service()
    statements: list[str] = []
    sa.event.listen(service.store.engine, "before_cursor_execute", lambda *a: statements.append(a[2].split()[0]))
    cancelled, _ = service.create(owner=None, tool="revoked_body", arguments={})
    service.cancel(cancelled, None)
    working, _ = service.create(owner=None, tool="revoked_body", arguments={})
    statements.clear()
    bridge.on_revoked(sender=revoked_body, request=Context(retries=0, headers=headers(cancelled)))
    assert statements == ["BEGIN", "SELECT"] and status(tasks, cancelled).status is TaskStatus.CANCELLED
    statements.clear()
    bridge.on_revoked(sender=revoked_body, request=Context(retries=0, headers=headers(working)))
    assert statements == ["BEGIN", "SELECT", "UPDATE"], (
        statements
    )  # the write lock (BEGIN IMMEDIATE) is not a cursor statement
    failed = status(tasks, working)
    assert (failed.status, failed.status_message) == (TaskStatus.FAILED, "The job was revoked in Celery")


def test_a_countdown_retry_is_not_reaped_early_but_a_lost_process_retry_is_not_waited_for(tasks: McpTasks) -> None:
    @tasks.mcp_task
    def retried_body() -> str:
        return "ran"

    for exc, countdown, deferred in ((RuntimeError("busy"), 600, True), (WorkerLostError("signal 9"), 180, False)):
        task_id, _ = internals(tasks).service().create(owner=None, tool="retried_body", arguments={})
        before = now_ms()
        bridge.on_retry(
            sender=retried_body,
            request=Context(retries=0, headers=headers(task_id)),
            reason=Retry(exc=exc, when=countdown),
        )
        record = status(tasks, task_id)
        assert record.status_message == f"Retrying (attempt 2) after {type(exc).__name__}"
        assert record.heartbeat_at is not None
        assert (record.heartbeat_at >= before + countdown * 1000) is deferred


def test_a_retry_names_the_class_of_an_exception_celery_could_not_pickle(tasks: McpTasks) -> None:
    """`Retry` keeps a picklable stand-in for what the job raised; the task says the job's own class."""

    class NeedsAnOption(Exception):
        def __init__(self, message: str, *, option: int) -> None:
            super().__init__(message)

    @tasks.mcp_task
    def picky_body() -> str:
        return "ran"

    task_id, _ = internals(tasks).service().create(owner=None, tool="picky_body", arguments={})
    bridge.on_retry(
        sender=picky_body,
        request=Context(retries=0, headers=headers(task_id)),
        reason=Retry(exc=NeedsAnOption("no", option=1), when=1),
    )
    assert status(tasks, task_id).status_message == "Retrying (attempt 2) after NeedsAnOption"


def test_a_lost_pool_process_fails_the_task_without_the_pools_job_counter() -> None:
    """billiard's text ends with its pool's own counter ("Job: 1."), which means nothing to a client."""
    lost = WorkerLostError("Worker exited prematurely: signal 9 (SIGKILL) Job: 12.")  # billiard's text
    assert failure_text(lost) == "WorkerLostError: Worker exited prematurely: signal 9 (SIGKILL)"
    assert failure_text(WorkerLostError("Worker exited prematurely: exitcode 1.")) == (  # Celery's own
        "WorkerLostError: Worker exited prematurely: exitcode 1"
    )


def test_retry_signal_and_next_attempt_in_either_order_end_saying_the_attempt_started(tmp_path: Path) -> None:
    store = SqlStore.from_url(f"sqlite:///{tmp_path / 't.db'}")
    store.create_schema()
    service = TaskService(store)
    for order in ("signal first", "attempt first"):
        key = order
        store.create(
            TaskRecord(
                key=key,
                owner=None,
                tool="t",
                status=TaskStatus.WORKING,
                created_at=1,
                updated_at=1,
                ttl_ms=None,
                dispatches=1,
            ),
            max_rows=None,
        )
        steps = [
            lambda key=key: service.retrying(key, Run(1, 1), start_by_ms=0),
            lambda key=key: service.begin(key, Run(1, 1), stale_before_ms=0),
        ]
        for step in steps if order == "signal first" else reversed(steps):
            step()
        record = store.get(key)
        # Signal first: "Retrying (attempt 2)", then the start. Attempt first: the start, and the late signal
        # changes nothing.
        assert record is not None and record.version == (3 if order == "signal first" else 2) and record.attempt == 1
        assert record.started_at is not None
        assert record.status_message == "Started (attempt 2)"
        with pytest.raises(Superseded):  # the failed attempt can no longer write
            service.fail(key, {"code": -32603, "message": "late"}, run=Run(1, 0))
    store.dispose()


def test_writes_of_a_superseded_run_are_refused_and_its_heartbeat_stops(tasks: McpTasks) -> None:
    service = internals(tasks).service()
    _, record = service.create(owner=None, tool="unused", arguments={}, dispatch=False)
    service.store.update(record.key, None, lambda r: r.dispatched(0))  # dispatch 1 (the old run)
    old = TaskContext(service, record.key, record=record, run=Run(1))
    service.store.update(record.key, None, lambda r: r.dispatched(0, resend=True))  # dispatch 2
    with pytest.raises(Superseded):
        old.progress("still here")
    with pytest.raises(Superseded):
        old.heartbeat()
    assert service.heartbeat(record.key, Run(2))


def test_bind_true_hands_the_job_first_and_hides_it_from_the_tool_schema(tasks: McpTasks) -> None:
    @tasks.mcp_task(bind=True)
    def bound(self: Any, city: str, ctx: TaskContext) -> str:
        return f"{self.name}:{city}:{ctx.attached}"

    assert list(internals(tasks).tools["bound"].input_schema["properties"]) == ["city"]
    task_id, _ = internals(tasks).service().create(owner=None, tool="bound", arguments={"city": "Oslo"})
    bound.apply(kwargs={"city": "Oslo"}, headers=headers(task_id))
    done = status(tasks, task_id)
    assert done.result is not None and done.result["content"][0]["text"] == f"{bound.name}:Oslo:True"
    # Still a plain Celery task: called without an MCP task it gets a detached context.
    assert bound.apply(kwargs={"city": "Rome"}).get() == f"{bound.name}:Rome:False"


class DownStore(SqlStore):
    def update(self, *args: Any, **kwargs: Any) -> TaskRecord:
        raise OSError("the database is down")


def test_a_bridge_that_cannot_write_says_so_loudly(
    tasks: McpTasks, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    @tasks.mcp_task
    def unwritable_body() -> str:
        return "ran"

    task_id, _ = internals(tasks).service().create(owner=None, tool="unwritable_body", arguments={})
    down = TaskService(DownStore(internals(tasks).service().store.engine))
    monkeypatch.setattr(tasks, "_service", lambda: down)  # what the job's runtime asks
    unwritable_body.push_request(headers=headers(task_id), retries=0, **{OUTCOME: {"content": []}})
    try:
        with caplog.at_level(logging.ERROR, logger="celery_mcp_tasks.worker"):
            bridge.on_success(sender=unwritable_body, result=None)
    finally:
        unwritable_body.pop_request()
    assert "tool 'unwritable_body': could not record completion; the janitor will settle the task" in caplog.text
    assert task_id not in caplog.text


class UnavailableStore(SqlStore):
    """A store whose writes fail while `down` (a failover, a restart), then work again."""

    down = True

    def update(self, *args: Any, **kwargs: Any) -> TaskRecord:
        if self.down:
            raise StoreUnavailable("_locked", "OperationalError")
        return super().update(*args, **kwargs)


class SteppedClock:
    """The worker's clock while it waits for the store (`outages`): each sleep moves it on, and `during` runs at each (what the outage does meanwhile)."""

    def __init__(self, during: Any = None) -> None:
        self.now, self.slept, self.during = 1000.0, [], during

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds
        if self.during is not None:
            self.during(len(self.slept))


def created_behind(tasks: McpTasks, monkeypatch: pytest.MonkeyPatch, store: SqlStore, *tools: str) -> list[str]:
    """Tasks of `tools` created as usual; from then on the jobs' runtime writes through `store`."""
    created = [internals(tasks).service().create(owner=None, tool=tool, arguments={})[0] for tool in tools]
    behind = TaskService(store)
    monkeypatch.setattr(tasks, "_service", lambda: behind)  # what the job's runtime asks
    return created


def settle_through(
    tasks: McpTasks,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    clock: SteppedClock,
    store: Any,
    *,
    ran_here: bool = True,
    timelimit: tuple[float | None, float | None] | None = None,
    signal: Any = bridge.on_success,
) -> tuple[str, list[logging.LogRecord], Any]:
    """The job's end signalled with `store` behind it: (task id, the worker's log records, the run's RUN_END).
    `ran_here`: in the process whose job ran (its claimed record on the request), else as the main process."""

    @tasks.mcp_task
    def outage_body() -> str:
        return "ran"

    [task_id] = created_behind(tasks, monkeypatch, store, "outage_body")
    monkeypatch.setattr(outages, "time", clock)
    extra: dict[str, Any] = {OUTCOME: {"content": []}} if signal is bridge.on_success else {}
    if ran_here:
        extra[LAST_RECORD] = status(tasks, task_id)
    outage_body.push_request(headers=headers(task_id), retries=0, timelimit=timelimit, **extra)
    try:
        with caplog.at_level(logging.WARNING, logger="celery_mcp_tasks.worker"):
            signal(sender=outage_body, result=None, exception=RuntimeError("boom"))
        run_end = getattr(outage_body.request, RUN_END, None)
    finally:
        outage_body.pop_request()
    return task_id, [r for r in caplog.records if r.name.startswith("celery_mcp_tasks.worker")], run_end


def test_a_store_outage_at_the_outcome_is_waited_out_for_a_while_then_one_warning_line_naming_the_setting(
    tasks: McpTasks, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The database is down as the job ends and stays down: tried again for 30 s (half the default stale
    timeout is more), then left to the janitor; a line when it starts waiting and one when it gives up, no
    traceback, nothing of the store's internals; the exception itself, as Celery logs a job's, names no method."""
    clock = SteppedClock()
    store = UnavailableStore(internals(tasks).service().store.engine)
    task_id, records, run_end = settle_through(tasks, monkeypatch, caplog, clock, store)
    assert sum(clock.slept) == outages.PATIENCE_S and clock.slept[:3] == [0.25, 0.5, 1.0]
    assert run_end == "its completion could not be recorded, the task store is unavailable"  # not "succeeded"
    assert [r.levelno for r in records] == [logging.WARNING] * 2 and not [r for r in records if r.exc_info]
    said = "tool 'outage_body': could not record completion, the task store is unavailable (OperationalError; "
    assert records[0].getMessage() == said + "MCP_TASKS_DATABASE_URL); trying again for up to 30 s"
    assert records[1].getMessage() == (
        said + "MCP_TASKS_DATABASE_URL); the janitor sends the job again or fails the task after the stale timeout"
    )
    assert status(tasks, task_id).status is TaskStatus.WORKING
    assert repr(StoreUnavailable("_locked", "OperationalError")) == "StoreUnavailable('The task store is unavailable')"
    again = pickle.loads(pickle.dumps(StoreUnavailable("_locked", "OperationalError")))
    assert (again.operation, again.reason, str(again)) == ("_locked", "OperationalError", StoreUnavailable.MESSAGE)


def test_an_outcome_through_a_short_store_outage_lands_without_running_the_job_again(
    tasks: McpTasks, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failover of a few seconds as the job ends: the outcome, held in memory, is written once the store
    answers (before, it was dropped and the job ran again after the stale timeout, five minutes by default)."""
    store = UnavailableStore(internals(tasks).service().store.engine)

    def recovers(sleeps: int) -> None:
        store.down = sleeps < 3

    clock = SteppedClock(recovers)
    task_id, records, run_end = settle_through(tasks, monkeypatch, caplog, clock, store)
    assert clock.slept == [0.25, 0.5, 1.0] and run_end is None
    assert [r.getMessage().rsplit("; ", 1)[1] for r in records] == ["trying again for up to 30 s"]
    assert status(tasks, task_id).status is TaskStatus.COMPLETED


def test_a_short_stale_timeout_bounds_the_wait_for_the_store_to_half_of_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = Settings(data_dir=tmp_path, janitor_interval_s=None, stale_timeout_s=10)
    upgrade(settings.store_url)
    tasks = McpTasks("guards-short", celery=Celery("guards-short"), settings=settings)
    clock = SteppedClock()
    settle_through(tasks, monkeypatch, caplog, clock, UnavailableStore(internals(tasks).service().store.engine))
    assert sum(clock.slept) == 5


def test_the_store_is_tried_once_more_at_the_end_of_the_wait(
    tasks: McpTasks, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The waits double to 4 s: the last one is cut to the deadline, and the store tried there (a failover of
    29 s was given up at 27.75 s)."""
    store = UnavailableStore(internals(tasks).service().store.engine)
    clock = SteppedClock()
    start = clock.now

    def recovers(_: int) -> None:
        store.down = clock.now - start < 29

    clock.during = recovers
    task_id, _, _ = settle_through(tasks, monkeypatch, caplog, clock, store)
    assert sum(clock.slept) == 30 and clock.slept[-1] == 2.25
    assert status(tasks, task_id).status is TaskStatus.COMPLETED


def test_a_failure_reported_by_the_main_process_does_not_wait_for_the_store(
    tasks: McpTasks, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Celery reports a hard time limit or a lost pool process from the worker's main process: waiting there
    would stop its loop (and the hard limit's kill) for up to 30 s a job."""
    clock = SteppedClock()
    store = UnavailableStore(internals(tasks).service().store.engine)
    _, records, _ = settle_through(tasks, monkeypatch, caplog, clock, store, ran_here=False, signal=bridge.on_failure)
    assert clock.slept == []
    assert [r.getMessage().rsplit("; ", 1)[-1] for r in records] == [
        "the janitor sends the job again or fails the task after the stale timeout"
    ]


def test_the_outcome_waits_no_longer_than_the_jobs_hard_time_limit_allows(
    tasks: McpTasks, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = SteppedClock()
    store = UnavailableStore(internals(tasks).service().store.engine)
    settle_through(tasks, monkeypatch, caplog, clock, store, timelimit=(10, 5))  # (hard, soft): soft is over
    assert sum(clock.slept) == 9  # a second short of the kill


def test_a_claim_through_a_short_store_outage_waits_and_the_job_runs(
    tasks: McpTasks, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = UnavailableStore(internals(tasks).service().store.engine)

    def recovers(sleeps: int) -> None:
        store.down = sleeps < 2

    monkeypatch.setattr(outages, "time", SteppedClock(recovers))

    @tasks.mcp_task
    def patient_work() -> str:
        return "done"

    [task_id] = created_behind(tasks, monkeypatch, store, "patient_work")
    with caplog.at_level(logging.WARNING, logger="celery_mcp_tasks.worker"):
        patient_work.apply(headers=headers(task_id))
    said = worker_lines(caplog)
    assert said == [
        "job for tool 'patient_work' waits to start: the task store is unavailable (OperationalError; "
        "MCP_TASKS_DATABASE_URL); trying again for up to 30 s"
    ]
    assert status(tasks, task_id).status is TaskStatus.COMPLETED


def test_a_run_the_store_cannot_claim_or_serve_ends_leaving_the_task_to_the_janitor_not_failed(
    tasks: McpTasks, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store is still down once the claim has waited, or a write the body needs (its question) fails: the
    run ends without an outcome, and the task stays `working` for the janitor's re-send, as after a lost worker.
    Before, the job failed and its failure, written once the store was back, ended for good a task nothing had
    run (or whose next run could succeed)."""
    store = UnavailableStore(internals(tasks).service().store.engine)
    clock = SteppedClock()
    monkeypatch.setattr(outages, "time", clock)
    bodies: list[str] = []

    @tasks.mcp_task
    def never_claimed() -> str:
        bodies.append("never_claimed")
        return "done"

    @tasks.mcp_task(needs=("elicitation",))
    def asks(ctx: TaskContext) -> str:
        bodies.append("asks")
        store.down = True
        ctx.require_input({"go": elicit("Go?", {"ok": bool})})
        return "asked"

    unclaimed, asking = created_behind(tasks, monkeypatch, store, "never_claimed", "asks")
    with caplog.at_level(logging.INFO):
        never_claimed.apply(headers=headers(unclaimed))
        store.down = False
        asks.apply(headers=headers(asking))
    assert bodies == ["asks"] and 25 <= sum(clock.slept) <= 30
    for task_id in (unclaimed, asking):
        assert status(tasks, task_id).status is TaskStatus.WORKING
    worker = worker_lines(caplog)
    end = "the task store is unavailable (OperationalError; MCP_TASKS_DATABASE_URL); the janitor sends the job again"
    assert f"job for tool 'never_claimed' not started: {end} after the stale timeout" in worker
    assert f"job for tool 'asks' stopped: {end} after the stale timeout" in worker
    traced = [r.getMessage() for r in caplog.records if r.name == "celery.app.trace"]
    assert any(line.endswith("s: not started, the task store is unavailable") for line in traced), traced
    assert any(line.endswith("s: stopped, the task store is unavailable") for line in traced), traced
    assert not [r for r in caplog.records if r.exc_info]


class LandedButUnansweredStore(SqlStore):
    """The first write commits, and its answer is lost with the connection (a failover at the commit)."""

    lost = 1

    def update(self, *args: Any, **kwargs: Any) -> TaskRecord:
        written = super().update(*args, **kwargs)
        if self.lost:
            self.lost -= 1
            raise StoreUnavailable("update", "OperationalError")
        return written


def test_a_claim_that_landed_though_its_answer_was_lost_runs_the_body(
    tasks: McpTasks, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The retry finds the run claimed and beating: by this very copy, so the body runs (it was skipped as
    "another copy of this run is already running", and the task waited out the stale timeout)."""
    monkeypatch.setattr(outages, "time", SteppedClock())
    bodies: list[int] = []

    @tasks.mcp_task
    def landed() -> str:
        bodies.append(1)
        return "done"

    store = LandedButUnansweredStore(internals(tasks).service().store.engine)
    [task_id] = created_behind(tasks, monkeypatch, store, "landed")
    landed.apply(headers=headers(task_id))
    assert bodies == [1] and status(tasks, task_id).status is TaskStatus.COMPLETED


def test_another_copys_claim_made_while_ours_failed_is_not_taken_for_ours(
    tasks: McpTasks, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A redelivered copy of the message claims the run while this copy's claim fails on the store: the retry
    finds a claim at another time, so this copy stands aside (one body, not two at once)."""
    monkeypatch.setattr(outages, "time", SteppedClock())
    bodies: list[int] = []

    @tasks.mcp_task
    def contested() -> str:
        bodies.append(1)
        return "done"

    plain = internals(tasks).service()

    class OtherCopyFirst(SqlStore):
        first = True

        def update(self, *args: Any, **kwargs: Any) -> TaskRecord:
            if self.first:
                self.first = False
                record = plain.store.get(args[0])
                assert record is not None
                plain.begin(args[0], Run(1, 0, record.created_at), stale_before_ms=0, at_ms=now_ms() - 5000)
                raise StoreUnavailable("update", "OperationalError")
            return super().update(*args, **kwargs)

    [task_id] = created_behind(tasks, monkeypatch, OtherCopyFirst(plain.store.engine), "contested")
    with caplog.at_level(logging.INFO, logger="celery_mcp_tasks.worker"):
        contested.apply(headers=headers(task_id))
    assert bodies == []
    assert "skipped: another copy of this run is already running" in caplog.text


def test_time_limits_are_the_messages_else_the_jobs_else_the_workers(
    tasks: McpTasks, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As Celery decides them: `celery worker --time-limit` reaches the pool, not the task's attributes."""
    from celery_mcp_tasks.worker import job as job_module

    @tasks.mcp_task(soft_time_limit=20)
    def timed() -> str:
        return "done"

    request = Context(timelimit=None)
    assert job_module.limit_left_s(timed, request, soft=False) is None
    assert job_module.limit_left_s(timed, request, soft=True) == 20
    monkeypatch.setattr(job_module, "_worker_limits", (60.0, 30.0))
    assert job_module.limit_left_s(timed, request, soft=False) == 60
    assert job_module.limit_left_s(timed, Context(timelimit=[40, 10]), soft=True) == 10
    started = Context(timelimit=[40, None], **{job_module.RUN_CLOCK: time.monotonic() - 15})
    assert 24 < job_module.limit_left_s(timed, started, soft=False) <= 25  # counted from the run's start


def test_a_soft_time_limit_while_the_claim_waits_leaves_the_task_to_the_janitor(
    tasks: McpTasks, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The wait is bounded by the soft limit (a second short of it), and a soft limit that comes anyway ends the
    run unstarted: it failed the task ("did not catch SoftTimeLimitExceeded") though its body never ran."""
    from celery.exceptions import SoftTimeLimitExceeded

    clock = SteppedClock()
    monkeypatch.setattr(outages, "time", clock)
    store = UnavailableStore(internals(tasks).service().store.engine)

    @tasks.mcp_task(soft_time_limit=8)
    def limited() -> str:
        return "done"

    [task_id] = created_behind(tasks, monkeypatch, store, "limited")
    with caplog.at_level(logging.WARNING, logger="celery_mcp_tasks.worker"):
        limited.apply(headers=headers(task_id))
    assert sum(clock.slept) == pytest.approx(7, abs=0.1)

    def limit_comes(_: int) -> None:
        raise SoftTimeLimitExceeded()

    clock.during = limit_comes
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="celery_mcp_tasks.worker"):
        limited.apply(headers=headers(task_id))
    said = worker_lines(caplog)
    assert said[-1] == (
        "job for tool 'limited' not started: the task store is unavailable (its soft time limit came first; "
        "MCP_TASKS_DATABASE_URL); the janitor sends the job again after the stale timeout"
    )
    assert status(tasks, task_id).status is TaskStatus.WORKING


def test_progress_reports_the_store_cannot_take_are_dropped_and_the_job_goes_on(
    tasks: McpTasks, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A report is information: one lost in an outage is no reason to lose the work (the job failed, its failure
    could not be written either, and the janitor ran it again after the stale timeout). One line an outage."""
    store = UnavailableStore(internals(tasks).service().store.engine)
    store.down = False

    @tasks.mcp_task
    def reporting(ctx: TaskContext) -> str:
        store.down = True
        for n in range(3):
            ctx.progress(f"step {n}")
        store.down = False
        ctx.progress("step 3")
        store.down = True
        ctx.progress("step 4")  # a second outage says so again
        store.down = False
        return "done"

    [task_id] = created_behind(tasks, monkeypatch, store, "reporting")
    with caplog.at_level(logging.WARNING, logger="celery_mcp_tasks.worker"):
        reporting.apply(headers=headers(task_id))
    said = worker_lines(caplog)
    assert (
        said
        == [
            "a progress report was dropped: the task store is unavailable (OperationalError; MCP_TASKS_DATABASE_URL); "
            "the job goes on"
        ]
        * 2
    )
    assert status(tasks, task_id).status is TaskStatus.COMPLETED


# -- the context ---------------------------------------------------------------------------------


class CountingStore(SqlStore):
    reads = 0

    def get(self, key: str, owner: Any = None) -> TaskRecord | None:  # type: ignore[override]
        type(self).reads += 1
        return super().get(key) if owner is None else super().get(key, owner)


@pytest.fixture
def parked(tmp_path: Path) -> Iterator[tuple[TaskService, list[TaskRecord]]]:
    store = CountingStore.from_url(f"sqlite:///{tmp_path / 'ctx.db'}")
    store.create_schema()
    sends: list[TaskRecord] = []
    yield TaskService(store, dispatcher=SendOnly(sends.append)), sends
    store.dispose()


def job_context(service: TaskService) -> tuple[str, TaskContext]:
    task_id, record = service.create(owner=None, tool="t", arguments={})
    return task_id, TaskContext(service, record.key, record=record, run=Run(record.dispatches))


def ask() -> dict[str, Any]:
    return {"ok": elicit("Proceed?", {"ok": bool})}


def test_wait_for_input_returns_the_answer_in_the_same_run_without_a_new_job(parked: Any) -> None:
    service, sends = parked
    task_id, ctx = job_context(service)
    answers: list[dict[str, Any]] = []
    waiter = threading.Thread(target=lambda: answers.append(ctx.wait_for_input(ask(), timeout=10, poll_interval=0.02)))
    waiter.start()
    while service.get(task_id, None).status is not TaskStatus.INPUT_REQUIRED:
        time.sleep(0.01)
    service.answer(task_id, None, {"ok": {"action": "accept", "content": {"ok": True}}})
    waiter.join(10)
    assert answers == [{"ok": {"action": "accept", "content": {"ok": True}}}]
    assert len(sends) == 1  # only the first send; the answer enqueued nothing
    assert ctx.wait_for_input(ask(), timeout=0) == answers[0]  # a re-run gets it at once


def test_wait_for_input_that_times_out_unparks_so_a_late_answer_enqueues_the_job(parked: Any) -> None:
    service, sends = parked
    task_id, ctx = job_context(service)
    with pytest.raises(InputTimeout):
        ctx.wait_for_input(ask(), timeout=0.1, poll_interval=0.02)
    assert not service.get(task_id, None).parked
    service.answer(task_id, None, {"ok": {"action": "accept", "content": {"ok": False}}})
    assert len(sends) == 2


def test_wait_for_input_ends_when_the_task_is_cancelled(parked: Any) -> None:
    service, _ = parked
    task_id, ctx = job_context(service)
    threading.Timer(0.2, lambda: service.cancel(task_id, None)).start()
    with pytest.raises(TerminalTask):
        ctx.wait_for_input(ask(), timeout=10, poll_interval=0.02)


def test_wait_for_input_reads_through_a_store_outage_within_its_timeout(
    parked: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One failed read ended the run and left the task waiting for an answer with nobody to take it."""
    service, sends = parked
    task_id, ctx = job_context(service)
    down = threading.Event()
    failed: list[int] = []
    real_get = CountingStore.get

    def get(self: CountingStore, key: str, owner: Any = None) -> TaskRecord | None:
        if down.is_set():
            failed.append(1)
            raise StoreUnavailable("get", "OperationalError")
        return real_get(self, key, owner)

    monkeypatch.setattr(CountingStore, "get", get)
    answers: list[dict[str, Any]] = []
    waiter = threading.Thread(target=lambda: answers.append(ctx.wait_for_input(ask(), timeout=10, poll_interval=0.02)))
    waiter.start()
    while service.get(task_id, None).status is not TaskStatus.INPUT_REQUIRED:
        time.sleep(0.01)
    down.set()
    while len(failed) < 3:
        time.sleep(0.01)
    down.clear()
    service.answer(task_id, None, {"ok": {"action": "accept", "content": {"ok": True}}})
    waiter.join(10)
    assert answers == [{"ok": {"action": "accept", "content": {"ok": True}}}] and len(sends) == 1


class FrozenClock:
    """Stands in for the context module's `time`: the monotonic clock moves only when the test says so."""

    def __init__(self) -> None:
        self.now = 1_000.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_cancelled_reads_the_store_at_most_once_per_check_interval(
    parked: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What makes it cheap enough for a tight loop (how cheap, against a store read: bench/bench_cancel_check.py)."""
    clock = FrozenClock()
    monkeypatch.setattr(sys.modules[TaskContext.__module__], "time", clock)
    service, _ = parked
    task_id, ctx = job_context(service)
    CountingStore.reads = 0
    assert not any(ctx.cancelled() for _ in range(10_000))
    assert CountingStore.reads == 0  # the record the job started with is fresh for one interval
    clock.now += ctx.cancel_check_interval + 1e-6
    assert not any(ctx.cancelled() for _ in range(10_000))
    assert CountingStore.reads == 1  # one read per interval, however often it is asked
    service.cancel(task_id, None)
    assert not ctx.cancelled()  # not seen until the next interval ...
    clock.now += ctx.cancel_check_interval + 1e-6
    assert ctx.cancelled() and CountingStore.reads == 2  # ... then seen with one read


def test_a_hundred_looping_jobs_read_the_store_about_once_a_second_each(
    parked: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 20: at the old 50 ms, 100 jobs polling `cancelled()` cost 2 000 reads/s; by default now ~100."""
    clock = FrozenClock()
    monkeypatch.setattr(sys.modules[TaskContext.__module__], "time", clock)
    service, _ = parked
    contexts = [job_context(service)[1] for _ in range(100)]
    assert TaskContext.cancel_check_interval == 1.0
    CountingStore.reads = 0
    for _ in range(640):  # 10 s of every job asking 64 times a second (steps exact in binary)
        clock.now += 1 / 64
        assert not any(ctx.cancelled() for ctx in contexts)
    assert CountingStore.reads == 100 * 10  # one read per job per second


def test_the_check_interval_is_a_setting_of_the_context(parked: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = FrozenClock()
    monkeypatch.setattr(sys.modules[TaskContext.__module__], "time", clock)
    service, _ = parked
    _, ctx = job_context(service)
    ctx.cancel_check_interval = 0.25
    CountingStore.reads = 0
    for _ in range(64):  # 1 s, asked 64 times
        clock.now += 1 / 64
        ctx.cancelled()
    assert CountingStore.reads == 4


def test_a_handle_outside_any_job_drives_the_task_and_answers_terminal_after(tasks: McpTasks) -> None:
    task_id, record = internals(tasks).service().create(owner=None, tool="unused", arguments={}, dispatch=False)
    handle = tasks.task_handle(record.key)
    handle.progress("half way")
    handle.complete("done elsewhere")
    assert internals(tasks).service().get(task_id, None).status is TaskStatus.COMPLETED
    for write in (lambda: handle.progress("again"), lambda: handle.fail("late"), lambda: handle.complete("twice")):
        with pytest.raises(TerminalTask, match="terminal"):
            write()


def test_a_handle_stores_the_result_a_job_returning_it_would_and_refuses_one_that_is_not_a_result(
    tasks: McpTasks,
) -> None:
    service = internals(tasks).service()
    task_id, record = service.create(owner=None, tool="unused", arguments={}, dispatch=False)
    handle = tasks.task_handle(record.key)
    with pytest.raises(ValueError, match="content") as refused:
        handle.complete({"content": "the secret words"})
    assert "secret" not in str(refused.value)  # the fields are named, never the values
    assert service.get(task_id, None).status is TaskStatus.WORKING  # nothing stored
    handle.complete({"content": [{"type": "text", "text": "done"}], "structuredContent": {"n": 1}})
    returned = CallToolResult(content=[TextContent(type="text", text="done")], structured_content={"n": 1})
    assert service.get(task_id, None).result == returned.model_dump(by_alias=True, mode="json", exclude_none=True)
    assert service.get(task_id, None).result["resultType"] == "complete"  # as every stored outcome says


def test_a_job_that_never_reports_shows_its_start_and_numbers_ride_along_when_it_does(tasks: McpTasks) -> None:
    seen: list[tuple[str | None, float | None, float | None]] = []

    @tasks.mcp_task
    def counting(ctx: TaskContext) -> str:
        record = ctx.record()
        assert record is not None
        seen.append((record.status_message, record.progress, record.progress_total))
        ctx.progress("1 of 4", 1, 4)
        ctx.progress("still 1 of 4")  # the numbers stay
        record = ctx.record()
        assert record is not None
        seen.append((record.status_message, record.progress, record.progress_total))
        return "counted"

    task_id, created = (
        internals(tasks).service().create(owner=None, tool="counting", arguments={}, status_message="Queued")
    )
    counting.apply(headers=headers(task_id))
    assert seen == [("Started", None, None), ("still 1 of 4", 1.0, 4.0)]
    done = status(tasks, task_id)
    assert done.status is TaskStatus.COMPLETED and (done.progress, done.progress_total) == (4.0, 4.0)  # done: full
    assert done.updated_at >= created.updated_at


def test_progress_numbers_are_checked_even_without_a_task(tasks: McpTasks) -> None:
    _, record = internals(tasks).service().create(owner=None, tool="unused", arguments={}, dispatch=False)
    for ctx in (TaskContext.detached(), tasks.task_handle(record.key)):
        with pytest.raises(ValueError, match=r"total needs a current value: call progress\(message, current, total\)"):
            ctx.progress("x", total=10)
        with pytest.raises(ValueError, match="current must not be negative"):
            ctx.progress("x", -1)
        ctx.progress("fine", 0, 10)
    stored = internals(tasks).service().record(record.key)
    assert stored is not None and (stored.status_message, stored.progress, stored.progress_total) == ("fine", 0, 10)


def _statements(tasks: McpTasks) -> list[str]:
    seen: list[str] = []

    @sa.event.listens_for(internals(tasks).service().store.engine, "before_cursor_execute")  # type: ignore[attr-defined]  # the Store protocol has no engine
    def statement(conn: Any, cursor: Any, sql: str, *_: Any) -> None:
        seen.append(sql.split()[0].upper())

    return seen


def test_a_job_costs_one_read_and_one_update_to_claim_and_one_update_per_report_and_outcome(
    tasks: McpTasks,
) -> None:
    """Issue 20: each write of the run is one conditional UPDATE on the record the run last saw. A message
    without the dispatch's record (`RECORD_HEADER`: sent by an older release) reads the row once to claim."""

    @tasks.mcp_task
    def reporting(ctx: TaskContext) -> str:
        ctx.progress("half way", 1, 2)
        return "done"

    task_id, _ = internals(tasks).service().create(owner=None, tool="reporting", arguments={})
    seen = _statements(tasks)
    reporting.apply(headers=headers(task_id))
    # SQLite: the read's deferred BEGIN, its SELECT; then the claim, the report and the outcome: one UPDATE each.
    assert [word for word in seen if word != "BEGIN"] == ["SELECT", "UPDATE", "UPDATE", "UPDATE"]
    done = status(tasks, task_id)
    assert done.status is TaskStatus.COMPLETED and done.progress == 2 and done.version == 4  # its bar full


def test_a_message_carrying_its_dispatched_record_claims_with_one_update_and_no_read(tasks: McpTasks) -> None:
    """Issue 20: the claim is computed on the record the message carries; a whole run is two UPDATEs."""
    seen_arguments: list[int] = []

    @tasks.mcp_task
    def carried(n: int) -> str:
        seen_arguments.append(n)
        return "done"

    task_id, record = internals(tasks).service().create(owner="alice", tool="carried", arguments={"n": 7})
    sent = message_headers(record)
    assert task_id not in sent[RECORD_HEADER] and "arguments" not in json.loads(sent[RECORD_HEADER])
    seen = _statements(tasks)
    carried.apply(kwargs={"n": 7}, headers=sent)
    assert [word for word in seen if word != "BEGIN"] == ["UPDATE", "UPDATE"]  # the claim, the outcome
    done = status(tasks, task_id)
    assert seen_arguments == [7] and done.status is TaskStatus.COMPLETED and done.version == 3
    assert done.owner == "alice" and done.started_at is not None and done.arguments == {"n": 7}


def test_a_carried_record_the_row_has_moved_past_decides_nothing(tasks: McpTasks) -> None:
    """The message's record is only a guess: a cancel, a claim by another copy or a newer dispatch wins."""
    calls: list[str] = []

    @tasks.mcp_task
    def guessed() -> str:
        calls.append("ran")
        return "ran"

    service = internals(tasks).service()
    cancelled_id, cancelled = service.create(owner=None, tool="guessed", arguments={})
    service.cancel(cancelled_id, None)
    guessed.apply(headers=message_headers(cancelled))
    assert calls == [] and status(tasks, cancelled_id).status is TaskStatus.CANCELLED

    running_id, running = service.create(owner=None, tool="guessed", arguments={})
    service.begin(running.key, Run(1), stale_before_ms=0)  # another copy claimed the run and beats
    guessed.apply(headers=message_headers(running))  # a redelivered copy of the same message
    assert calls == [] and status(tasks, running_id).status is TaskStatus.WORKING

    old_id, old = service.create(owner=None, tool="guessed", arguments={})
    service.store.update(old.key, None, lambda r: r.dispatched(0, "sent again", resend=True))  # dispatch 2
    guessed.apply(headers=message_headers(old))
    assert calls == [] and status(tasks, old_id).status is TaskStatus.WORKING


def test_a_record_header_this_release_cannot_read_falls_back_to_reading_the_row(tasks: McpTasks) -> None:
    @tasks.mcp_task
    def unreadable(n: int) -> int:
        return n

    task_id, record = internals(tasks).service().create(owner=None, tool="unreadable", arguments={"n": 2})
    sent = {**message_headers(record), RECORD_HEADER: '{"a_field_of_a_newer_release": 1}'}
    seen = _statements(tasks)
    unreadable.apply(kwargs={"n": 2}, headers=sent)
    assert [word for word in seen if word != "BEGIN"] == ["SELECT", "UPDATE", "UPDATE"]
    assert status(tasks, task_id).status is TaskStatus.COMPLETED


def test_a_dispatch_with_answers_carries_no_record_its_run_reads_them_from_the_row(tasks: McpTasks) -> None:
    service = internals(tasks).service()
    _, record = service.create(owner=None, tool="any", arguments={}, input_responses={"k": {"ok": True}})
    assert RECORD_HEADER not in message_headers(record)


def test_an_outcome_after_another_writer_moved_the_task_still_lands_right(tasks: McpTasks) -> None:
    @tasks.mcp_task
    def overtaken(ctx: TaskContext) -> str:
        internals(tasks).service().progress(ctx.key or "", "written by someone else")  # the run's record is now stale
        return "done"

    task_id, _ = internals(tasks).service().create(owner=None, tool="overtaken", arguments={})
    overtaken.apply(headers=headers(task_id))
    done = status(tasks, task_id)
    assert done.status is TaskStatus.COMPLETED and done.version == 4  # created, claimed, progress, completed
