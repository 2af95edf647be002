"""What metrics, tracing and JSON logs cost on task creation, counted in instructions (valgrind).

    python bench/bench_ops_instructions.py [--calls 400] [--parallel 2]

bench_ops_overhead.py times the configurations; on a shared 2-core machine two identical
processes differ by up to 10 % there, so it cannot resolve the 5 % the target is about.
This one counts what the serve process executes: each configuration's serve process runs
under `valgrind --tool=callgrind`, which counts every instruction of every thread of the
process (the span exporter's thread and the metrics included), whatever else the
machine is doing. Counted: the instructions per creation over BENCH_INSTR_CALLS (2 048)
creations from 4 closed-loop clients, after 1 536 warm-up calls (every lazy import, the
exporter's first requests and the first scrapes done by then); the counter is zeroed
before the window and dumped after it (`callgrind_control -z / -d`). PYTHONHASHSEED is
fixed; two processes of `off` show what is left of the noise.

On a web process that is CPU-bound at load (bench_hot_path's 8 clients), throughput is
inversely proportional to the CPU per creation, so at equal instructions per cycle a
configuration costs `instructions ÷ off - 1` of throughput. Caches and the span thread's
GIL hand-offs are not in a count: the timed bench is the check on those.

Time-driven work is made count-driven, so the count does not depend on how slow valgrind
makes the process (at ~50x slower, a 500 ms span batch would hold one span and the
exporter's per-request cost would be counted per creation):
- spans leave in batches by size only (OTEL_BSP_MAX_EXPORT_BATCH_SIZE, and a schedule longer
  than the run), of the size a busy process sends: 512 (the SDK's default: at 400 creations
  a second the queue holds 512 spans long before the 5 s schedule) when every call is
  traced, 64 at 10 % (40 spans a second would leave ~200 at a time: the exporter's
  per-request cost is counted here three times as often as it is paid there). The window
  (BENCH_INSTR_CALLS, 2 048 creations, after 1 536 warm-up calls: whole batches) holds its own
  spans' exports, 4 of 512 when every call is traced; the counter is read once the sink (one
  per counted process, HTTP/1.1 as a collector is) has taken no export for 2 s;
- the GIL's switch interval is 250 ms, not 5 ms (a `sitecustomize` on the counted process's
  path): at valgrind's speed 5 ms is a few hundred native microseconds, and the forced
  hand-offs between the event loop and the store's threads would depend on the machine's
  load and on each configuration's speed (counts moved by 1.5 % with how many ran at once);
- `/metrics` is scraped once every BENCH_INSTR_SCRAPE_EVERY (200) creations (Prometheus every
  15 s at bench_hot_path's 400 creations/s is once every 6 000).

Needs valgrind (Debian's package), MCP_TASKS_TEST_POSTGRES_URL and MCP_TASKS_TEST_REDIS_URL.
Takes ~7 minutes per configuration on 2 cores (`--parallel 2` runs two at once).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402

from bench.bench_hot_path import purge, raise_fd_limit, say  # noqa: E402
from bench.bench_ops_overhead import APP, COMMON, configurations, otlp_sink  # noqa: E402
from bench.hot_path_harness import is_task, tool_call  # noqa: E402
from tests.support import (  # noqa: E402
    POSTGRES_URL,
    REDIS_URL,
    Backend,
    Proc,
    _port_open,
    free_port,
    fresh_postgres_database,
    process_env,
    spawn,
    wait_until,
)

CALLS = int(os.environ.get("BENCH_INSTR_CALLS", "2048"))
TARGET = 1.05
"""The operations issue's bound: metrics and tracing cost under 5 % of a creation against off."""
WARMUP = (
    1536  # 3 batches of 512, ~2 of 64 at 10 %: the exporter's first requests (lazy imports, the connection) are done
)
BATCH = {"metrics+tracing 10 %": "64"}
"""Span batch sizes (OTEL_BSP_MAX_EXPORT_BATCH_SIZE) where not the SDK's 512 (see above)."""
CLIENTS = 4
SCRAPE_EVERY = int(os.environ.get("BENCH_INSTR_SCRAPE_EVERY", "200"))
SETTLE_S = 1.0  # the last answers' own work (a hint's delivery) before the counter is read
BY_SIZE = {
    "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "512",
    "OTEL_BSP_MAX_QUEUE_SIZE": "8192",
    "OTEL_BSP_SCHEDULE_DELAY": "3600000",
}
QUIET_S = 2.0  # the sink took no export for this long: the window's last batch is sent


SITECUSTOMIZE = "import sys\nsys.setswitchinterval(0.25)\n"
"""On the counted process's path: 250 ms of valgrind's time is ~5 ms of native time, the default interval."""


def start_counted(name: str, backend: Backend, env: dict[str, str], out: Path) -> tuple[Proc, str]:
    """A serve process under callgrind; its URL once it listens (imports take ~1 minute there)."""
    port = free_port()
    site = out / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    argv = [
        "valgrind",
        "--tool=callgrind",
        f"--callgrind-out-file={out / name}.%p",
        sys.executable,
        "-m",
        "celery_mcp_tasks.cli",
        "serve",
        APP,
        "--port",
        str(port),
        "--log-level",
        "warning",
    ]
    proc = spawn(name, argv, process_env(backend, PYTHONHASHSEED="0", PYTHONPATH=str(site), **env), out)
    wait_until(lambda: _port_open(port) or proc.popen.poll() is not None, 900, f"{name} to listen under valgrind")
    if proc.popen.poll() is not None:
        raise RuntimeError(f"{name} exited:\n{proc.text()[-3000:]}")
    return proc, f"http://127.0.0.1:{port}/mcp"


def _control(flag: str, pid: int) -> None:
    subprocess.run(["callgrind_control", flag, str(pid)], check=True, capture_output=True, timeout=300)


def _dumped_total(out: Path, name: str, pid: int) -> int:
    """The instructions of the last dump: one file, or one per thread (VALGRIND_OPTS=--separate-threads=yes)."""
    dumps = sorted(out.glob(f"{name}.{pid}.*"), key=lambda p: int(p.name.rsplit(".", 1)[1].split("-")[0]))
    last = dumps[-1].name.rsplit(".", 1)[1].split("-")[0]
    total = 0
    for dump in out.glob(f"{name}.{pid}.{last}*"):
        total += next((int(line.split()[1]) for line in dump.read_text().splitlines() if line.startswith("totals:")), 0)
    return total


def _calls(url: str, count: int, scrape: bool) -> None:
    """`count` creations from CLIENTS closed-loop threads; a /metrics scrape every SCRAPE_EVERY of them."""
    remaining = iter(range(count))
    lock = threading.Lock()
    metrics_url = url.rsplit("/mcp", 1)[0] + "/metrics"
    errors: list[BaseException] = []

    def client() -> None:
        call, close = tool_call(url, "noop", is_task)()
        try:
            with httpx.Client(timeout=300) as scraper:
                while True:
                    with lock:
                        n = next(remaining, None)
                    if n is None or errors:
                        return
                    call()
                    if scrape and n % SCRAPE_EVERY == SCRAPE_EVERY - 1:
                        scraper.get(metrics_url).raise_for_status()
        except BaseException as exc:  # noqa: BLE001 - reported by the caller
            errors.append(exc)
        finally:
            close()

    threads = [threading.Thread(target=client, daemon=True) for _ in range(CLIENTS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]


def _settled(exports: Any) -> None:
    """Once the last answers' own work is done (a hint's delivery) and the sink took no export for QUIET_S."""
    time.sleep(SETTLE_S)
    seen, quiet_since = exports.value, time.monotonic()
    while time.monotonic() - quiet_since < QUIET_S:
        time.sleep(0.2)
        if exports.value != seen:
            seen, quiet_since = exports.value, time.monotonic()


def count(name: str, env: dict[str, str], backend: Backend, out: Path, calls: int) -> tuple[float, int]:
    """Instructions per creation of one configuration's serve process, and the window's span exports."""
    sink, endpoint, exports = otlp_sink()  # its own: "no export for 2 s" is this process's
    env = {**env, "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint} if "OTEL_EXPORTER_OTLP_ENDPOINT" in env else env
    proc, url = start_counted(name.replace(" ", "_").replace("%", "pc").replace("/", "-"), backend, env, out)
    try:
        scrape = env.get("MCP_TASKS_METRICS") == "on"
        _calls(url, WARMUP, scrape)
        _settled(exports)
        _control("-z", proc.popen.pid)
        began, before = time.perf_counter(), exports.value
        _calls(url, calls, scrape)
        _settled(exports)
        _control("-d", proc.popen.pid)
        total = _dumped_total(out, proc.name, proc.popen.pid)
        say(f"{name}: {total / calls / 1e6:.2f} M instructions per creation ({time.perf_counter() - began:.0f} s)")
        return total / calls, exports.value - before
    finally:
        proc.stop(timeout=120)
        sink.terminate()


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--calls", type=int, default=CALLS)
    parser.add_argument("--parallel", type=int, default=2, help="configurations counted at once")
    parser.add_argument("--only", action="append", help="count only this configuration (repeatable; off/a is always)")
    parser.add_argument("--keep", type=Path, help="keep the callgrind dumps here, for callgrind_annotate")
    args = parser.parse_args()
    if not (POSTGRES_URL and REDIS_URL):
        print("bench_ops_instructions: set MCP_TASKS_TEST_POSTGRES_URL and MCP_TASKS_TEST_REDIS_URL")
        sys.exit(2)
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        print("bench_ops_instructions: needs valgrind (apt-get install valgrind)")
        sys.exit(2)
    raise_fd_limit()
    tracing = importlib.util.find_spec("opentelemetry.sdk") is not None
    began = time.perf_counter()
    configs = configurations("http://127.0.0.1:9", tracing)  # each counted process gets a sink of its own
    runs = {"off/a": configs["off"], **{n: c for n, c in configs.items() if n != "off"}, "off/b": configs["off"]}
    runs = {
        n: {**c, **BY_SIZE, **({"OTEL_BSP_MAX_EXPORT_BATCH_SIZE": BATCH[n]} if n in BATCH else {})}
        for n, c in runs.items()
        if n == "off/a" or not args.only or n in args.only
    }
    with tempfile.TemporaryDirectory(prefix="bench-instr-") as tmp, fresh_postgres_database(POSTGRES_URL) as db:
        out = args.keep or Path(tmp)
        out.mkdir(parents=True, exist_ok=True)
        queue = f"bench-instr-{os.getpid()}"
        backend = Backend("pg_redis", {"MCP_TASKS_DATABASE_URL": db, "CELERY_BROKER_URL": REDIS_URL})
        env = {"MCP_TASKS_QUEUE": queue, **COMMON}
        try:
            with ThreadPoolExecutor(args.parallel) as pool:
                futures = {n: pool.submit(count, n, {**env, **c}, backend, out, args.calls) for n, c in runs.items()}
                counted = {name: future.result() for name, future in futures.items()}
        finally:
            purge(queue)
    per_call = {name: value for name, (value, _) in counted.items()}
    base = per_call["off/a"]
    print(
        f"bench_ops_instructions: task creation, PostgreSQL + Redis, serve process under callgrind, "
        f"{args.calls} creations from {CLIENTS} clients; tracing "
        f"{'otlp, batched to a local sink' if tracing else 'NOT measured (otel extra missing)'}"
    )
    print(f"{'':28}{'M instr/creation':>18}{'÷ off':>8}{'span exports':>14}{'under 5 %':>11}")
    for name, value in per_call.items():
        if name == "off/a":
            continue
        label = "(noise: off/b ÷ off/a)" if name == "off/b" else name
        verdict = "" if name == "off/b" else ("yes" if value / base < TARGET else "NO")
        print(f"{label:28}{value / 1e6:18.2f}{value / base:8.3f}{counted[name][1]:14}{verdict:>11}")
    print(f"{'off':28}{base / 1e6:18.2f}{1:8.3f}{counted['off/a'][1]:14}")
    print(f"({time.perf_counter() - began:.0f} s)")


if __name__ == "__main__":
    main()
