"""The in-worker janitor (MCP_TASKS_JANITOR=worker): many workers, one sweep per interval, a loop that never stops.

Threads on a real SQLite ledger here; real worker processes in tests/integration/test_janitor_ops.py.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

import pytest
from celery import Celery, signals

from celery_mcp_tasks import McpTasks, Settings
from celery_mcp_tasks.migrate import upgrade
from celery_mcp_tasks.model import now_ms
from celery_mcp_tasks.store.sql import SqlStore
from celery_mcp_tasks.store.sweeps import JANITOR, SweepLedger, ledger_for
from celery_mcp_tasks.worker.beat import JANITOR_TASK, InWorkerJanitor
from tests.worker.test_beat import beat_schedule_at_init


@pytest.fixture
def ledger(tmp_path: Path):  # type: ignore[no-untyped-def]
    url = f"sqlite:///{tmp_path / 'tasks.db'}"
    upgrade(url)
    store = SqlStore.from_url(url)
    yield ledger_for(store)
    store.dispose()


def recording(ledger: SweepLedger, who: str, swept: list[str]):  # type: ignore[no-untyped-def]
    lock = threading.Lock()

    def run_sweep() -> None:
        with lock:
            swept.append(who)
        ledger.record(JANITOR, at_ms=now_ms(), duration_ms=0, report={}, statuses={})

    return run_sweep


def test_three_workers_sweep_once_per_interval_between_them(ledger: SweepLedger) -> None:
    interval = 0.25
    swept: list[str] = []
    janitors = [InWorkerJanitor(recording(ledger, f"w{n}", swept), lambda: ledger, interval, f"w{n}") for n in range(3)]
    for janitor in janitors:
        janitor.start()
    time.sleep(interval * 8 + interval / 2)
    for janitor in janitors:
        janitor.stop()
    assert not any(janitor.running for janitor in janitors)
    last = ledger.last()
    assert last is not None and last.sweeps == len(swept)
    assert 7 <= len(swept) <= 10, swept  # about one per interval (9 ticks), not three


def test_a_failing_sweep_is_a_log_line_and_the_loop_goes_on(
    ledger: SweepLedger, caplog: pytest.LogCaptureFixture
) -> None:
    calls: list[int] = []

    def flaky() -> None:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("store down")

    janitor = InWorkerJanitor(flaky, lambda: ledger, 0.1, "w")
    with caplog.at_level(logging.WARNING, logger="celery_mcp_tasks.janitor"):
        janitor.start()
        time.sleep(0.45)
        janitor.stop()
    assert len(calls) >= 3
    assert [r.getMessage() for r in caplog.records] == [
        "in-worker janitor: the sweep failed (RuntimeError); trying again next interval"
    ]


def test_a_tick_that_loses_the_claim_does_not_sweep(ledger: SweepLedger) -> None:
    swept: list[str] = []
    first = InWorkerJanitor(recording(ledger, "a", swept), lambda: ledger, 60, "a")
    second = InWorkerJanitor(recording(ledger, "b", swept), lambda: ledger, 60, "b")
    assert first.tick() and not second.tick()
    assert swept == ["a"]
    assert ledger.last().claimed_by == "a"  # type: ignore[union-attr]


def _runtime(tmp_path: Path, **settings: object) -> McpTasks:
    upgrade(Settings(data_dir=tmp_path).store_url)
    return McpTasks("in-worker", celery=Celery("in-worker"), settings=Settings(data_dir=tmp_path, **settings))


class _Consumer:
    def __init__(self, app: Celery) -> None:
        self.app = app
        self.hostname = "celery@test"


def test_in_worker_mode_installs_no_beat_entry_and_sweeps_from_worker_ready_to_shutdown(tmp_path: Path) -> None:
    tasks = _runtime(tmp_path, janitor="worker", janitor_interval_s=0.1)
    assert JANITOR_TASK not in (tasks.celery.conf.beat_schedule or {})
    assert JANITOR_TASK not in beat_schedule_at_init(tasks.celery)
    assert JANITOR_TASK in tasks.celery.tasks  # a sweep can still be run by hand
    consumer = _Consumer(tasks.celery)
    signals.worker_ready.send(sender=consumer)
    signals.worker_ready.send(sender=consumer)  # a consumer ready again (a reconnect): still one janitor
    try:
        ledger = tasks.ledger()
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
