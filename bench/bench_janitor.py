"""The janitor's eviction on PostgreSQL: 1M expired rows removed in batches while writers keep working.

    MCP_TASKS_TEST_POSTGRES_URL=postgresql://postgres@127.0.0.1/test python bench/bench_janitor.py

Prints the eviction time (target < 60 s) and the writers' longest single write
during eviction (target < 100 ms) next to their longest write in the same
run without the janitor. The janitor sweeps from its own process, as in a
Celery worker. Options: BENCH_ROWS (1000000), BENCH_BATCH (the sweep's
default), BENCH_WRITERS (4), BENCH_DEBUG=1 (print every write over 50 ms, to
line stalls up with PostgreSQL's checkpoint log).
"""

from __future__ import annotations

import inspect
import multiprocessing
import os
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import sqlalchemy as sa

from celery_mcp_tasks.config import Settings
from celery_mcp_tasks.migrate import upgrade
from celery_mcp_tasks.model import now_ms
from celery_mcp_tasks.service import TaskService
from celery_mcp_tasks.store.sql import SqlStore
from celery_mcp_tasks.worker.janitor import sweep
from tests.support import POSTGRES_URL, fresh_postgres_database

ROWS = int(os.environ.get("BENCH_ROWS", "1000000"))
BATCH = int(os.environ.get("BENCH_BATCH", str(inspect.signature(sweep).parameters["batch_size"].default)))
WRITERS = int(os.environ.get("BENCH_WRITERS", "4"))

# Expired an hour ago, final, in the package's own table: what a busy day leaves behind.
FILL = """
INSERT INTO mcp_tasks_task (key, owner, tool, status, status_message, created_at, updated_at, ttl_ms, expires_at,
    poll_interval_ms, arguments, input_requests, input_responses, issued_keys, result, error, version, dispatches,
    heartbeat_at, attempt, resends, parked)
SELECT encode(sha256(('expired-' || n)::bytea), 'hex'), 'sub:bench', 'bench', 'completed', NULL,
    :old, :old, 1000, :old + 1000, 1000, '{"n": 1}', '{}', '{}', '[]',
    '{"content": [{"type": "text", "text": "done"}], "isError": false}', NULL, 3, 1, :old, 0, 0, false
FROM generate_series(1, :rows) AS n
"""


class Writers:
    """Threads that create, advance and finish tasks as a busy web process and its workers would."""

    def __init__(self, service: TaskService, count: int) -> None:
        self.service = service
        self.latencies: list[float] = []
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._run, daemon=True) for _ in range(count)]

    def _timed(self, op: object) -> None:
        start = time.perf_counter()
        op()  # type: ignore[operator]
        elapsed = time.perf_counter() - start
        with self.lock:
            self.latencies.append(elapsed)
            if elapsed > 0.05 and os.environ.get("BENCH_DEBUG"):
                print(
                    f"    stall {elapsed * 1e3:.0f} ms at {time.strftime('%H:%M:%S')} in {getattr(op, '__name__', op)}"
                )

    def _run(self) -> None:
        holder: dict[str, str] = {}  # the current round's task (each create replaces it)
        while not self.stop.is_set():

            def create() -> None:
                holder["key"] = self.service.create(owner="sub:live", tool="bench", arguments={}, dispatch=False)[1].key

            self._timed(create)
            self._timed(lambda: self.service.progress(holder["key"], "half way"))
            self._timed(lambda: self.service.complete(holder["key"], {"content": []}))

    def run_for(self, seconds: float | None = None, *, until: threading.Event | None = None) -> list[float]:
        self.latencies = []
        self.stop.clear()
        self.threads = [threading.Thread(target=self._run, daemon=True) for _ in self.threads]
        for thread in self.threads:
            thread.start()
        if until is not None:
            until.wait()
        else:
            time.sleep(seconds or 0)
        self.stop.set()
        for thread in self.threads:
            thread.join()
        return self.latencies


def evict_all(url: str) -> dict[str, float]:
    """One janitor sweep in a fresh process (as a Celery worker would run it)."""
    store = SqlStore.from_url(url)
    try:
        begin = time.perf_counter()
        removed = sweep(TaskService(store), Settings(), batch_size=BATCH).removed
        return {"removed": removed, "seconds": time.perf_counter() - begin}
    finally:
        store.dispose()


def describe(label: str, latencies: list[float]) -> str:
    ordered = sorted(latencies)
    p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
    return (
        f"  {label:<28} {len(ordered):6d} writes  p50 {statistics.median(ordered) * 1e3:6.2f} ms  "
        f"p99 {p99 * 1e3:6.2f} ms  max {ordered[-1] * 1e3:7.2f} ms"
    )


def main() -> None:
    if not POSTGRES_URL:
        raise SystemExit("set MCP_TASKS_TEST_POSTGRES_URL (e.g. postgresql://postgres@127.0.0.1/test)")
    with fresh_postgres_database(POSTGRES_URL) as url:
        upgrade(url)
        store = SqlStore.from_url(url)
        service = TaskService(store, max_rows=None)
        started = time.perf_counter()
        with store.engine.begin() as conn:
            conn.execute(sa.text(FILL), {"old": now_ms() - 3_600_000, "rows": ROWS})
        with store.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(sa.text("VACUUM ANALYZE mcp_tasks_task"))
            conn.execute(sa.text("CHECKPOINT"))  # the fill's own WAL must not checkpoint during the measurement
        print(
            f"PostgreSQL: {ROWS} expired rows inserted in {time.perf_counter() - started:.1f} s; "
            f"batch {BATCH}, {WRITERS} writer threads"
        )

        baseline = Writers(service, WRITERS).run_for(5.0)

        # The janitor runs in a worker process in production: give it its own process here too.
        done = threading.Event()
        report: dict[str, float] = {}

        def evict() -> None:
            with multiprocessing.get_context("spawn").Pool(1) as pool:
                report.update(pool.apply(evict_all, (url,)))
            done.set()

        janitor = threading.Thread(target=evict)
        janitor.start()
        during = Writers(service, WRITERS).run_for(until=done)
        janitor.join()

        seconds = report["seconds"]
        print(
            f"  evicted {int(report['removed'])} rows in {seconds:.1f} s ({report['removed'] / seconds:,.0f} rows/s)"
            f"  target < 60 s"
        )
        print(describe("writers, janitor idle", baseline))
        print(describe("writers, janitor evicting", during))
        print(
            f"  max writer stall during eviction {max(during) * 1e3:.1f} ms (target < 100 ms); "
            f"ratio of max to idle max {max(during) / max(baseline):.2f}x"
        )
        store.dispose()


if __name__ == "__main__":
    main()
