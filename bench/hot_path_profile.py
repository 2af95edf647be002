"""Where a creation's time goes (`bench/bench_hot_path.py --profile`), against the floor's.

On a second web process of the same deployment, started with BENCH_COUNT=1 (see
bench/hot_path_app.py): per call, the SQL statements, transactions, pool checkouts,
thread-pool hops and Redis writes it makes; then, with N clients, the web process's
CPU per call (/proc utime+stime), split by package from a py-spy recording
(each sample goes to the nearest frame, from the leaf up, of a package listed here).
Not part of the table: the counters and the sampler cost a little on every call.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from bench.hot_path_harness import Factory, is_task, many_clients, says, tool_call
from tests.support import Deployment, McpHttp

CATEGORIES = {
    "sqlalchemy": "SQL (SQLAlchemy, psycopg)",
    "psycopg": "SQL (SQLAlchemy, psycopg)",
    "psycopg_pool": "SQL (SQLAlchemy, psycopg)",
    "celery": "publish (Celery, kombu, redis-py)",
    "kombu": "publish (Celery, kombu, redis-py)",
    "redis": "publish (Celery, kombu, redis-py)",
    "vine": "publish (Celery, kombu, redis-py)",
    "json": "JSON and validation (json, pydantic)",
    "pydantic": "JSON and validation (json, pydantic)",
    "pydantic_core": "JSON and validation (json, pydantic)",
    "mcp": "SDK dispatch (mcp, mcp_types)",
    "mcp_types": "SDK dispatch (mcp, mcp_types)",
    "uvicorn": "HTTP (uvicorn, h11, starlette, sse)",
    "h11": "HTTP (uvicorn, h11, starlette, sse)",
    "httptools": "HTTP (uvicorn, h11, starlette, sse)",
    "starlette": "HTTP (uvicorn, h11, starlette, sse)",
    "sse_starlette": "HTTP (uvicorn, h11, starlette, sse)",
    "asyncio": "event loop and thread hops (asyncio, anyio, threading)",
    "anyio": "event loop and thread hops (asyncio, anyio, threading)",
    "threading.py": "event loop and thread hops (asyncio, anyio, threading)",
    "concurrent": "event loop and thread hops (asyncio, anyio, threading)",
    "selectors.py": "event loop and thread hops (asyncio, anyio, threading)",
    "queue.py": "event loop and thread hops (asyncio, anyio, threading)",
    "logging": "logging",
    "celery_mcp_tasks": "celery_mcp_tasks itself",
    "bench": "the bench app (floor tool)",
}
_FIRST = ("celery_mcp_tasks", "bench")  # checked before `mcp`: our files live under celery_mcp_tasks/mcp/


def _category(frame: str) -> str | None:
    """`func (path/to/file.py:line)` -> its category, by the package names in its path."""
    path = frame.rsplit(" (", 1)[-1].rsplit(":", 1)[0]
    parts = path.split("/")
    for name in _FIRST:
        if name in parts:
            return CATEGORIES[name]
    for part in parts:
        if part in CATEGORIES:
            return CATEGORIES[part]
    return None


def split_samples(raw: str) -> Counter[str]:
    """py-spy's raw (collapsed) stacks -> samples per category."""
    counts: Counter[str] = Counter()
    for line in raw.splitlines():
        stack, _, number = line.rpartition(" ")
        if not stack or not number.isdigit():
            continue
        frames = stack.split(";")
        found = next((c for c in map(_category, reversed(frames)) if c is not None), "other (stdlib, C)")
        counts[found] += int(number)
    return counts


def _cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / 100  # utime + stime, in clock ticks (100/s)


def _counters(http: McpHttp) -> dict[str, int]:
    result = http.call_tool("bench_counters")["result"]
    found: Any = result.get("structuredContent") or {}
    if isinstance(found.get("result"), dict):
        found = found["result"]
    return {str(k): int(v) for k, v in found.items()}


def _py_spy() -> str | None:
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.exists() else shutil.which("py-spy")


def profile(deployment: Deployment, logs: Path, clients: int, seconds: float) -> list[str]:
    url = deployment.web("web-profile", MCP_TASKS_MAX_ROWS="none", BENCH_COUNT="1")
    pid = deployment.procs[-1].popen.pid
    paths: dict[str, tuple[str, Factory]] = {
        "floor": ("floor", tool_call(url, "floor", says("sent"))),
        "creation": ("noop", tool_call(url, "noop", is_task)),
    }
    lines = [f"where the time goes (profile pass, second web process; {clients} clients for {seconds:g} s each)"]
    http = McpHttp(url)
    per_call: dict[str, dict[str, float]] = {}
    try:
        for name, (tool, _) in paths.items():
            for n in range(30):
                http.call_tool(tool, {"n": n})
            _counters(http)
            calls = 200
            for n in range(calls):
                http.call_tool(tool, {"n": n})
            per_call[name] = {k: v / calls for k, v in _counters(http).items()}
    finally:
        http.close()
    keys = sorted({k for counts in per_call.values() for k in counts})
    lines.append(f"  {'per call':<34}{'floor':>10}{'creation':>10}")
    for key in keys:
        lines.append(f"  {key:<34}{per_call['floor'].get(key, 0):>10.2f}{per_call['creation'].get(key, 0):>10.2f}")

    spy = _py_spy()
    if spy is None:
        lines.append("  py-spy not found (pip install py-spy): no CPU split")
        return lines
    split: dict[str, Counter[str]] = {}
    cpu_ms: dict[str, float] = {}
    for name, (_, factory) in paths.items():
        out = logs / f"py-spy-{name}.txt"
        argv = [spy, "record", "--pid", str(pid), "--duration", str(int(seconds) + 2), "--rate", "200"]
        recorder = subprocess.Popen(
            [*argv, "--format", "raw", "--output", str(out), "--nonblocking"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        time.sleep(0.7)  # attached before the clients start
        before = _cpu_s(pid)
        sample = many_clients(factory, clients, seconds, 0.0)
        cpu_ms[name] = (_cpu_s(pid) - before) * 1e3 / (sample.ops_s * seconds)
        _, err = recorder.communicate(timeout=60)
        if recorder.returncode != 0 or not out.exists():
            lines.append(f"  py-spy failed: {err.decode(errors='replace').strip().splitlines()[-1:]}")
            return lines
        split[name] = split_samples(out.read_text())
    lines.append(f"  web-process CPU ms per call{'':<27}{'floor':>8}{'creation':>10}{'extra':>8}")
    cats = sorted({c for s in split.values() for c in s}, key=lambda c: -split["creation"].get(c, 0))
    for cat in ["all", *cats]:
        values = []
        for name in paths:
            total = sum(split[name].values()) or 1
            share = 1.0 if cat == "all" else split[name].get(cat, 0) / total
            values.append(share * cpu_ms[name])
        lines.append(f"    {cat:<52}{values[0]:>8.3f}{values[1]:>10.3f}{values[1] - values[0]:>+8.3f}")
    return lines
