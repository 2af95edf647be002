"""One heartbeat thread per worker process beats every running job; none is started per job."""

from __future__ import annotations

import logging
import multiprocessing
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack

import pytest

from celery_mcp_tasks.worker.heartbeats import Heartbeats

INTERVAL = 0.01


def _until(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def _beat_threads() -> int:
    return sum(thread.name == "mcp-task-heartbeat" for thread in threading.enumerate())


class Counter:
    def __init__(self, answer: bool = True) -> None:
        self.beats = 0
        self.answer = answer

    def __call__(self) -> bool:
        self.beats += 1
        return self.answer


def test_one_thread_beats_every_running_job_and_stays_for_the_next() -> None:
    before = _beat_threads()
    registry = Heartbeats()
    jobs = [Counter() for _ in range(20)]
    with ExitStack() as stack:
        for job in jobs:
            stack.enter_context(registry.running(job, INTERVAL))
        _until(lambda: all(job.beats >= 3 for job in jobs))
        assert _beat_threads() == before + 1
        assert registry.running_jobs == 20
    assert registry.running_jobs == 0
    with registry.running(Counter(), INTERVAL):  # the next job: the same thread, none started
        assert _beat_threads() == before + 1


def test_a_job_that_ended_is_beaten_no_more() -> None:
    registry = Heartbeats()
    ended, running = Counter(), Counter()
    with registry.running(running, INTERVAL):
        with registry.running(ended, INTERVAL):
            _until(lambda: ended.beats >= 1)
        stopped_at = ended.beats
        _until(lambda: running.beats >= stopped_at + 5)
    assert ended.beats <= stopped_at + 1  # at most the beat already under way


def test_a_beat_that_answers_false_ends_that_jobs_beats_only() -> None:
    registry = Heartbeats()
    final, alive = Counter(answer=False), Counter()
    with registry.running(final, INTERVAL), registry.running(alive, INTERVAL):
        _until(lambda: alive.beats >= 5)
        assert final.beats == 1
        assert registry.running_jobs == 1


def test_a_beat_that_raises_is_logged_and_tried_again(caplog: pytest.LogCaptureFixture) -> None:
    registry = Heartbeats()
    calls = []

    def failing() -> bool:
        calls.append(1)
        raise OSError("the database is down")

    with caplog.at_level(logging.WARNING, logger="celery_mcp_tasks.worker"), registry.running(failing, INTERVAL):
        _until(lambda: len(calls) >= 3)
    assert "task heartbeat failed" in caplog.text


def test_the_first_beat_comes_one_interval_after_the_start() -> None:
    registry = Heartbeats()
    job = Counter()
    with registry.running(job, 60.0):
        time.sleep(0.05)
        assert job.beats == 0


def _in_child(registry: Heartbeats, results: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    job = Counter()
    with registry.running(job, INTERVAL):
        deadline = time.monotonic() + 5
        while job.beats < 3 and time.monotonic() < deadline:
            time.sleep(0.005)
    results.put(job.beats)


def test_a_forked_child_beats_with_a_thread_of_its_own() -> None:
    registry = Heartbeats()
    with registry.running(Counter(), INTERVAL):  # the parent's thread exists (and may hold the lock) at the fork
        context = multiprocessing.get_context("fork")
        results = context.Queue()
        child = context.Process(target=_in_child, args=(registry, results))
        child.start()
        child.join(10)
    assert results.get(timeout=1) >= 3


def test_job_after_job_wakes_the_thread_no_more(monkeypatch: pytest.MonkeyPatch) -> None:
    """A prefork child runs short job after short job: none may cost a thread wake-up (a context switch)."""
    registry = Heartbeats()
    with registry.running(Counter(), 0.5):
        _until(lambda: registry._wake_at is not None)  # the first job starts the thread, which takes a look
    wakes = []
    monkeypatch.setattr(registry._changed, "notify", lambda *_: wakes.append(1))
    for _ in range(50):
        with registry.running(Counter(), 0.5):
            pass
    assert wakes == []
    sooner = Counter()
    with registry.running(sooner, INTERVAL):  # due before the thread would look on its own: woken
        assert wakes == [1]


def test_a_hurried_job_beats_now_then_at_its_pace() -> None:
    registry = Heartbeats()
    job = Counter()
    beating = registry.add(job, 60.0)
    time.sleep(0.05)
    assert job.beats == 0  # due in a minute
    registry.hurry(beating)
    _until(lambda: job.beats == 1)
    time.sleep(0.05)
    assert job.beats == 1  # the next one a minute later


def test_a_store_outage_is_one_line_not_one_a_beat_nor_a_traceback_and_its_end_one_more(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Every running job beats: a line a beat was a line per job every few seconds for the whole outage."""
    from celery_mcp_tasks.store.base import StoreUnavailable

    registry = Heartbeats()
    calls = []

    def unreachable() -> bool:
        calls.append(1)
        if len(calls) > 3:
            return True  # the store is back
        try:
            raise ConnectionRefusedError("connection refused")
        except ConnectionRefusedError as exc:
            raise StoreUnavailable("the task store is unavailable") from exc

    with caplog.at_level(logging.INFO, logger="celery_mcp_tasks.worker"), registry.running(unreachable, INTERVAL):
        _until(lambda: len(calls) >= 5)
    said = [(r.levelno, r.getMessage()) for r in caplog.records if "heartbeat" in r.getMessage()]
    assert not [r for r in caplog.records if r.exc_info]
    assert said == [
        (logging.WARNING, "task heartbeat failed (ConnectionRefusedError); will retry"),
        (logging.INFO, "task heartbeats reach the task store again"),
    ]


def test_an_outage_that_outlived_the_jobs_beating_through_it_is_reported_again_for_the_next(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The warning is said once an outage: a job that ended before any beat got through must not leave the
    next outage, hours later, said at DEBUG only."""
    from celery_mcp_tasks.store.base import StoreUnavailable

    registry = Heartbeats()
    calls: list[int] = []

    def unreachable() -> bool:
        calls.append(1)
        raise StoreUnavailable("the task store is unavailable")

    with caplog.at_level(logging.WARNING, logger="celery_mcp_tasks.worker"):
        for want in (2, 4):
            with registry.running(unreachable, INTERVAL):
                _until(lambda want=want: len(calls) >= want)  # type: ignore[misc]
    assert [r.getMessage() for r in caplog.records if "heartbeat" in r.getMessage()] == [
        "task heartbeat failed (StoreUnavailable); will retry"
    ] * 2


def test_a_job_that_starts_while_the_last_jobs_failed_beat_is_being_said_hears_of_the_outage_itself(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The interleaving that made the test above flaky, forced: the next job starts (and forgets the old
    outage) after the beat thread chose DEBUG for the last job's failed beat, before it noted the failure."""
    from celery_mcp_tasks.store.base import StoreUnavailable

    registry = Heartbeats()
    first, second = ExitStack(), ExitStack()
    calls: list[str] = []
    started: list[str] = []

    def unreachable(name: str) -> Callable[[], bool]:
        def beat() -> bool:
            calls.append(name)
            raise StoreUnavailable("the task store is unavailable")

        return beat

    class NextJobStarts(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.levelno == logging.DEBUG and "heartbeat" in record.getMessage() and not started:
                started.append("second")
                first.close()  # in the beat thread, while it says the first job's second failure
                second.enter_context(registry.running(unreachable("second"), INTERVAL))

    worker_log = logging.getLogger("celery_mcp_tasks.worker")
    handler = NextJobStarts(logging.DEBUG)
    worker_log.addHandler(handler)
    try:
        with caplog.at_level(logging.DEBUG, logger="celery_mcp_tasks.worker"):
            first.enter_context(registry.running(unreachable("first"), INTERVAL))
            _until(lambda: calls.count("second") >= 2)
            second.close()
    finally:
        worker_log.removeHandler(handler)
        first.close()
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and "heartbeat" in r.getMessage()]
    assert warned == ["task heartbeat failed (StoreUnavailable); will retry"] * 2
