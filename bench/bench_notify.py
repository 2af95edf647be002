"""Latency from a job's write to `notifications/tasks` at a listen stream, per transport.

    python bench/bench_notify.py [--samples 200] [--postgres URL] [--redis URL]

Each run starts a real web process (`celery-mcp-tasks serve bench.bench_notify`)
and writes from this process exactly as a worker does (`service.progress`,
with the transport's publisher), one write at a time, timing from just before
the write until its notification is read off the SSE stream. The baseline,
measured in the same run on the same PostgreSQL database, is row polling
(MCP_TASKS_NOTIFY=poll); the other transports are printed as ratios of it.
The embedded default (SQLite + filesystem broker, polling) always runs;
the others need PostgreSQL and Redis (default: MCP_TASKS_TEST_POSTGRES_URL
and MCP_TASKS_TEST_REDIS_URL). Targets (reported, not asserted): over Redis
or PostgreSQL p50 < 10 ms and p99 < 50 ms; embedded p99 < 300 ms.
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from celery_mcp_tasks import McpTasks  # noqa: E402
from celery_mcp_tasks.app import internals  # noqa: E402
from celery_mcp_tasks.config import Settings  # noqa: E402

# The app the web process serves (`celery-mcp-tasks serve bench.bench_notify`).
tasks = McpTasks("bench-notify")


@tasks.mcp_task
def noop() -> str:
    """Never dispatched: the benchmark writes the task's progress itself."""
    return "ok"


@dataclass
class Config:
    name: str
    target: str
    env: dict[str, str]


@dataclass
class Result:
    config: Config
    samples: list[float]  # milliseconds
    poll_query_ms: float | None = None

    def quantile(self, q: float) -> float:
        ordered = sorted(self.samples)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def measure(config: Config, samples: int, workdir: Path) -> Result:
    from celery_mcp_tasks.migrate import upgrade
    from tests.mcp.listen_client import ListenStream
    from tests.support import Backend, Deployment

    env = {**config.env, "MCP_TASKS_QUEUE": f"bench-{config.name}"}
    upgrade(Settings.from_env(env).store_url)
    deployment = Deployment("bench.bench_notify", Backend(config.name, env), workdir, queue=env["MCP_TASKS_QUEUE"])
    writer = McpTasks(f"bench-writer-{config.name}", settings=Settings.from_env(env))
    service = internals(writer).service()
    with ExitStack() as stack:
        stack.callback(deployment.stop)
        url = deployment.web(f"web-{config.name}")
        task_id, record = service.create(owner=None, tool="noop", arguments={}, dispatch=False)
        stream = ListenStream(url, {"taskIds": [task_id]})
        stack.callback(stream.close)
        stream.ack()
        latencies: list[float] = []
        for n in range(samples + 10):
            # Spread over more than a poll tick, so writes do not fall into step with the poller.
            time.sleep(random.uniform(0.005, 0.13))
            message = f"bench {n}"
            started = time.perf_counter()
            service.progress(record.key, message)
            while True:
                got = stream.task(timeout=30)
                if got.get("statusMessage") == message:
                    break
            if n >= 10:  # the first ones warm pools and caches
                latencies.append((time.perf_counter() - started) * 1000)
        result = Result(config, latencies)
        if env.get("MCP_TASKS_NOTIFY") == "poll" or config.name == "embedded":
            keys = [record.key]
            began = time.perf_counter()
            for _ in range(50):
                service.versions(keys)
            result.poll_query_ms = (time.perf_counter() - began) * 1000 / 50
    service.store.dispose()  # type: ignore[attr-defined]
    return result


def configs(postgres: str | None, redis: str | None, workdir: Path) -> list[Config]:
    found = [Config("embedded", "p99 < 300 ms", {"MCP_TASKS_DATA_DIR": str(workdir / "embedded")})]
    if postgres and redis:
        base = {
            "MCP_TASKS_DATABASE_URL": postgres,
            "CELERY_BROKER_URL": redis,
            "MCP_TASKS_DATA_DIR": str(workdir / "server"),
        }
        found = [
            Config("poll-pg", "baseline", {**base, "MCP_TASKS_NOTIFY": "poll"}),
            Config("postgres", "p50 < 10, p99 < 50 ms", {**base, "MCP_TASKS_NOTIFY": "postgres"}),
            Config("broker-redis", "p50 < 10, p99 < 50 ms", {**base, "MCP_TASKS_NOTIFY": "broker"}),
            *found,
        ]
    return found


def report(results: list[Result]) -> None:
    baseline = next((r for r in results if r.config.name == "poll-pg"), None)
    print(f"{'transport':<14}{'p50 ms':>9}{'p99 ms':>9}{'mean ms':>9}{'p50 x':>8}{'p99 x':>8}  target")
    for result in results:
        p50, p99 = result.quantile(0.5), result.quantile(0.99)
        ratios = "       -       -"
        if baseline is not None:
            ratios = f"{p50 / baseline.quantile(0.5):>8.3f}{p99 / baseline.quantile(0.99):>8.3f}"
        print(
            f"{result.config.name:<14}{p50:>9.2f}{p99:>9.2f}{statistics.fmean(result.samples):>9.2f}{ratios}"
            f"  {result.config.target}"
        )
    for result in results:
        if result.poll_query_ms is not None:
            print(f"row-poll query cost ({result.config.name}): {result.poll_query_ms:.3f} ms per 100 ms tick")
    print(f"({len(results[0].samples)} samples each; ratio = transport / polling the same PostgreSQL rows)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--postgres", default=os.environ.get("MCP_TASKS_TEST_POSTGRES_URL"))
    parser.add_argument("--redis", default=os.environ.get("MCP_TASKS_TEST_REDIS_URL"))
    args = parser.parse_args()
    for noisy in ("httpx", "alembic"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    from tests.support import fresh_postgres_database

    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        workdir = Path(tmp)
        postgres = stack.enter_context(fresh_postgres_database(args.postgres)) if args.postgres else None
        results = [measure(config, args.samples, workdir) for config in configs(postgres, args.redis, workdir)]
    report(results)


if __name__ == "__main__":
    main()
