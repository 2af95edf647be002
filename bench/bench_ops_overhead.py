"""What metrics, tracing and JSON logs cost on task creation, measured in one run on PostgreSQL + Redis.

    python bench/bench_ops_overhead.py

Needs MCP_TASKS_TEST_POSTGRES_URL and MCP_TASKS_TEST_REDIS_URL (a fresh database is made
and dropped). Five `celery-mcp-tasks serve bench.hot_path_app` processes on the same
database and Redis, no worker (creation only, as in bench_hot_path.py):

- off: MCP_TASKS_METRICS=off, MCP_TASKS_TRACING=off, text logs: the baseline;
- metrics: every creation counted, `/metrics` scraped every BENCH_SCRAPE_S (1) s during
  the run, as Prometheus would;
- metrics+tracing: the same plus `otlp` tracing (the SDK's tools/call span, our creation
  and send spans, batched to a local OTLP/HTTP sink in this process that answers 200);
- metrics+tracing 10 %: the same with the standard ratio sampler at 0.1
  (OTEL_TRACES_SAMPLER=parentbased_traceidratio), as busy production services trace;
- json logs: off, but MCP_TASKS_LOG_FORMAT=json (uvicorn's access line per request).

Each is measured closed-loop with BENCH_CLIENTS (8) clients for BENCH_SECONDS (4) windows
after BENCH_WARM_S (1), taking turns, the order rotated every run, BENCH_RUNS (5) runs;
and with 1 client, call by call in turns (BENCH_ROUNDS (200) each). Shown: the median of
the runs' ratios to off and their range. The target (issue 10): metrics and tracing cost
< 5 % of creation throughput (metrics+tracing ÷ off >= 0.95). Without the `otel` extra
installed, tracing stays off and the table says so.

"off" is today's code with the switches off, not the code before operations existed: the
Observer seam, the text-mode lifecycle observer and the trace-context propagation still run
(a few microseconds per creation, measured in-process, against a floor near a millisecond).
"""

from __future__ import annotations

import http.server
import importlib.util
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

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


class _Sink(http.server.BaseHTTPRequestHandler):
    """An OTLP/HTTP endpoint that takes every export and answers 200 (what a healthy collector does)."""

    received = 0

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        type(self).received += 1
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *_: object) -> None:
        pass


def otlp_sink() -> tuple[http.server.ThreadingHTTPServer, str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Sink)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


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


def main() -> None:
    if not (POSTGRES_URL and REDIS_URL):
        print("bench_ops_overhead: set MCP_TASKS_TEST_POSTGRES_URL and MCP_TASKS_TEST_REDIS_URL")
        sys.exit(2)
    raise_fd_limit()
    tracing = importlib.util.find_spec("opentelemetry.sdk") is not None
    sink, endpoint = otlp_sink()
    began = time.perf_counter()
    names = ["off", "metrics", "metrics+tracing", "metrics+tracing 10 %", "json logs"]
    many: dict[str, list[Sample]] = {name: [] for name in names}
    one: dict[str, list[Sample]] = {name: [] for name in names}
    scrapes = 0
    with tempfile.TemporaryDirectory(prefix="bench-ops-") as tmp, fresh_postgres_database(POSTGRES_URL) as db:
        backend = Backend("pg_redis", {"MCP_TASKS_DATABASE_URL": db, "CELERY_BROKER_URL": REDIS_URL})
        deployment = Deployment(APP, backend, Path(tmp))
        try:
            common = {"MCP_TASKS_MAX_ROWS": "none", "MCP_TASKS_WORKER_METRICS_PORT": "off"}
            off = {"MCP_TASKS_METRICS": "off", "MCP_TASKS_TRACING": "off", "MCP_TASKS_LOG_FORMAT": "text"}
            traced = {
                "MCP_TASKS_TRACING": "otlp" if tracing else "off",
                "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
                "OTEL_BSP_SCHEDULE_DELAY": "500",
            }
            configs = {
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
            urls = {
                name: deployment.web(f"web-{n}", **config, **common) for n, (name, config) in enumerate(configs.items())
            }
            factories = {name: tool_call(url, "noop", is_task) for name, url in urls.items()}
            scrapers = [Scraper(urls["metrics"]), Scraper(urls["metrics+tracing"])]
            for scraper in scrapers:
                scraper.__enter__()
            try:
                for run in range(RUNS):
                    for name in rotated(names, run):
                        many[name].append(many_clients(factories[name], CLIENTS, SECONDS, WARM_S))
                    for name, sample in interleaved(factories, ROUNDS, WARMUP).items():
                        one[name].append(sample)
                    say(f"run {run + 1}/{RUNS}: " + ", ".join(f"{n} {many[n][-1].ops_s:.0f} ops/s" for n in names))
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
            sink.shutdown()
    print(
        f"bench_ops_overhead: task creation, PostgreSQL + Redis, {RUNS} runs; tracing: "
        f"{'otlp, batched to a local sink' if tracing else 'NOT measured (otel extra missing)'}; ratio ÷ off"
    )
    print(f"{'':28}{'ops/s':>8}{'÷ off':>8}  runs        {'1 client p50 ms':>16}{'÷ off':>8}")
    for name in names:
        ops = [b.ops_s / a.ops_s for a, b in zip(many["off"], many[name], strict=True)]
        p50 = [b.p50_ms / a.p50_ms for a, b in zip(one["off"], one[name], strict=True)]
        print(
            f"{name:28}{statistics.median(s.ops_s for s in many[name]):8.0f}{statistics.median(ops):8.3f}  "
            f"{min(ops):.2f}-{max(ops):.2f}  {statistics.median(s.p50_ms for s in one[name]):16.2f}"
            f"{statistics.median(p50):8.3f}"
        )
    print(f"/metrics scrapes during the runs: {scrapes}; OTLP exports received: {_Sink.received}")
    print(f"({time.perf_counter() - began:.0f} s)")


if __name__ == "__main__":
    main()
