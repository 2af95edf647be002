"""Task creation over HTTP: tools/call -> CreateTaskResult, against a baseline measured
in the same run on the same server: a plain tool that only sends the Celery message.

    python bench/bench_create.py            # PostgreSQL + Redis when the test URLs are set, else embedded
Target: our p50 within 1.5x of the baseline's.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.support import POSTGRES_URL, REDIS_URL, Backend, Deployment, McpHttp, fresh_postgres_database

ROUNDS = int(os.environ.get("BENCH_ROUNDS", "300"))


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def measure(backend: Backend) -> None:
    with tempfile.TemporaryDirectory() as logs:
        deployment = Deployment("bench.create_app", backend, Path(logs))
        try:
            deployment.web(MCP_TASKS_MAX_ROWS="none")
            http = McpHttp(deployment.url)
            ours: list[float] = []
            base: list[float] = []
            for n in range(20):  # warm up both paths (pools, imports, broker connection)
                http.call_tool("noop", {"n": n})
                http.call_tool("enqueue_only", {"n": n})
            for n in range(ROUNDS):  # interleaved, so machine noise hits both alike
                start = time.perf_counter()
                reply = http.call_tool("noop", {"n": n})
                ours.append(time.perf_counter() - start)
                assert reply["result"]["resultType"] == "task", reply
                start = time.perf_counter()
                reply = http.call_tool("enqueue_only", {"n": n})
                base.append(time.perf_counter() - start)
                assert reply["result"]["content"][0]["text"] == "sent", reply
            http.close()
        finally:
            deployment.stop()
    p50_ours, p50_base = statistics.median(ours), statistics.median(base)
    print(f"[{backend.name}] {ROUNDS} calls each")
    print(f"  baseline (send only)  p50 {p50_base * 1e3:6.2f} ms  p99 {percentile(base, 0.99) * 1e3:6.2f} ms")
    print(f"  task creation         p50 {p50_ours * 1e3:6.2f} ms  p99 {percentile(ours, 0.99) * 1e3:6.2f} ms")
    print(f"  ratio p50 {p50_ours / p50_base:.2f}x (target <= 1.5x)")


def main() -> None:
    with tempfile.TemporaryDirectory() as data:
        measure(Backend("embedded", {"MCP_TASKS_DATA_DIR": data}))
    if POSTGRES_URL and REDIS_URL:
        with fresh_postgres_database(POSTGRES_URL) as url:
            measure(Backend("pg_redis", {"MCP_TASKS_DATABASE_URL": url, "CELERY_BROKER_URL": REDIS_URL}))


if __name__ == "__main__":
    main()
