"""A whole task against its floor, in one run: one command, one table of ratios (issue 20).

    python bench/bench_task.py [--streams 10000]

Needs MCP_TASKS_TEST_POSTGRES_URL and MCP_TASKS_TEST_REDIS_URL (two fresh databases are
made and dropped; the Redis db named there gets two queues of the run's own, purged after).
Everything listens on 127.0.0.1. Three deployments run side by side for the whole run:

- the floor (bench/floor_app.py): a plain MCP SDK tool on uvicorn doing one prepared
  autocommit INSERT of a task-shaped row (the store's own table, in a database of its own)
  through psycopg plus `send_task`; a plain Celery worker runs the no-op and completes the
  row with one prepared autocommit UPDATE;
- ours on PostgreSQL + Redis (bench/task_app.py): `celery-mcp-tasks serve` and
  `celery -A bench.task_app worker`, the same pool and concurrency as the floor's worker
  (BENCH_WORKER_POOL prefork, BENCH_WORKER_CONCURRENCY 2);
- ours on the embedded default: `celery-mcp-tasks dev` (SQLite + filesystem broker, the
  worker `dev` starts itself).

Every figure is taken with the workers running. Per run (BENCH_RUNS, 5), the paths take
turns so drift on a shared machine falls on them alike:
- 1 client: the paths call by call in turn (BENCH_WARMUP 30, then BENCH_ROUNDS 150 each,
  the order rotated every round): creation p50; then, the same way, the synchronous path (the
  no-op tool called without the extension on ours, PostgreSQL + Redis: it answers when the job
  is done) in turns with the floor's creation, its reference. Every web process takes one call
  a turn;
- BENCH_CLIENTS (8) closed-loop clients: each path in turn for a BENCH_SECONDS (4) window
  after BENCH_WARM_S (1) s, the order rotated every run: creations per second;
- a burst of BENCH_BURST (600) creations from the same 8 clients: from the first call to the
  last row read `completed` (the store polled every 20 ms by a connection left out of the
  CPU), completed tasks per second, and CPU per completed task: user + system time from
  /proc/<pid>/stat over the burst, summed over the web process, the worker's whole process
  tree, the PostgreSQL backends connected to the path's database with the server's own
  processes (WAL writer, checkpointer, background writer: only one path writes at a time) and
  redis-server (the embedded default: `dev`'s process tree, which holds all of it); a second
  table gives that CPU by process (web, worker tree, PostgreSQL, redis-server), the median of
  the runs.
After the warm-up every path's table gets BENCH_SEED_ROWS (2000) settled rows, then ANALYZE, as a
table in service holds its last TTL's tasks (on a near-empty table PostgreSQL plans an UPDATE by key
as a sequential scan of every row the window made). Before each timed window every path's backlog
is drained (bounded waits) and its other completed rows deleted (PostgreSQL: and vacuumed), so every
window starts on tables of the same size, far below ours' row cap (`MCP_TASKS_MAX_ROWS`, on at its
default as shipped).
Ratios are taken within a run, then the median over the runs; the range is beside it.
`--streams N` then opens N listen streams on ours' web process: RSS, and the time until the
last stream hears one change.
"""

from __future__ import annotations

import argparse
import os
import resource
import sqlite3
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import psycopg  # noqa: E402

from bench.harness import Burst, Factory, interleaved, is_task, many_clients, says, tool_call  # noqa: E402
from celery_mcp_tasks.store import schema  # noqa: E402
from tests.support import (  # noqa: E402
    POSTGRES_URL,
    REDIS_URL,
    Backend,
    Proc,
    free_port,
    fresh_postgres_database,
    process_env,
    spawn,
    wait_until,
)

RUNS = int(os.environ.get("BENCH_RUNS", "5"))
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "150"))
WARMUP = int(os.environ.get("BENCH_WARMUP", "30"))
CLIENTS = int(os.environ.get("BENCH_CLIENTS", "8"))
SECONDS = float(os.environ.get("BENCH_SECONDS", "4"))
WARM_S = float(os.environ.get("BENCH_WARM_S", "1"))
BURST = int(os.environ.get("BENCH_BURST", "600"))
SEED = int(os.environ.get("BENCH_SEED_ROWS", "2000"))
POOL = os.environ.get("BENCH_WORKER_POOL", "prefork")
CONCURRENCY = int(os.environ.get("BENCH_WORKER_CONCURRENCY", "2"))
DRAIN_S = 180.0
CLK_TCK = os.sysconf("SC_CLK_TCK")
TABLE = schema.tasks.name  # the store's table, in every path's database (the floor's made from the same metadata)
FLOOR, OURS, EMBEDDED, SYNC = "floor", "ours", "embedded", "sync"
BESIDE_SYNC = "p50 beside sync"
"""The floor's creation p50 taken in turns with the synchronous path: that path's reference."""


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def pg_url(url: str) -> str:
    return url.replace("postgresql+psycopg://", "postgresql://", 1)


# -- CPU from /proc ----------------------------------------------------------------------------


def _stat(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rpartition(")")[2].split()  # fields from `state` on (comm may hold spaces)
    except OSError:
        return None


def cpu_ticks(pid: int) -> int:
    fields = _stat(pid)
    return int(fields[11]) + int(fields[12]) if fields else 0  # utime + stime


def process_tree(root: int) -> set[int]:
    """`root` and every process below it (from each process's ppid in /proc)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (fields := _stat(int(entry))):
            children.setdefault(int(fields[1]), []).append(int(entry))
    found, todo = set(), [root]
    while todo:
        pid = todo.pop()
        found.add(pid)
        todo.extend(children.get(pid, []))
    return found


@dataclass
class Deployment:
    """One path's processes and the store its rows land in."""

    name: str
    url: str
    procs: list[Proc]
    rows: Rows
    database: str | None = None  # PostgreSQL: the database whose backends count
    uses_redis: bool = False

    def pids(self, admin: psycopg.Connection[Any], redis_pid: int | None) -> dict[int, str]:
        """Every process whose CPU counts, each with its part: web, worker, postgres or redis."""
        pids: dict[int, str] = {}
        for proc in self.procs:
            part = "worker" if "worker" in proc.name else "web"  # `dev`'s one tree holds all of it: "web"
            pids.update(dict.fromkeys(process_tree(proc.popen.pid), part))
        if self.database is not None:
            # The path's backends (autovacuum's included), and the server's own processes (WAL writer, checkpointer,
            # background writer): only one path writes at a time, so what they do then is that path's doing.
            found = admin.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = %s OR datname IS NULL", (self.database,)
            )
            pids.update(dict.fromkeys({int(pid) for (pid,) in found} - {self.rows.backend_pid}, "postgres"))
        if self.uses_redis and redis_pid:
            pids[redis_pid] = "redis"
        return pids


PARTS = ("web", "worker", "postgres", "redis")


def cpu_snapshot(pids: dict[int, str]) -> dict[int, tuple[str, int]]:
    return {pid: (part, cpu_ticks(pid)) for pid, part in pids.items()}


def cpu_spent_s(before: dict[int, tuple[str, int]], after: dict[int, tuple[str, int]]) -> dict[str, float]:
    """Seconds of CPU between two snapshots, by part (a process born in between counts from zero)."""
    spent = dict.fromkeys(PARTS, 0.0)
    for pid, (part, ticks) in after.items():
        spent[part] += (ticks - before.get(pid, (part, 0))[1]) / CLK_TCK
    return spent


# -- the store, watched ------------------------------------------------------------------------


SEED_TOOL = "bench-seed"


class Rows:
    """Counts of a path's rows, completed and not (the store's own table, either database)."""

    backend_pid: int | None = None
    QUERY = f"SELECT SUM(CASE WHEN status = 'completed' THEN 1 ELSE 0 END), COUNT(*) FROM {TABLE}"

    def __init__(self, url: str) -> None:
        if url.startswith("sqlite"):
            self.conn: Any = sqlite3.connect(url.split("///", 1)[1], isolation_level=None, check_same_thread=False)
        else:
            self.conn = psycopg.connect(pg_url(url), autocommit=True)
            self.backend_pid = self.conn.info.backend_pid

    def seed(self) -> None:
        """SEED settled rows (tool `SEED_TOOL`, never deleted), then ANALYZE (PostgreSQL): a deployment's table holds the tasks
        of the last TTL, and the planner knows it. On a nearly empty table it plans every UPDATE by key as a
        sequential scan (cheaper there than the index), so each write would read every row the window made:
        work no table in service does, and twice as much for a path writing twice."""
        now = int(time.time() * 1000)
        row = {column.name: None for column in schema.tasks.columns}
        row.update(
            tool=SEED_TOOL,
            status="completed",
            created_at=now,
            updated_at=now,
            ttl_ms=86_400_000,
            expires_at=now + 86_400_000,
            poll_interval_ms=1000,
            arguments="{}",
            input_requests="{}",
            input_responses="{}",
            issued_keys="[]",
            result='{"content":[]}',
            version=3,
            dispatches=1,
            attempt=0,
            resends=0,
            parked=False,
        )
        names = list(row)
        mark = "?" if self.backend_pid is None else "%s"
        insert = f"INSERT INTO {TABLE} ({', '.join(names)}) VALUES ({', '.join(mark for _ in names)})"
        values = [tuple(uuid.uuid4().hex * 2 if name == "key" else row[name] for name in names) for _ in range(SEED)]
        if self.backend_pid is None:  # SQLite: one transaction; the package never analyzes it, neither does this
            self.conn.execute("BEGIN")
            self.conn.executemany(insert, values)
            self.conn.execute("COMMIT")
        else:
            with self.conn.cursor() as cursor:
                cursor.executemany(insert, values)
            self.conn.execute(f"ANALYZE {TABLE}")

    def counts(self) -> tuple[int, int]:
        done, total = self.conn.execute(self.QUERY).fetchone()
        return int(done or 0), int(total)

    def drain(self, what: str) -> None:
        """Wait until every row is completed (an empty table too)."""

        def drained() -> bool:
            done, total = self.counts()
            return done == total

        try:
            wait_until(drained, DRAIN_S, f"{what}'s backlog to drain", interval=0.05)
        except TimeoutError:
            left = self.conn.execute(
                f"SELECT status, status_message, COUNT(*) FROM {TABLE} WHERE status <> 'completed' GROUP BY 1, 2"
            ).fetchall()
            raise TimeoutError(f"{what}'s backlog did not drain in {DRAIN_S:.0f} s; left: {left}") from None

    def clear(self) -> None:
        """Delete the completed rows but the seeded ones (and vacuum them away): every window starts on a table of
        the same size, far below ours' row cap, with no autovacuum owed."""
        self.conn.execute(f"DELETE FROM {TABLE} WHERE status = 'completed' AND tool <> '{SEED_TOOL}'")
        if self.backend_pid is not None:
            self.conn.execute(f"VACUUM {TABLE}")

    def close(self) -> None:
        self.conn.close()


# -- the figures and the table -----------------------------------------------------------------


@dataclass
class Figures:
    values: dict[tuple[str, str], list[float]] = field(default_factory=dict)

    def add(self, metric: str, path: str, value: float) -> None:
        self.values.setdefault((metric, path), []).append(value)

    def median(self, metric: str, path: str) -> float | None:
        found = self.values.get((metric, path))
        return statistics.median(found) if found else None

    def ratios(self, metric: str, path: str, ref_metric: str, ref: str) -> list[float]:
        mine, theirs = self.values.get((metric, path), []), self.values.get((ref_metric, ref), [])
        return [a / b for a, b in zip(mine, theirs, strict=False) if b]


@dataclass
class Row:
    what: str
    metric: str
    path: str
    ref: str
    target: str = ""  # "<= 1.1", ">= 0.8" or "" (context)
    ref_metric: str = ""


ROWS = [
    Row("creation p50, 1 client, workers running (ms)", "p50", OURS, FLOOR, "<= 1.1"),
    Row(f"creation throughput, {CLIENTS} clients (/s)", "ops", OURS, FLOOR, ">= 0.9"),
    Row(f"completed tasks/s, burst of {BURST}", "tps", OURS, FLOOR, ">= 0.8"),
    Row("CPU per completed task (ms, all processes)", "cpu", OURS, FLOOR, "<= 1.3"),
    Row("sync path p50, no extension (ms) vs creation floor", "p50", SYNC, FLOOR, "<= 2.0", BESIDE_SYNC),
    Row("embedded creation p50 (ms) vs ours PG+Redis", "p50", EMBEDDED, OURS, "<= 1.0"),
    Row(f"embedded creation throughput, {CLIENTS} clients (/s)", "ops", EMBEDDED, FLOOR),
    Row(f"embedded completed tasks/s, burst of {BURST}", "tps", EMBEDDED, FLOOR),
    Row("embedded CPU per completed task (ms, dev's tree)", "cpu", EMBEDDED, FLOOR),
]


def _met(ratio: float, target: str) -> str:
    if not target:
        return "context"
    op, bound = target.split()
    return "yes" if (ratio <= float(bound) if op == "<=" else ratio >= float(bound)) else "NO"


def _num(value: float | None) -> str:
    if value is None:
        return "n/a"
    return f"{value:.2f}" if value < 100 else f"{value:.0f}"


def render(figures: Figures) -> str:
    head = ("measure", "ref", "ref value", "value", "ratio", "runs", "target", "met")
    table = [head]
    for row in ROWS:
        ref_metric = row.ref_metric or row.metric
        ratios = figures.ratios(row.metric, row.path, ref_metric, row.ref)
        ratio = statistics.median(ratios) if ratios else None
        spread = f"{min(ratios):.2f}-{max(ratios):.2f}" if len(ratios) > 1 else ""
        table.append(
            (
                row.what,
                {FLOOR: "floor", OURS: "ours PG+Redis"}[row.ref],
                _num(figures.median(ref_metric, row.ref)),
                _num(figures.median(row.metric, row.path)),
                f"{ratio:.2f}" if ratio is not None else "n/a",
                spread,
                row.target or "-",
                _met(ratio, row.target) if ratio is not None else "n/a",
            )
        )
    return _aligned(table) + "\n\n" + cpu_parts(figures)


def cpu_parts(figures: Figures) -> str:
    """CPU per completed task by process (ms, median of the runs): where each path spends it."""
    table = [("CPU ms per completed task", *PARTS, "all")]
    for path, label in ((FLOOR, "floor"), (OURS, "ours PG+Redis"), (EMBEDDED, "embedded (dev's tree)")):
        values = [figures.median(f"cpu:{part}", path) for part in PARTS] + [figures.median("cpu", path)]
        table.append((label, *(_num(v) if v else "-" for v in values)))
    return _aligned(table, left=1)


def _aligned(table: list[tuple[str, ...]], left: int = 2) -> str:
    """Columns padded to their widest cell: the first `left` flush left, the others flush right."""
    widths = [max(len(r[i]) for r in table) for i in range(len(table[0]))]
    lines = []
    for n, r in enumerate(table):
        lines.append(
            "  ".join(c.ljust(w) if i < left else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True)))
        )
        if n == 0:
            lines.append("-" * len(lines[0]))
    return "\n".join(lines)


# -- the deployments ---------------------------------------------------------------------------


def wait_listening(proc: Proc, port: int) -> str:
    import socket

    def up() -> bool:
        if proc.popen.poll() is not None:
            raise RuntimeError(f"{proc.name} exited:\n{proc.text()[-3000:]}")
        with socket.socket() as sock:
            sock.settimeout(0.2)
            return sock.connect_ex(("127.0.0.1", port)) == 0

    wait_until(up, 90, f"{proc.name} to listen")
    return f"http://127.0.0.1:{port}/mcp"


def worker_argv(app: str, name: str) -> list[str]:
    """`celery worker` as a user runs it, the same for the floor and ours (default log level: WARNING)."""
    node = f"{name}-{uuid.uuid4().hex[:6]}@%h"
    argv = [sys.executable, "-m", "celery", "-A", app, "worker", "-P", POOL, "-c", str(CONCURRENCY)]
    return [*argv, "--without-mingle", "--without-gossip", "-n", node]


def start_floor(stack: ExitStack, url: str, queue: str, logs: Path) -> Deployment:
    import sqlalchemy as sa

    engine = sa.create_engine(url.replace("postgresql://", "postgresql+psycopg://", 1))
    schema.tasks.create(engine)  # the store's table, columns and indexes, from its own metadata
    engine.dispose()
    env = process_env(
        Backend("floor", {}), BENCH_FLOOR_DATABASE_URL=url, CELERY_BROKER_URL=REDIS_URL or "", BENCH_FLOOR_QUEUE=queue
    )
    port = free_port()
    web = spawn("floor-web", [sys.executable, "-m", "bench.floor_app", str(port)], env, logs)
    stack.callback(web.stop)
    worker = spawn("floor-worker", worker_argv("bench.floor_app", "floor"), env, logs)
    stack.callback(worker.stop)
    rows = Rows(url)
    stack.callback(rows.close)
    return Deployment(FLOOR, wait_listening(web, port), [web, worker], rows, sa.make_url(url).database, True)


def ours_env(**extra: str) -> dict[str, str]:
    """Ours as shipped (the row cap at its default too: the completed rows are deleted between windows), but for
    the worker's metrics port (off: other processes on this machine may hold the default one)."""
    return {"MCP_TASKS_WORKER_METRICS_PORT": "off", **extra}


def start_ours(stack: ExitStack, url: str, queue: str, logs: Path, streams: int) -> Deployment:
    import sqlalchemy as sa

    from celery_mcp_tasks.migrate import upgrade

    upgrade(url)
    extra = ours_env(MCP_TASKS_DATABASE_URL=url, CELERY_BROKER_URL=REDIS_URL or "", MCP_TASKS_QUEUE=queue)
    if streams:
        extra["BENCH_MAX_STREAMS"] = str(streams + 64)
    env = process_env(Backend("ours", {}), **extra)
    port = free_port()
    argv = [sys.executable, "-m", "celery_mcp_tasks.cli", "serve", "bench.task_app", "--port", str(port)]
    web = spawn("ours-web", [*argv, "--log-level", "warning"], env, logs)
    stack.callback(web.stop)
    worker = spawn("ours-worker", worker_argv("bench.task_app", "ours"), env, logs)
    stack.callback(worker.stop)
    rows = Rows(url)
    stack.callback(rows.close)
    return Deployment(OURS, wait_listening(web, port), [web, worker], rows, sa.make_url(url).database, True)


def start_embedded(stack: ExitStack, data_dir: Path, logs: Path) -> Deployment:
    from celery_mcp_tasks.config import Settings

    env = process_env(Backend("embedded", {}), **ours_env(MCP_TASKS_DATA_DIR=str(data_dir)))
    port = free_port()
    argv = [sys.executable, "-m", "celery_mcp_tasks.cli", "dev", "bench.task_app", "--port", str(port)]
    dev = spawn("embedded-dev", [*argv, "--data-dir", str(data_dir), "--log-level", "warning"], env, logs)
    stack.callback(dev.stop)
    url = wait_listening(dev, port)
    store = Settings.from_env({"MCP_TASKS_DATA_DIR": str(data_dir)}).store_url
    rows = wait_until(lambda: _migrated(store), 90, "the embedded store to be migrated")
    stack.callback(rows.close)
    return Deployment(EMBEDDED, url, [dev], rows)


def _migrated(url: str) -> Rows | None:
    """The store's rows, once `dev` has made the database and its table."""
    if not Path(url.split("///", 1)[1]).exists():
        return None
    rows = Rows(url)
    try:
        rows.counts()
    except sqlite3.OperationalError:  # no table yet
        rows.close()
        return None
    return rows


def purge(queues: list[str]) -> None:
    """Drop what the run left in Redis under its queues: messages (every priority list) and bindings."""
    import redis

    client = redis.Redis.from_url(REDIS_URL or "")
    try:
        for queue in queues:
            patterns = (f"{queue}*", f"_kombu.binding.{queue}*", f"_kombu.binding_permanent.{queue}*")
            keys = [key for pattern in patterns for key in client.scan_iter(match=pattern, count=1000)]
            if keys:
                client.delete(*keys)
    finally:
        client.close()


def redis_server_pid() -> int | None:
    import redis

    client = redis.Redis.from_url(REDIS_URL or "")
    try:
        pid = int(client.info("server")["process_id"])
    finally:
        client.close()
    return pid if os.path.exists(f"/proc/{pid}/stat") else None  # a redis-server in another pid namespace


# -- the run -----------------------------------------------------------------------------------


def rotated(items: list[str], by: int) -> list[str]:
    return items[by % len(items) :] + items[: by % len(items)]


@dataclass
class Bench:
    paths: dict[str, Deployment]
    admin: psycopg.Connection[Any]
    redis_pid: int | None
    figures: Figures = field(default_factory=Figures)

    def create(self, name: str) -> Factory:
        path = self.paths[name]
        return tool_call(path.url, "create", says("sent")) if name == FLOOR else tool_call(path.url, "noop", is_task)

    def drain(self) -> None:
        for path in self.paths.values():
            path.rows.drain(path.name)
            path.rows.clear()

    def warm_up(self) -> None:
        """One task through each path (the workers are ready once it completes), then each path's warm-up."""
        for name in self.paths:
            call, close = self.create(name)()
            call()
            close()
        self.drain()
        for path in self.paths.values():  # now that every path's table is migrated
            path.rows.seed()

    def one_client(self, run: int) -> None:
        """Creation on every path in turns, then the synchronous path in turns with the floor's creation: one call
        per web process a turn. The synchronous calls once shared ours' turns, so ours' web process took two calls
        a turn to the others' one, and answered faster for it (creation p50 3.5 ms against 4.6 ms without them)."""
        creations = interleaved({name: self.create(name) for name in self.paths}, ROUNDS, WARMUP)
        sync = tool_call(self.paths[OURS].url, "noop", says("ok"), capabilities={})
        beside_sync = interleaved({FLOOR: self.create(FLOOR), SYNC: sync}, ROUNDS, WARMUP)
        for name, sample in [*creations.items(), (SYNC, beside_sync[SYNC])]:
            self.figures.add("p50", name, sample.p50_ms)
            say(f"run {run + 1}/{RUNS} 1 client   {name:<9} p50 {sample.p50_ms:6.2f} ms")
        self.figures.add(BESIDE_SYNC, FLOOR, beside_sync[FLOOR].p50_ms)

    def many(self, run: int) -> None:
        for name in rotated(list(self.paths), run):
            self.drain()
            sample = many_clients(self.create(name), CLIENTS, SECONDS, WARM_S)
            self.figures.add("ops", name, sample.ops_s)
            say(f"run {run + 1}/{RUNS} {CLIENTS} clients  {name:<9} {sample.ops_s:6.0f}/s")

    def burst(self, run: int) -> None:
        for name in rotated(list(self.paths), run + 1):
            self.drain()
            tps, parts = self.one_burst(self.paths[name])
            cpu_ms = sum(parts.values())
            self.figures.add("tps", name, tps)
            self.figures.add("cpu", name, cpu_ms)
            for part, ms in parts.items():
                self.figures.add(f"cpu:{part}", name, ms)
            by_part = ", ".join(f"{part} {ms:.2f}" for part, ms in parts.items() if ms)
            say(
                f"run {run + 1}/{RUNS} burst      {name:<9} {tps:6.0f} completed/s, {cpu_ms:5.2f} ms CPU each ({by_part})"
            )

    def one_burst(self, path: Deployment) -> tuple[float, dict[str, float]]:
        """BURST creations from CLIENTS clients until the last row reads completed: (tasks/s, CPU ms a task by part)."""
        base, _ = path.rows.counts()
        burst = Burst(self.create(path.name), BURST, CLIENTS)
        before = cpu_snapshot(path.pids(self.admin, self.redis_pid))
        began = time.perf_counter()
        burst.start()
        try:
            wait_until(lambda: path.rows.counts()[0] >= base + BURST, DRAIN_S, f"{path.name}'s burst", 0.02)
            took = time.perf_counter() - began
            after = cpu_snapshot(path.pids(self.admin, self.redis_pid))
        finally:
            burst.join()
        return BURST / took, {part: s * 1e3 / BURST for part, s in cpu_spent_s(before, after).items()}


def measure_streams(ours: Deployment, url: str, queue: str, n: int) -> str:
    """N listen streams following one task on ours' web process; one progress write, as a worker makes it."""
    from bench.listen_streams import streams
    from celery_mcp_tasks import McpTasks
    from celery_mcp_tasks.app import internals
    from celery_mcp_tasks.config import Settings

    env = ours_env(MCP_TASKS_DATABASE_URL=url, CELERY_BROKER_URL=REDIS_URL or "", MCP_TASKS_QUEUE=queue)
    service = internals(McpTasks("bench-task-writer", settings=Settings.from_env(env))).service()
    task_id, record = service.create(owner=None, tool="noop", arguments={}, dispatch=False)  # stays working
    say(f"streams: opening {n} listen streams")
    pid = ours.procs[0].popen.pid
    result = streams(ours.url, task_id, n, pid, lambda message: service.progress(record.key, message))
    service.store.dispose()  # type: ignore[attr-defined]
    per_stream_kb = (result.rss_open_mb - result.rss_before_mb) * 1024 / max(result.opened, 1)
    last = f"{result.last_ms:.0f} ms" if result.last_ms is not None else "never"
    line = (
        f"{n} listen streams on one web process: opened {result.opened}/{result.wanted} in {result.open_s:.1f} s; "
        f"VmRSS {result.rss_before_mb:.0f} MB idle, {result.rss_open_mb:.0f} MB open (+{per_stream_kb:.0f} KB a "
        f"stream), {result.rss_after_mb:.0f} MB after; one change reached {result.reached}/{result.opened}, "
        f"the last after {last}"
    )
    return line + (f"; first refusal: {result.refused}" if result.refused else "")


@contextmanager
def deployments(logs: Path, streams: int) -> Iterator[tuple[Bench, str, str]]:
    assert POSTGRES_URL and REDIS_URL
    run_id = uuid.uuid4().hex[:8]
    queues = [f"bench-floor-{run_id}", f"bench-ours-{run_id}"]
    with ExitStack() as stack:
        stack.callback(purge, queues)
        floor_db = stack.enter_context(fresh_postgres_database(POSTGRES_URL))
        ours_db = stack.enter_context(fresh_postgres_database(POSTGRES_URL))
        admin = psycopg.connect(pg_url(POSTGRES_URL), autocommit=True)
        stack.callback(admin.close)
        paths = {}
        try:
            paths[FLOOR] = start_floor(stack, floor_db, queues[0], logs)
            paths[OURS] = start_ours(stack, ours_db, queues[1], logs, streams)
            paths[EMBEDDED] = start_embedded(stack, logs / "embedded", logs)
            bench = Bench(paths, admin, redis_server_pid())
            bench.warm_up()
            yield bench, ours_db, queues[1]
        except BaseException:
            for path in paths.values():
                for proc in path.procs:
                    say(f"--- {proc.name} (last lines)\n{proc.text()[-2000:]}")
            raise


def raise_fd_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # the children (web, worker) inherit it


def header() -> list[str]:
    import importlib.metadata as md

    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    versions = ", ".join(f"{name} {md.version(name)}" for name in ("mcp", "celery", "kombu", "psycopg", "uvicorn"))
    return [
        f"bench_task: {os.cpu_count()} cores shared by the clients, every server process, PostgreSQL and Redis; "
        f"load average at start {load}; {versions}",
        f"{RUNS} runs; 1 client: {WARMUP} warm-up + {ROUNDS} calls each, in turns; {CLIENTS} clients: {WARM_S:g} s + "
        f"{SECONDS:g} s windows, in turns; bursts of {BURST}; workers -P {POOL} -c {CONCURRENCY} "
        "(embedded: `dev`'s own); ratio = value / ref per run, median of the runs (range beside it)",
        "ours as shipped but MCP_TASKS_WORKER_METRICS_PORT=off and uvicorn at --log-level warning (serve and dev "
        f"alike: no access lines); {SEED} settled rows in every table, the other completed ones deleted (PostgreSQL: "
        f"and vacuumed) before every window; CPU from /proc/<pid>/stat at {CLK_TCK} ticks/s; a redis-server or PostgreSQL shared with other work adds its noise to both sides",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--streams", type=int, default=0, metavar="N", help="then N listen streams on one web process")
    args = parser.parse_args()
    if not (POSTGRES_URL and REDIS_URL):
        print("bench_task: needs MCP_TASKS_TEST_POSTGRES_URL and MCP_TASKS_TEST_REDIS_URL")
        sys.exit(2)
    for url in (POSTGRES_URL, REDIS_URL):
        if urlsplit(url).hostname not in ("127.0.0.1", "localhost"):
            sys.exit(f"bench_task: {urlsplit(url).hostname} is not 127.0.0.1; the bench stays on this machine")
    raise_fd_limit()
    began = time.perf_counter()
    lines = header()
    streams_line = ""
    with (
        tempfile.TemporaryDirectory(prefix="bench-task-") as tmp,
        deployments(Path(tmp), args.streams) as (
            bench,
            ours_db,
            queue,
        ),
    ):
        if bench.redis_pid is None:
            lines.append("redis-server's pid is not visible here: its CPU is left out of both sides")
        for run in range(RUNS):
            bench.one_client(run)
            bench.many(run)
            bench.burst(run)
        if args.streams:
            bench.drain()
            streams_line = measure_streams(bench.paths[OURS], ours_db, queue, args.streams)
    print("\n".join(lines))
    print(render(bench.figures))
    if streams_line:
        print(streams_line)
    print(f"({time.perf_counter() - began:.0f} s)")


if __name__ == "__main__":
    main()
