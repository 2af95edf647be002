"""`ctx.cancelled()` in a job's tight loop against one store read, measured in the same run.

    python bench/bench_cancel_check.py     # SQLite, and PostgreSQL when MCP_TASKS_TEST_POSTGRES_URL is set

A cooperative job calls `ctx.cancelled()` in its inner loop, so the call must cost
next to nothing: it reads the store at most once per `cancel_check_interval` and
answers from memory otherwise. Printed: calls per second, the store reads they
caused, and the cost of one call as a fraction of one store read (target: a call
costs < 1% of a read). The contract itself (one read per interval) is tested
deterministically in tests/worker/test_run_guards.py. BENCH_SECONDS (1) sizes each loop.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from celery_mcp_tasks.migrate import upgrade
from celery_mcp_tasks.model import Run
from celery_mcp_tasks.service import TaskService
from celery_mcp_tasks.store.sql import SqlStore
from tests.support import POSTGRES_URL, fresh_postgres_database

SECONDS = float(os.environ.get("BENCH_SECONDS", "1"))


class CountingStore(SqlStore):
    reads = 0

    def get(self, key: str, owner: Any = None) -> Any:  # type: ignore[override]
        CountingStore.reads += 1
        return super().get(key) if owner is None else super().get(key, owner)


def calls_per_second(call: Any) -> tuple[float, int]:
    calls, deadline = 0, time.perf_counter() + SECONDS
    started = time.perf_counter()
    while time.perf_counter() < deadline:
        call()
        calls += 1
    return calls / (time.perf_counter() - started), calls


def measure(name: str, url: str) -> None:
    from celery_mcp_tasks.worker.context import TaskContext

    upgrade(url)
    store = CountingStore.from_url(url)
    try:
        service = TaskService(store)
        _, record = service.create(owner=None, tool="t", arguments={}, dispatch=False)
        ctx = TaskContext(service, record.key, record=record, run=Run(record.dispatches))
        for _ in range(200):  # warm up the pool and the statement cache
            service.record(record.key)
        reads_per_s, _ = calls_per_second(lambda: service.record(record.key))
        CountingStore.reads = 0
        checks_per_s, checks = calls_per_second(ctx.cancelled)
        share = reads_per_s / checks_per_s
        print(f"[{name}] {SECONDS:g} s per loop")
        print(f"  store read        {reads_per_s:12,.0f} /s")
        print(f"  ctx.cancelled()   {checks_per_s:12,.0f} /s  ({checks:,} calls, {CountingStore.reads} store reads)")
        print(f"  one call costs {share:.2%} of one store read (target < 1%)")
    finally:
        store.dispose()


def main() -> None:
    with tempfile.TemporaryDirectory() as data:
        measure("sqlite", f"sqlite:///{data}/tasks.db")
    if POSTGRES_URL:
        with fresh_postgres_database(POSTGRES_URL) as url:
            measure("postgresql", url)


if __name__ == "__main__":
    main()
