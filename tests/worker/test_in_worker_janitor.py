"""The in-worker janitor (MCP_TASKS_JANITOR=worker): many workers, one sweep per interval, a loop that never stops.

Threads on a real SQLite ledger, and a real in-process Celery worker with a prefork pool
(whose main process must only send); real worker processes in tests/integration/test_janitor_ops.py.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from celery import Celery, signals
from celery.concurrency import solo
from celery.contrib.testing.worker import TestWorkController
from celery.utils.timer2 import Timer

from celery_mcp_tasks import McpTasks
from celery_mcp_tasks.app import internals
from celery_mcp_tasks.config import Settings
from celery_mcp_tasks.migrate import upgrade
from celery_mcp_tasks.store.sql import SqlStore
from celery_mcp_tasks.store.sweeps import JANITOR, SweepLedger
from celery_mcp_tasks.worker.janitor import JANITOR_TASK, InWorkerJanitor, JanitorMessages, install_janitor
from tests.worker.test_beat import beat_schedule_at_init

JANITOR_LOGGER = "celery_mcp_tasks.janitor"


@pytest.fixture
def ledger(tmp_path: Path):  # type: ignore[no-untyped-def]
    url = f"sqlite:///{tmp_path / 'tasks.db'}"
    upgrade(url)
    store = SqlStore.from_url(url)
    yield store.ledger()
    store.dispose()


def recording(ledger: SweepLedger, who: str, swept: list[str]):  # type: ignore[no-untyped-def]
    lock = threading.Lock()

    def run_sweep() -> None:
        with lock:
            swept.append(who)
        ledger.record(JANITOR, duration_ms=0, report={}, statuses={})

    return run_sweep


class DrivenLedger:
    """The ledger's claim rule (`SweepLedger.claim`) on a clock the test drives: no sleeping, no tolerance."""

    def __init__(self, clock: list[float]) -> None:
        self.clock = clock
        self.claimed_at: float | None = None

    def claim(self, name: str, *, interval_ms: int, by: str) -> bool:
        now_ms = self.clock[0] * 1000
        if self.claimed_at is not None and self.claimed_at > now_ms - interval_ms:
            return False
        self.claimed_at = now_ms
        return True

    def last(self, name: str = JANITOR) -> None:
        return None

    def record(
        self,
        name: str,
        *,
        duration_ms: int,
        report: dict[str, int],
        statuses: dict[str, int],
        swept_at: int | None = None,
    ) -> None:
        pass


def test_three_workers_sweep_once_per_interval_between_them() -> None:
    interval, intervals = 10.0, 9
    clock = [0.0]
    ledger = DrivenLedger(clock)
    swept: list[str] = []
    janitors = [
        InWorkerJanitor(
            lambda who=f"w{n}": swept.append(who), lambda: ledger, interval, f"w{n}", clock=lambda: clock[0]
        )
        for n in range(3)
    ]
    due = [0.0, 0.013 * interval, 0.029 * interval]  # workers started a little apart, each at its own rhythm
    while min(due) < intervals * interval:
        n = due.index(min(due))
        clock[0] = due[n]
        due[n] = janitors[n].step(due[n])
    assert len(swept) == intervals  # one sweep per interval between them, not three
    assert len(set(swept)) == 1  # the first claimant keeps the rhythm (the claim admits it SLACK early)


def test_a_tick_that_falls_behind_resumes_from_now_without_a_burst() -> None:
    clock = [0.0]
    janitor = InWorkerJanitor(lambda: None, lambda: DrivenLedger(clock), 10.0, "w", clock=lambda: clock[0])
    clock[0] = 35.0  # the tick due at 0 ran long (or the process was stopped)
    assert janitor.step(0.0) == 45.0  # not 10, 20, 30 at once


def test_a_failing_sweep_is_a_log_line_and_the_loop_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    calls: list[int] = []

    def flaky() -> None:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("store down")

    clock = [0.0]
    janitor = InWorkerJanitor(flaky, lambda: DrivenLedger(clock), 0.1, "w", clock=lambda: clock[0])
    due = 0.0
    with caplog.at_level(logging.WARNING, logger=JANITOR_LOGGER):
        for _ in range(3):
            clock[0] = due
            due = janitor.step(due)
    assert len(calls) == 3
    assert [r.getMessage() for r in caplog.records if r.name == JANITOR_LOGGER] == [
        "in-worker janitor: the sweep failed (RuntimeError); trying again next interval"
    ]


def test_a_tick_that_loses_the_claim_does_not_sweep(ledger: SweepLedger) -> None:
    swept: list[str] = []
    first = InWorkerJanitor(recording(ledger, "a", swept), lambda: ledger, 60, "a")
    second = InWorkerJanitor(recording(ledger, "b", swept), lambda: ledger, 60, "b")
    assert first.tick() and not second.tick()
    assert swept == ["a"]
    assert ledger.last().claimed_by == "a"  # type: ignore[union-attr]


def test_a_worker_whose_clock_is_behind_does_not_let_another_sweep_in_the_same_interval(
    ledger: SweepLedger, monkeypatch: pytest.MonkeyPatch
) -> None:
    swept: list[str] = []
    behind = InWorkerJanitor(recording(ledger, "behind", swept), lambda: ledger, 10, "behind")
    right = InWorkerJanitor(recording(ledger, "right", swept), lambda: ledger, 10, "right")
    real_ns, real = time.time_ns, time.time
    with monkeypatch.context() as patched:  # this host's clock 30 s (three intervals) behind the database's
        patched.setattr(time, "time_ns", lambda: real_ns() - 30 * 10**9)
        patched.setattr(time, "time", lambda: real() - 30)
        assert behind.tick()
    assert not right.tick(), "a claim stamped with a clock 30 s behind let the next interval open at once"
    assert swept == ["behind"]


def _runtime(tmp_path: Path, **settings: object) -> McpTasks:
    upgrade(Settings(data_dir=tmp_path).store_url)
    return McpTasks("in-worker", celery=Celery("in-worker"), settings=Settings(data_dir=tmp_path, **settings))


class _Consumer:
    """What `worker_ready` sends for a solo worker (nothing forks: the janitor sweeps in a thread)."""

    def __init__(self, app: Celery) -> None:
        self.app = app
        self.hostname = "celery@test"
        self.pool = solo.TaskPool()


def test_in_worker_mode_on_a_solo_pool_sweeps_in_process_from_worker_ready_to_shutdown(tmp_path: Path) -> None:
    tasks = _runtime(tmp_path, janitor="worker", janitor_interval_s=0.1)
    assert JANITOR_TASK not in (tasks.celery.conf.beat_schedule or {})
    assert JANITOR_TASK not in beat_schedule_at_init(tasks.celery)
    assert JANITOR_TASK in tasks.celery.tasks  # a sweep can still be run by hand
    consumer = _Consumer(tasks.celery)
    signals.worker_ready.send(sender=consumer)
    signals.worker_ready.send(sender=consumer)  # a consumer ready again (a reconnect): still one janitor
    try:
        ledger = internals(tasks).ledger()
        assert ledger is not None
        deadline = time.monotonic() + 10
        while (last := ledger.last()) is None or last.sweeps < 2:
            assert time.monotonic() < deadline, "no in-worker sweeps"
            time.sleep(0.05)
        assert last.claimed_by is not None and last.claimed_by.startswith("celery@test:")
    finally:
        signals.worker_shutdown.send(sender=consumer)
    threads = [t for t in threading.enumerate() if t.name == "celery-mcp-tasks-janitor"]
    assert threads == []


# -- a forking pool: the main process sends, a pool process claims and sweeps ----------------


class ReadyWorker(TestWorkController):
    """An in-process worker that announces `worker_ready` as `celery worker` does."""

    __test__ = False

    def on_consumer_ready(self, consumer: Any) -> None:
        super().on_consumer_ready(consumer)
        signals.worker_ready.send(sender=consumer)


@contextmanager
def running_worker(app: Celery, pool: str) -> Iterator[ReadyWorker]:
    """`celery.contrib.testing.worker.start_worker` without its logging setup (which would take over the root
    logger of the whole test process). As that helper does, it leaves the process as it found it: a prefork
    pool marks the process as one whose `result.get()` would block (`Never call result.get() within a task!`
    in every later test of this process)."""
    from celery.result import _set_task_join_will_block
    from celery.worker import state

    app.finalize()
    worker = ReadyWorker(
        app=app,
        concurrency=1,
        pool=pool,
        hostname="prefork-test@localhost",
        without_heartbeat=True,
        without_mingle=True,
        without_gossip=True,
    )
    thread = threading.Thread(target=worker.start, daemon=True)
    thread.start()
    worker.ensure_started()
    try:
        yield worker
    finally:
        state.should_terminate = 0
        thread.join(30)
        state.should_terminate = None
        _set_task_join_will_block(False)
    assert not thread.is_alive(), "the worker did not stop"


def test_with_a_forking_pool_the_main_process_only_sends_and_a_pool_process_claims_and_sweeps(
    ledger: SweepLedger, tmp_path: Path
) -> None:
    """The deadlock this prevents: a sweep (metrics and all) in a thread of the prefork main process held
    prometheus_client's multiprocess lock while billiard forked, and the new child hung on its first metric.

    Two senders (this worker's main process and another's) in one interval: every message is taken by a
    pool process, and one of them sweeps. Counted, not timed: the interval is long, the messages are known.
    """
    interval = 60.0
    reads = tmp_path / "ledger-reads"  # one line per janitor message a process handled: its pid

    def ledger_here() -> SweepLedger:
        with reads.open("a") as out:
            out.write(f"{os.getpid()}\n")
        return ledger

    def run_sweep() -> None:
        ledger.record(JANITOR, duration_ms=0, report={}, statuses={})

    def handled() -> list[int]:
        return [int(line) for line in reads.read_text().split()] if reads.exists() else []

    app = Celery(f"prefork-janitor-{time.monotonic_ns()}", broker="memory://", set_as_current=False)
    app.conf.task_default_queue = f"janitor-{time.monotonic_ns()}"
    app.conf.broker_transport_options = {"polling_interval": 0.01}  # the virtual transport's default is 1 s
    _receivers = install_janitor(app, run_sweep, interval, in_worker=True, ledger=ledger_here)  # weak: kept here
    second = JanitorMessages(app, Timer(), interval)  # another worker's main process, on the same queue
    with running_worker(app, "prefork"):
        second.start()  # its first message at once, as the worker's own
        second.send()
        deadline = time.monotonic() + 20
        while len(handled()) < 3:  # the worker's first, the other's first, and the one sent by hand
            assert time.monotonic() < deadline, f"the pool handled {len(handled())} of 3 janitor messages"
            time.sleep(0.05)
        last = ledger.last()
        second.stop()
    assert os.getpid() not in handled(), "the worker's main process touched the store"
    assert last is not None and last.claimed_by is not None  # "<node>:<pid>" of the pool process that claimed
    assert int(last.claimed_by.rsplit(":", 1)[1]) != os.getpid(), "claimed outside the pool"
    assert last.sweeps == 1  # one sweep in the interval, however many messages asked for it


def test_a_message_the_broker_refuses_is_one_log_line_and_the_next_interval_tries_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    app = Celery(f"refused-{time.monotonic_ns()}", broker="redis://127.0.0.1:1/0", set_as_current=False)
    app.conf.broker_connection_timeout = 0.2
    sent = JanitorMessages(app, Timer(), 60)
    with caplog.at_level(logging.WARNING, logger=JANITOR_LOGGER):
        started = time.monotonic()
        sent.send()
        sent.send()
    assert time.monotonic() - started < 10
    said = [r.getMessage() for r in caplog.records if r.name == JANITOR_LOGGER]
    assert len(said) == 2 and all(
        line.startswith("in-worker janitor: could not send this interval's sweep (") for line in said
    )


def test_a_janitor_message_goes_to_a_queue_this_worker_consumes() -> None:
    app = Celery(f"queues-{time.monotonic_ns()}", broker="memory://", set_as_current=False)
    app.conf.task_default_queue = "tools"
    messages = JanitorMessages(app, Timer(), 60)
    assert messages.queue() == "tools"
    app.amqp.queues.select(["only-this"])  # `celery worker -Q only-this`: the default queue is nobody's here
    assert messages.queue() == "only-this"


def test_starting_twice_keeps_one_sweep_thread_and_one_pair_of_timer_entries() -> None:
    clock = [0.0]
    janitor = InWorkerJanitor(lambda: None, lambda: DrivenLedger(clock), 60.0, "w", clock=lambda: clock[0])
    before = threading.active_count()
    janitor.start()
    janitor.start()
    try:
        assert threading.active_count() == before + 1
    finally:
        janitor.stop()
    timer = Timer()
    app = Celery(f"twice-{time.monotonic_ns()}", broker="memory://", set_as_current=False)
    messages = JanitorMessages(app, timer, 60)
    messages.start()
    messages.start()
    try:
        assert len(timer.queue) == 2, "a second start must not add entries that stop() could never cancel"
    finally:
        messages.stop()
        timer.stop()
    assert not messages.running
