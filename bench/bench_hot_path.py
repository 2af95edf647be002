"""The hot path against its durable floor, measured in one run on PostgreSQL + Redis (issue 12).

    python bench/bench_hot_path.py [--profile] [--no-peer] [--scale | --scale-only] [--rows 1000,100000] [--streams 2000]

Needs MCP_TASKS_TEST_POSTGRES_URL and MCP_TASKS_TEST_REDIS_URL (a fresh database is made
and dropped). One `celery-mcp-tasks serve bench.hot_path_app` process serves every path,
so the HTTP stack, the SDK's dispatch and the process are the same for all of them:

- floor: a plain SDK tool doing one committed INSERT of a task-shaped row plus the same
  `send_task` a task's job gets (bench/hot_path_app.py); the reference of the ratios;
- task creation (`tools/call` -> CreateTaskResult), 1 and N clients, no worker running
  (the messages wait in Redis and are purged), so only creation is measured;
- completion: a no-op job followed as a listening client does (`tools/call`, then
  `subscriptions/listen` with its id, one `tasks/get` once acknowledged, then the
  `completed` notification), one prefork worker (-c 2) running;
- the synchronous path: the no-op task tool called without the extension (2026-07-28
  without it in `_meta`, and an earlier-era `initialize` session);
- `tasks/get` against a bare `tools/list`, N clients;
- the peer: fastmcp-tasks from the registry in its own cached venv (bench/hot_path_peer_venv.py),
  its own server process on the same Redis, its worker inside it (Docket), creation measured
  the same way, interleaved with ours.

Clients are closed-loop (one request in flight each), threads with their own connection.
1 client: the paths take turns call by call (BENCH_WARMUP (30) calls each first, then
BENCH_ROUNDS (200) each, the order rotated every round), so drift on a shared machine hits
them alike; ops/s there is 1 / mean latency. BENCH_CLIENTS (8) clients: each path in turn
for a BENCH_SECONDS (4) window after BENCH_WARM_S (1), the order rotated every run.
BENCH_RUNS (3) runs; shown: the median of the runs (ratios taken within a run, then the
median) and the range of the runs' ratios. Completion and the synchronous path run with a
worker (BENCH_WORKER_POOL prefork, BENCH_WORKER_CONCURRENCY 2), interleaved with the floor,
their reference. `--profile` adds where a creation's time goes; `--scale` adds `tasks/get`
at each row count and N open listen streams on one web process.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.hot_path_harness import (  # noqa: E402
    Completion,
    Factory,
    Sample,
    completion,
    interleaved,
    is_task,
    legacy_call,
    many_clients,
    one_client,
    rpc_call,
    says,
    task_get,
    tool_call,
)
from bench.hot_path_peer_venv import Peer, PeerUnavailable, peer_python, stack_name  # noqa: E402
from tests.support import POSTGRES_URL, REDIS_URL, Backend, Deployment, McpHttp, fresh_postgres_database  # noqa: E402

ROUNDS = int(os.environ.get("BENCH_ROUNDS", "200"))
RUNS = int(os.environ.get("BENCH_RUNS", "3"))
SECONDS = float(os.environ.get("BENCH_SECONDS", "4"))
WARM_S = float(os.environ.get("BENCH_WARM_S", "1"))
WARMUP = int(os.environ.get("BENCH_WARMUP", "30"))
CLIENTS = int(os.environ.get("BENCH_CLIENTS", "8"))
POOL = os.environ.get("BENCH_WORKER_POOL", "prefork")
CONCURRENCY = int(os.environ.get("BENCH_WORKER_CONCURRENCY", "2"))
PEER_VERSION = os.environ.get("BENCH_PEER_VERSION", "4.1.4")
APP = "bench.hot_path_app"
_T = TypeVar("_T")


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


# -- the table -----------------------------------------------------------------------------


@dataclass
class Row:
    what: str
    clients: int | str
    key: str | None  # the figure (None: n/a)
    ref: str | None  # the figure it is a ratio of
    ref_label: str = "floor"
    note: str = ""


@dataclass
class Figures:
    runs: dict[str, list[Sample]] = field(default_factory=dict)

    def add(self, key: str, sample: Sample) -> None:
        self.runs.setdefault(key, []).append(sample)

    def p50(self, key: str) -> float:
        return statistics.median(s.p50_ms for s in self.runs[key])

    def ops(self, key: str) -> float:
        return statistics.median(s.ops_s for s in self.runs[key])

    def ratios(self, key: str, ref: str, of: Callable[[Sample], float]) -> list[float]:
        return [of(a) / of(b) for a, b in zip(self.runs[key], self.runs[ref], strict=False)]


def _ratio_text(values: list[float]) -> tuple[str, str]:
    if not values:
        return "", ""
    spread = f"{min(values):.2f}-{max(values):.2f}" if len(values) > 1 else ""
    return f"{statistics.median(values):.2f}", spread


def render(rows: list[Row], figures: Figures) -> str:
    head = ("what", "clients", "p50 ms", "p50 ÷ ref", "ops/s", "ops/s ÷ ref", "ref", "runs: p50 ÷ / ops ÷")
    table: list[tuple[str, ...]] = [head]
    for row in rows:
        if row.key is None or row.key not in figures.runs:
            na = "n/a" if row.ref else ""  # a figure that could not be measured, or a row that is all note
            table.append((row.what, str(row.clients), na, na, na, na, row.ref_label, row.note))
            continue
        p50, ops = f"{figures.p50(row.key):.2f}", f"{figures.ops(row.key):.0f}"
        p50_r, ops_r, spread = "", "", ""
        if row.ref is not None and row.ref in figures.runs:
            p50_r, p50_s = _ratio_text(figures.ratios(row.key, row.ref, lambda s: s.p50_ms))
            ops_r, ops_s = _ratio_text(figures.ratios(row.key, row.ref, lambda s: s.ops_s))
            spread = f"{p50_s} / {ops_s}" if p50_s else ""
        note = f"{spread}  {row.note}".strip()
        table.append((row.what, str(row.clients), p50, p50_r, ops, ops_r, row.ref_label if row.ref else "", note))
    widths = [max(len(r[i]) for r in table) for i in range(len(head) - 1)]
    lines = []
    for n, r in enumerate(table):
        cells = [r[0].ljust(widths[0])] + [r[i].rjust(widths[i]) for i in range(1, len(widths))]
        lines.append("  ".join(cells) + "  " + r[-1])
        if n == 0:
            lines.append("-" * len(lines[0]))
    return "\n".join(lines)


# -- the main run --------------------------------------------------------------------------


def purge(queue: str) -> None:
    """Drop what the run left in Redis under `queue`: its messages (every priority list, the floor's queue) and bindings."""
    import redis

    client = redis.Redis.from_url(REDIS_URL or "")
    try:
        patterns = (f"{queue}*", f"_kombu.binding.{queue}*", f"_kombu.binding_permanent.{queue}*")
        keys = [key for pattern in patterns for key in client.scan_iter(match=pattern, count=1000)]
        if keys:
            client.delete(*keys)
    finally:
        client.close()


def rotated(items: list[str], by: int) -> list[str]:
    return items[by % len(items) :] + items[: by % len(items)]


def _median_ms(values: list[float]) -> str:
    return f"{statistics.median(values):.1f}" if values else "-"


def measure_main(deployment: Deployment, logs: Path, args: argparse.Namespace) -> tuple[Figures, list[Row], list[str]]:
    figures = Figures()
    notes: list[str] = []
    url = deployment.web(MCP_TASKS_MAX_ROWS="none")
    seed = McpHttp(url)
    task_ids = [seed.create("noop", {"n": n}) for n in range(100)]  # what tasks/get reads (never run: no worker)
    seed.close()

    peer: Peer | None = None
    peer_why = "skipped (--no-peer)" if args.no_peer else ""
    if not args.no_peer:
        try:
            say(f"peer: fastmcp-tasks=={PEER_VERSION} in its own venv (cached after the first run)")
            peer = Peer(peer_python(PEER_VERSION), REDIS_URL or "", logs / "peer.log").start()
            notes.append(
                f"peer: fastmcp-tasks {PEER_VERSION} on uvicorn {peer.loop_and_parser()}, its Docket worker in its "
                "web process (it runs each no-op during the creation runs: that is its design)"
            )
        except PeerUnavailable as exc:
            peer_why = str(exc)
            say(f"peer unavailable: {peer_why}")
    paths: dict[str, Factory] = {
        "floor": tool_call(url, "floor", says("sent")),
        "send_only": tool_call(url, "send_only", says("sent")),
        "create": tool_call(url, "noop", is_task),
    }
    if peer is not None:
        paths["peer"] = tool_call(peer.url, "noop", is_task)
    paths["tools/list"] = rpc_call(url, "tools/list", lambda result: "tools" in result)
    paths["tasks/get"] = task_get(url, task_ids)
    try:
        for run in range(RUNS):
            for name, sample in interleaved(paths, ROUNDS, WARMUP).items():
                figures.add(f"{name}/1", sample)
                say(f"run {run + 1}/{RUNS} {name:<11} 1 client p50 {sample.p50_ms:6.2f} ms")
            for name in rotated(list(paths), run):
                sample = many_clients(paths[name], CLIENTS, SECONDS, WARM_S)
                figures.add(f"{name}/{CLIENTS}", sample)
                say(f"run {run + 1}/{RUNS} {name:<11} {CLIENTS} clients {sample.ops_s:6.0f}/s p50 {sample.p50_ms:6.2f}")
    finally:
        if peer is not None:
            peer.stop()
    purge(deployment.queue)

    say(f"worker: -P {POOL} -c {CONCURRENCY}")
    deployment.worker(pool=POOL, concurrency=CONCURRENCY)
    finished: list[Completion] = []
    for run in range(RUNS):
        seen: list[Completion] = []
        jobs = {
            "floor@worker": tool_call(url, "floor", says("sent")),
            "completion": completion(url, seen),
            "sync 2026": tool_call(url, "noop", says("ok"), capabilities={}),
            "sync 2025": legacy_call(url, "2025-11-25", "noop", "ok"),
        }
        for name, sample in interleaved(jobs, ROUNDS, WARMUP).items():
            figures.add(f"{name}/1", sample)
            say(f"run {run + 1}/{RUNS} {name:<12} p50 {sample.p50_ms:6.2f} ms")
        finished.extend(seen[WARMUP:])

    pushed = [c for c in finished if c.by_notification]
    notes.append(
        f"completion, medians over all runs (ms): tools/call {_median_ms([c.created * 1e3 for c in finished])}, "
        f"listen open+ack {_median_ms([c.acked * 1e3 for c in finished])}, "
        f"row created->completed {_median_ms([c.server_ms for c in finished])}, "
        f"completed write->notification read {_median_ms([c.delivery_ms for c in pushed if c.delivery_ms])}; "
        f"{len(pushed)}/{len(finished)} seen by notification, the rest by the tasks/get after the ack"
    )
    if args.profile:
        deployment.first_worker().stop()
        purge(deployment.queue)
        from bench.hot_path_profile import profile

        notes.extend(profile(deployment, logs, CLIENTS, SECONDS))
        purge(deployment.queue)

    n = CLIENTS
    rows = [
        Row("floor: SDK tool, committed INSERT + send_task", 1, "floor/1", "floor/1"),
        Row("floor", n, f"floor/{n}", f"floor/{n}"),
        Row("(context) SDK tool, send_task only", 1, "send_only/1", "floor/1"),
        Row("(context) SDK tool, send_task only", n, f"send_only/{n}", f"floor/{n}"),
        Row("task creation: tools/call -> CreateTaskResult", 1, "create/1", "floor/1"),
        Row("task creation", n, f"create/{n}", f"floor/{n}"),
        Row("floor, worker running (ref of the 3 rows below)", 1, "floor@worker/1", "floor@worker/1"),
        Row("completion: no-op seen completed, listening", 1, "completion/1", "floor@worker/1"),
        Row("sync path: 2026-07-28 without the extension", 1, "sync 2026/1", "floor@worker/1"),
        Row("sync path: 2025-11-25 initialize session", 1, "sync 2025/1", "floor@worker/1"),
        Row("tools/list (bare)", 1, "tools/list/1", "tools/list/1", "tools/list"),
        Row("tools/list (bare)", n, f"tools/list/{n}", f"tools/list/{n}", "tools/list"),
        Row("tasks/get", 1, "tasks/get/1", "tools/list/1", "tools/list"),
        Row("tasks/get", n, f"tasks/get/{n}", f"tools/list/{n}", "tools/list"),
        Row("peer fastmcp-tasks: creation", 1, "peer/1" if peer else None, "floor/1", note=peer_why),
        Row("peer fastmcp-tasks: creation", n, f"peer/{n}" if peer else None, f"floor/{n}", note=peer_why),
    ]
    return figures, rows, notes


# -- scale -------------------------------------------------------------------------------------


def measure_scale(deployment: Deployment, args: argparse.Namespace, figures: Figures) -> list[Row]:
    from bench.hot_path_scale import count_rows, fill_rows, streams
    from celery_mcp_tasks import McpTasks, Settings
    from celery_mcp_tasks.model import task_key

    url = deployment.web(MCP_TASKS_MAX_ROWS="none", BENCH_MAX_STREAMS=str(args.streams + 64))
    pid = deployment.procs[-1].popen.pid
    store_url = deployment.backend.store_url
    http = McpHttp(url)
    probes = [http.create("noop", {"n": i}) for i in range(100)]
    rows: list[Row] = []
    levels = sorted(int(level) for level in args.rows.split(","))
    bulk = 0
    for level in levels:
        missing = level - count_rows(store_url)
        if missing > 0:
            took = fill_rows(store_url, bulk, bulk + missing)
            bulk += missing
            say(f"scale: {level} rows ({missing} inserted in {took:.1f} s)")
        for _ in range(RUNS):
            figures.add(f"get@{level}", one_client(task_get(url, probes), ROUNDS, WARMUP))
        rows.append(Row(f"tasks/get at {level:,} rows".replace(",", " "), 1, f"get@{level}", f"get@{levels[0]}"))
        rows[-1].ref_label = f"{levels[0]:,} rows".replace(",", " ")

    followed = http.create("noop", {"n": -1})
    http.close()
    env = {**deployment.backend.env, "MCP_TASKS_QUEUE": deployment.queue}
    writer = McpTasks("bench-hot-path-writer", settings=Settings.from_env(env))
    service = writer.service()
    say(f"scale: opening {args.streams} listen streams")
    result = streams(url, followed, args.streams, pid, lambda message: service.progress(task_key(followed), message))
    service.store.dispose()  # type: ignore[attr-defined]
    per_stream_kb = (result.rss_open_mb - result.rss_before_mb) * 1024 / max(result.opened, 1)
    last = f"{result.last_ms:.0f} ms" if result.last_ms is not None else "never"
    note = (
        f"opened {result.opened}/{result.wanted} in {result.open_s:.1f} s; VmRSS {result.rss_open_mb:.0f} MB open, "
        f"{result.rss_after_mb:.0f} MB after the change (idle {result.rss_before_mb:.0f} MB, "
        f"+{per_stream_kb:.0f} KB/stream); one change reached {result.reached}/{result.opened}, the last after {last}"
    )
    if result.refused:
        note += f"; first refusal: {result.refused}"
    rows.append(Row(f"{args.streams} listen streams following one task", args.streams, None, None, "", note))
    return rows


# -- main --------------------------------------------------------------------------------------


def raise_fd_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # the children (web, worker) inherit it


def header(args: argparse.Namespace) -> list[str]:
    import importlib.util

    ours = stack_name(importlib.util.find_spec("uvloop") is not None, importlib.util.find_spec("httptools") is not None)
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    return [
        f"bench_hot_path: PostgreSQL + Redis, {os.cpu_count()} cores shared by clients, servers, PostgreSQL and Redis; "
        f"load average at start {load}",
        f"{RUNS} runs; 1 client: {WARMUP} warm-up + {ROUNDS} timed calls; {CLIENTS} clients: {WARM_S:g} s warm-up + "
        f"{SECONDS:g} s window; closed loop, threads; ours on uvicorn {ours}; MCP_TASKS_MAX_ROWS=none; "
        f"notify auto (PostgreSQL)",
    ]


def on_fresh_deployment(logs: Path, measure: Callable[[Deployment], _T]) -> _T:
    """`measure` a deployment of the bench app on a new database (dropped after), its processes stopped after."""
    assert POSTGRES_URL and REDIS_URL
    with fresh_postgres_database(POSTGRES_URL) as url:
        backend = Backend("pg_redis", {"MCP_TASKS_DATABASE_URL": url, "CELERY_BROKER_URL": REDIS_URL})
        deployment = Deployment(APP, backend, logs)
        try:
            return measure(deployment)
        except BaseException:
            say(deployment.logs()[-4000:])
            raise
        finally:
            deployment.stop()
            purge(deployment.queue)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--profile", action="store_true", help="where a creation's time goes (py-spy, counters)")
    parser.add_argument("--no-peer", action="store_true", help="skip fastmcp-tasks")
    parser.add_argument("--scale", action="store_true", help="tasks/get at each --rows count, --streams streams")
    parser.add_argument("--scale-only", action="store_true", help="the --scale rows alone")
    parser.add_argument("--rows", default="1000,100000", help="row counts for --scale (e.g. 1000,100000,1000000)")
    parser.add_argument("--streams", type=int, default=2000, help="listen streams for --scale")
    args = parser.parse_args()
    if not (POSTGRES_URL and REDIS_URL):
        print(
            "bench_hot_path: needs PostgreSQL and Redis: set MCP_TASKS_TEST_POSTGRES_URL and MCP_TASKS_TEST_REDIS_URL"
        )
        sys.exit(2)
    raise_fd_limit()
    began = time.perf_counter()
    lines = header(args)
    figures, rows, notes = Figures(), list[Row](), list[str]()
    with tempfile.TemporaryDirectory(prefix="bench-hot-path-") as tmp:
        logs = Path(tmp)
        if not args.scale_only:
            figures, rows, notes = on_fresh_deployment(logs, lambda d: measure_main(d, logs, args))
        if args.scale or args.scale_only:
            rows.extend(on_fresh_deployment(logs, lambda d: measure_scale(d, args, figures)))
    print("\n".join(lines))
    print(render(rows, figures))
    for note in notes:
        print(note)
    print(f"({time.perf_counter() - began:.0f} s)")


if __name__ == "__main__":
    main()
