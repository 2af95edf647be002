"""What metrics, tracing and JSON logs cost on task creation, measured in one run on PostgreSQL + Redis.

    python bench/bench_ops_overhead.py

Needs MCP_TASKS_TEST_POSTGRES_URL and MCP_TASKS_TEST_REDIS_URL (a fresh database is made
and dropped). Five `celery-mcp-tasks serve bench.hot_path_app` processes on the same
database and Redis, no worker (creation only, as in bench_hot_path.py):

- off: MCP_TASKS_METRICS=off, MCP_TASKS_TRACING=off, text logs: the baseline;
- metrics: every creation counted, `/metrics` scraped every BENCH_SCRAPE_S (1) s during
  the run, as Prometheus would;
- metrics+tracing: the same plus `otlp` tracing (the SDK's tools/call span, our creation
  span, the creation's attributes on it, our run spans, batched to a local OTLP/HTTP sink
  that answers 200, in a process of its own: in the clients' process it would take the GIL
  from the clients exactly during the traced windows, a cost no deployment pays);
- metrics+tracing 10 %: the same with the standard ratio sampler at 0.1
  (OTEL_TRACES_SAMPLER=parentbased_traceidratio), as busy production services trace;
- json logs: off, but MCP_TASKS_LOG_FORMAT=json (uvicorn's access line per request).

Beside throughput, the serve process's own CPU time per creation (user + system, from
/proc, over each window): on a shared 2-core machine throughput swings by +-10 % from
window to window, while CPU per call shows what each switch adds to the process that
pays for it (the sink's work is not in it; a collector runs elsewhere).

Each configuration runs in two serve processes (a and b), ten in all; each process is measured
closed-loop with BENCH_CLIENTS (8) clients for BENCH_SECONDS (4) windows after BENCH_WARM_S
(1), taking turns, the order rotated every run, BENCH_RUNS (5) runs; and with 1 client,
call by call in turns (BENCH_ROUNDS (200) each). Shown: per run, the mean of a
configuration's two processes against the mean of off's two; the median of the runs'
ratios and their range. The last row compares off's two processes with each other: two
identical processes differ by that much on this machine, so a ratio within it is no cost
this bench can see. Then, BENCH_RUNS windows more: off and each configuration serving at the
same time, half the clients each (the two processes take turns), so whatever the machine does
in a window falls on both; shown: CPU per call (and throughput) against off's in the same
window. For a count that does not move with the machine at all: bench_ops_instructions.py. The target (issue 10): metrics and tracing cost
< 5 % of creation throughput (metrics+tracing ÷ off >= 0.95). Without the `otel` extra
installed, tracing stays off and the table says so.

"off" is today's code with the switches off, not the code before operations existed: the
Observer seam, the text-mode lifecycle observer and the trace-context propagation still run
(a few microseconds per creation, measured in-process, against a floor near a millisecond).
"""

from __future__ import annotations

import http.server
import importlib.util
import multiprocessing
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402

from bench.bench_hot_path import (  # noqa: E402  (the window and round settings are the hot path bench's)
    CLIENTS,
    ROUNDS,
    SECONDS,
    WARM_S,
    WARMUP,
    purge,
    raise_fd_limit,
    rotated,
    say,
)
from bench.hot_path_harness import Sample, interleaved, is_task, many_clients, tool_call  # noqa: E402
from tests.support import POSTGRES_URL, REDIS_URL, Backend, Deployment, fresh_postgres_database  # noqa: E402

RUNS = int(os.environ.get("BENCH_RUNS", "5"))
SCRAPE_S = float(os.environ.get("BENCH_SCRAPE_S", "1"))
APP = "bench.hot_path_app"


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of process `pid` so far (/proc/<pid>/stat, fields 14 and 15)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class _Sink(http.server.BaseHTTPRequestHandler):
    """An OTLP/HTTP endpoint that takes every export and answers 200 (what a healthy collector does),
    on HTTP/1.1 connections kept open between exports, as a collector's are."""

    protocol_version = "HTTP/1.1"
    received: Any = None  # the shared counter of exports, set in the sink's process

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        with self.received.get_lock():
            self.received.value += 1
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *_: object) -> None:
        pass


def _serve_sink(port: Any, received: Any) -> None:
    _Sink.received = received
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Sink)
    port.value = server.server_address[1]
    server.serve_forever()


def otlp_sink() -> tuple[multiprocessing.Process, str, Any]:
    """The sink in a process of its own: (the process, its endpoint, the count of exports it took)."""
    port, received = multiprocessing.Value("i", 0), multiprocessing.Value("i", 0)
    process = multiprocessing.Process(target=_serve_sink, args=(port, received), daemon=True)
    process.start()
    deadline = time.monotonic() + 10
    while not port.value and time.monotonic() < deadline:
        time.sleep(0.01)
    return process, f"http://127.0.0.1:{port.value}", received


COMMON = {"MCP_TASKS_MAX_ROWS": "none", "MCP_TASKS_WORKER_METRICS_PORT": "off"}
"""Every configuration's: no row cap (the run creates many), no worker metrics port (no worker runs)."""


def configurations(endpoint: str, tracing: bool) -> dict[str, dict[str, str]]:
    """Each configuration's environment, by name; `endpoint` is the OTLP sink's."""
    off = {"MCP_TASKS_METRICS": "off", "MCP_TASKS_TRACING": "off", "MCP_TASKS_LOG_FORMAT": "text"}
    traced = {
        "MCP_TASKS_TRACING": "otlp" if tracing else "off",
        "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
        "OTEL_BSP_SCHEDULE_DELAY": "500",
    }
    return {
        "off": off,
        "metrics": {**off, "MCP_TASKS_METRICS": "on"},
        "metrics+tracing": {**off, "MCP_TASKS_METRICS": "on", **traced},
        "metrics+tracing 10 %": {
            **off,
            "MCP_TASKS_METRICS": "on",
            **traced,
            "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
            "OTEL_TRACES_SAMPLER_ARG": "0.1",
        },
        "json logs": {**off, "MCP_TASKS_LOG_FORMAT": "json"},
    }


class Scraper:
    """Scrapes `/metrics` every `SCRAPE_S` while a run goes on, so the scrape's cost is in the figure."""

    def __init__(self, url: str) -> None:
        self.url, self.stop, self.scrapes = url.rsplit("/mcp", 1)[0] + "/metrics", threading.Event(), 0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(timeout=5) as client:
            while not self.stop.wait(SCRAPE_S):
                if client.get(self.url).status_code == 200:
                    self.scrapes += 1

    def __enter__(self) -> Scraper:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        self.thread.join()


def at_once(pair: tuple[str, str], factories: dict[str, Any], pids: dict[str, int]) -> tuple[float, float]:
    """Two processes under load in the same window, half the clients each: (ops/s, CPU per call) of the
    second against the first."""
    base, other = pair
    samples: dict[str, Sample] = {}
    before = {name: cpu_s(pids[name]) for name in pair}

    def load(name: str) -> None:
        samples[name] = many_clients(factories[name], max(CLIENTS // 2, 1), SECONDS, WARM_S)

    threads = [threading.Thread(target=load, args=(name,)) for name in pair]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    per_call = {name: (cpu_s(pids[name]) - before[name]) / max(samples[name].calls, 1) for name in pair}
    return samples[other].ops_s / samples[base].ops_s, per_call[other] / per_call[base]


def main() -> None:
    if not (POSTGRES_URL and REDIS_URL):
        print("bench_ops_overhead: set MCP_TASKS_TEST_POSTGRES_URL and MCP_TASKS_TEST_REDIS_URL")
        sys.exit(2)
    raise_fd_limit()
    tracing = importlib.util.find_spec("opentelemetry.sdk") is not None
    sink, endpoint, exports = otlp_sink()
    began = time.perf_counter()
    names = ["off", "metrics", "metrics+tracing", "metrics+tracing 10 %", "json logs"]
    replicas = [f"{name}/{r}" for name in names for r in "ab"]  # two processes of each: their spread is the noise
    many: dict[str, list[Sample]] = {name: [] for name in replicas}
    one: dict[str, list[Sample]] = {name: [] for name in replicas}
    cpu: dict[str, list[float]] = {name: [] for name in replicas}  # serve process CPU seconds per call, per window
    paired: dict[str, list[tuple[float, float]]] = {name: [] for name in [*names[1:], "(noise)"]}
    scrapes = 0
    with tempfile.TemporaryDirectory(prefix="bench-ops-") as tmp, fresh_postgres_database(POSTGRES_URL) as db:
        backend = Backend("pg_redis", {"MCP_TASKS_DATABASE_URL": db, "CELERY_BROKER_URL": REDIS_URL})
        deployment = Deployment(APP, backend, Path(tmp))
        try:
            configs = configurations(endpoint, tracing)
            urls = {
                replica: deployment.web(f"web-{n}", **configs[replica[:-2]], **COMMON)
                for n, replica in enumerate(replicas)
            }
            pids = {name: proc.popen.pid for name, proc in zip(urls, deployment.procs[-len(urls) :], strict=True)}
            factories = {name: tool_call(url, "noop", is_task) for name, url in urls.items()}
            scrapers = [Scraper(urls[f"{name}/{r}"]) for name in ("metrics", "metrics+tracing") for r in "ab"]
            for scraper in scrapers:
                scraper.__enter__()
            try:
                for name in replicas:  # every process's first calls (pools, caches) before anything is timed
                    many_clients(factories[name], CLIENTS, 1, WARM_S)
                for run in range(RUNS):
                    for name in rotated(replicas, run):
                        before = cpu_s(pids[name])
                        sample = many_clients(factories[name], CLIENTS, SECONDS, WARM_S)
                        cpu[name].append((cpu_s(pids[name]) - before) / max(sample.calls, 1))
                        many[name].append(sample)
                    for name, sample in interleaved(factories, ROUNDS, WARMUP).items():
                        one[name].append(sample)
                    say(f"run {run + 1}/{RUNS}: " + ", ".join(f"{n} {many[n][-1].ops_s:.0f}" for n in replicas))
                for run in range(RUNS):
                    side = "ab"[run % 2]  # each configuration's two processes take turns against off's
                    for name in [*rotated(names[1:], run), "(noise)"]:
                        pair = ("off/a", "off/b") if name == "(noise)" else (f"off/{side}", f"{name}/{side}")
                        paired[name].append(at_once(pair, factories, pids))
                    say(f"paired run {run + 1}/{RUNS}: " + ", ".join(f"{n} {paired[n][-1][1]:.3f}" for n in paired))
            finally:
                for scraper in scrapers:
                    scraper.__exit__()
            scrapes = sum(scraper.scrapes for scraper in scrapers)
        except BaseException:
            say(deployment.logs()[-4000:])
            raise
        finally:
            deployment.stop()
            purge(deployment.queue)
            sink.terminate()
    print(
        f"bench_ops_overhead: task creation, PostgreSQL + Redis, {RUNS} runs; tracing: "
        f"{'otlp, batched to a local sink' if tracing else 'NOT measured (otel extra missing)'}; ratio ÷ off"
    )
    print(
        f"{'':28}{'ops/s':>8}{'÷ off':>8}  runs        {'1 client p50 ms':>16}{'÷ off':>8}"
        f"{'CPU us/call':>13}{'÷ off':>8}"
    )

    def pooled(values: dict[str, list[float]], name: str) -> list[float]:
        """Per run, the mean of the configuration's two processes."""
        return [(a + b) / 2 for a, b in zip(values[f"{name}/a"], values[f"{name}/b"], strict=True)]

    ops_of = {name: [s.ops_s for s in samples] for name, samples in many.items()}
    p50_of = {name: [s.p50_ms for s in samples] for name, samples in one.items()}
    rows = [(name, pooled(ops_of, name), pooled(p50_of, name), pooled(cpu, name)) for name in names]
    rows.append(("(noise: off/b ÷ off/a)", ops_of["off/b"], p50_of["off/b"], cpu["off/b"]))
    base = (ops_of["off/a"], p50_of["off/a"], cpu["off/a"])
    for name, ops, p50, per_call in rows:
        ref = base if name.startswith("(noise") else rows[0][1:]
        ops_r = [b / a for a, b in zip(ref[0], ops, strict=True)]
        p50_r = [b / a for a, b in zip(ref[1], p50, strict=True)]
        cpu_r = [b / a for a, b in zip(ref[2], per_call, strict=True)]
        print(
            f"{name:28}{statistics.median(ops):8.0f}{statistics.median(ops_r):8.3f}  "
            f"{min(ops_r):.2f}-{max(ops_r):.2f}  {statistics.median(p50):16.2f}{statistics.median(p50_r):8.3f}"
            f"{statistics.median(per_call) * 1e6:13.0f}{statistics.median(cpu_r):8.3f}"
        )
    print(
        f"paired: off and the configuration serving at once, {CLIENTS // 2} clients each, {RUNS} windows of "
        f"{SECONDS:g} s: the machine's noise falls on both"
    )
    print(f"{'':28}{'ops/s ÷ off':>12}  runs        {'CPU/call ÷ off':>15}  runs")
    for name, ratios in paired.items():
        label = "(noise: off/b ÷ off/a)" if name == "(noise)" else name
        ops_r, cpu_r = [r[0] for r in ratios], [r[1] for r in ratios]
        print(
            f"{label:28}{statistics.median(ops_r):12.3f}  {min(ops_r):.2f}-{max(ops_r):.2f}"
            f"{statistics.median(cpu_r):17.3f}  {min(cpu_r):.3f}-{max(cpu_r):.3f}"
        )
    print(f"/metrics scrapes during the runs: {scrapes}; OTLP exports received: {exports.value}")
    print(f"({time.perf_counter() - began:.0f} s)")


if __name__ == "__main__":
    main()
