"""A no-op `@mcp_task` job end to end against the same no-op as a plain Celery task, in the same run.

    python bench/bench_job_overhead.py     # embedded, and PostgreSQL + Redis when the test URLs are set

Ours: `TaskService.create` (row insert, then the Celery message) until the row
reads `completed`. Plain: `apply_async` until `AsyncResult.get` sees SUCCESS
in Celery's database result backend on the same database. Both poll every
millisecond, against one prefork worker (-c 2). Printed: sequential latency
p50 and a burst's per-job time, each as a ratio to the plain task (target
<= 1.5x). BENCH_ROUNDS (200) and BENCH_BURST (300) size the runs.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

ROUNDS = int(os.environ.get("BENCH_ROUNDS", "200"))
BURST = int(os.environ.get("BENCH_BURST", "300"))
POLL_S = 0.001


def _wait(done: Any, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            raise TimeoutError("the worker did not finish in time")
        time.sleep(POLL_S)


def measure() -> dict[str, Any]:
    """Runs in a child process whose environment selects the backend (see `main`)."""
    import sqlalchemy as sa

    from bench import job_app
    from celery_mcp_tasks.migrate import upgrade
    from celery_mcp_tasks.store.schema import tasks as task_table
    from tests.support import Backend, start_worker

    upgrade(job_app.tasks.settings.store_url)
    job_app.celery.backend.ResultSession().close()  # creates Celery's result tables before the worker races to
    service = job_app.tasks.service()
    backend = Backend(os.environ["BENCH_BACKEND"], json.loads(os.environ["BENCH_ENV"]))
    with tempfile.TemporaryDirectory() as logs:
        worker = start_worker(
            "bench.job_app", backend, Path(logs), concurrency=2, **json.loads(os.environ["BENCH_EXTRA"])
        )
        try:

            def ours() -> None:
                _, record = service.create(owner=None, tool="noop", arguments={})
                _wait(lambda: service.status(record.key).terminal)

            def plain() -> None:
                job_app.plain_noop.apply_async().get(interval=POLL_S, timeout=60)

            for _ in range(20):  # warm up pools, imports and the broker connection on both paths
                ours()
                plain()
            latency: dict[str, list[float]] = {"ours": [], "plain": []}
            for _ in range(ROUNDS):  # interleaved: machine noise hits both alike
                for name, run in (("ours", ours), ("plain", plain)):
                    start = time.perf_counter()
                    run()
                    latency[name].append(time.perf_counter() - start)

            burst: dict[str, list[float]] = {"ours": [], "plain": []}
            engine = service.store.engine
            meta = sa.table("celery_taskmeta", sa.column("task_id"), sa.column("status"))

            def count(query: Any) -> int:
                with engine.connect() as conn:
                    return conn.execute(query).scalar_one()

            for _ in range(2):
                start = time.perf_counter()
                keys = [service.create(owner=None, tool="noop", arguments={})[1].key for _ in range(BURST)]
                done = sa.select(sa.func.count()).where(task_table.c.key.in_(keys), task_table.c.status == "completed")
                _wait(lambda done=done: count(done) == BURST)
                burst["ours"].append((time.perf_counter() - start) / BURST)

                start = time.perf_counter()
                ids = [job_app.plain_noop.apply_async().id for _ in range(BURST)]
                done = sa.select(sa.func.count()).where(meta.c.task_id.in_(ids), meta.c.status == "SUCCESS")
                _wait(lambda done=done: count(done) == BURST)
                burst["plain"].append((time.perf_counter() - start) / BURST)
        finally:
            worker.stop()
    return {"latency": latency, "burst": burst}


def report(name: str, result: dict[str, Any]) -> None:
    lat, burst = result["latency"], result["burst"]
    p50 = {k: statistics.median(v) for k, v in lat.items()}
    per_job = {k: min(v) for k, v in burst.items()}
    print(f"[{name}] {ROUNDS} sequential jobs each, then bursts of {BURST}")
    print(
        f"  latency p50   plain {p50['plain'] * 1e3:7.2f} ms   @mcp_task {p50['ours'] * 1e3:7.2f} ms   "
        f"ratio {p50['ours'] / p50['plain']:.2f}x (target <= 1.5x)"
    )
    print(
        f"  burst per job plain {per_job['plain'] * 1e3:7.2f} ms   @mcp_task {per_job['ours'] * 1e3:7.2f} ms   "
        f"ratio {per_job['ours'] / per_job['plain']:.2f}x (target <= 1.5x)"
    )


def run_backend(name: str, env: dict[str, str]) -> None:
    extra = {"MCP_TASKS_QUEUE": f"bench-{uuid.uuid4().hex[:8]}", "MCP_TASKS_MAX_ROWS": "none"}
    child_env = {k: v for k, v in os.environ.items() if not k.startswith(("MCP_TASKS_", "CELERY_"))}
    child_env.update(
        env, **extra, BENCH_BACKEND=name, BENCH_ENV=json.dumps(env), BENCH_EXTRA=json.dumps(extra), PYTHONPATH=str(ROOT)
    )
    out = subprocess.run(
        [sys.executable, __file__, "--measure"], env=child_env, cwd=ROOT, check=True, capture_output=True, text=True
    )
    report(name, json.loads(out.stdout.strip().splitlines()[-1]))


def main() -> None:
    if sys.argv[1:] == ["--measure"]:
        print(json.dumps(measure()))
        return
    from tests.support import POSTGRES_URL, REDIS_URL, fresh_postgres_database

    with tempfile.TemporaryDirectory() as data:
        run_backend("embedded", {"MCP_TASKS_DATA_DIR": data})
    if POSTGRES_URL and REDIS_URL:
        with fresh_postgres_database(POSTGRES_URL) as url:
            run_backend("pg_redis", {"MCP_TASKS_DATABASE_URL": url, "CELERY_BROKER_URL": REDIS_URL})


if __name__ == "__main__":
    main()
