"""A guest in the user's process: importing the package and constructing `McpTasks` with its defaults
changes nothing process-wide (no environment variable, no other library's global table, no global
tracer provider, no registered collector, no atexit hook, no listening socket, no route on the MCP app, no task on another Celery app,
no root logging handler or level, no filter on another library's logger, no warnings filter, no signal handler,
no fork hook, no thread, no file in the working directory), and loads no operations module (the `ops`
package itself only names them).

Run in a fresh interpreter: this test process has long since imported and configured all of it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import ROOT

pytestmark = pytest.mark.integration

PROBE = r"""
import atexit, json, logging, os, signal, sys, threading, warnings

def listening():
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        inodes = {row.split()[9] for row in rows if row.split()[3] == "0A"}  # 0A: LISTEN
        for fd in os.listdir("/proc/self/fd"):
            try:
                target = os.readlink(f"/proc/self/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:[") and target[8:-1] in inodes:
                found.add(target)
    return sorted(found)

def filters():
    # the filters on every logger but this package's own (kombu's, Celery's, the SDK's, ...)
    found = {}
    for name, logger in sorted(logging.root.manager.loggerDict.items()):
        if isinstance(logger, logging.Logger) and logger.filters and not name.startswith("celery_mcp_tasks"):
            found[name] = [type(f).__name__ for f in logger.filters]
    return found

def state():
    from kombu.transport import TRANSPORT_ALIASES
    from opentelemetry import trace
    from prometheus_client import REGISTRY

    root = logging.getLogger()
    return {
        "root_handlers": [repr(h) for h in root.handlers],
        "root_level": root.level,
        "filters": filters(),
        "warnings": [repr(f) for f in warnings.filters],
        "signals": {s.name: repr(signal.getsignal(s)) for s in signal.valid_signals() if isinstance(s, signal.Signals)},
        "excepthook": repr(sys.excepthook),
        "threads": sorted(t.name for t in threading.enumerate()),
        "cwd": [os.getcwd(), sorted(os.listdir("."))],
        "environ": dict(os.environ),
        "aliases": dict(TRANSPORT_ALIASES),
        "provider": type(trace.get_tracer_provider()).__name__,
        "collectors": sorted(map(repr, REGISTRY._collector_to_names)),
        "atexit": atexit._ncallbacks(),
        "listening": listening(),
        "fork_hooks": len(fork_hooks),
        "ops_modules": sorted(name for name in sys.modules if name.startswith("celery_mcp_tasks.ops.")),
    }

# The dependencies first: what their own imports do (e.g. the stdlib's one atexit hook for
# `weakref.finalize`, which SQLAlchemy's import creates) is theirs, not this package's.
import celery, kombu, sqlalchemy, starlette.applications, mcp.server  # noqa: E401

fork_hooks = []  # os.register_at_fork keeps no list we could read: count the calls from here on
_register_at_fork = os.register_at_fork
os.register_at_fork = lambda **hooks: (fork_hooks.append(sorted(hooks)), _register_at_fork(**hooks))[1]

before = state()
import celery_mcp_tasks
from celery_mcp_tasks import McpTasks
from celery_mcp_tasks.app import internals

tasks = McpTasks("guest-" + sys.argv[1])

@tasks.mcp_task
def report() -> str:
    return "ok"

app = tasks.asgi_app()
paths = sorted(getattr(route, "path", "") for route in app.routes)
constructed = state()  # the working directory before the store is built (the embedded store is a file there)
internals(tasks).service()  # the store built: nothing process-wide but the fork hook its engine needs
after = state()
other = celery.Celery("another-app-in-the-process", set_as_current=False)  # e.g. the user's own
other.finalize()
print(json.dumps({"before": before, "constructed": constructed, "after": after, "paths": paths, "plugins": len(internals(tasks).plugins),
                  "other_tasks": sorted(name for name in other.tasks if not name.startswith("celery."))}))
"""


@pytest.mark.parametrize("broker", ["embedded", "redis"])
def test_importing_and_constructing_changes_nothing_process_wide(broker: str, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MCP_TASKS_", "CELERY_", "PROMETHEUS_", "OTEL_"))}
    env.update(PYTHONPATH=f"{ROOT / 'src'}:{ROOT}")  # the default data directory: under the working directory
    if broker == "redis":
        env["CELERY_BROKER_URL"] = "redis://127.0.0.1:1/0"  # never connected to: construction connects nothing
        env["MCP_TASKS_DATABASE_URL"] = f"sqlite:///{tmp_path / 'tasks.db'}"
    cwd = tmp_path / "empty"
    cwd.mkdir()
    done = subprocess.run(
        [sys.executable, "-c", PROBE, broker], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    before, constructed, after = seen["before"], seen["constructed"], seen["after"]
    assert constructed["cwd"] == before["cwd"] == [str(cwd), []], "constructing made files in the working directory"
    for name in ("root_handlers", "root_level", "filters", "warnings", "signals", "excepthook", "threads"):
        assert after[name] == before[name], name
    assert after["environ"] == before["environ"]
    assert after["aliases"] == before["aliases"]
    assert after["provider"] == before["provider"] == "ProxyTracerProvider"
    assert after["collectors"] == before["collectors"]
    assert after["atexit"] == before["atexit"]
    assert after["listening"] == before["listening"] == []
    assert constructed["fork_hooks"] == before["fork_hooks"] == 0, "importing or constructing registered a fork hook"
    assert after["fork_hooks"] == 1  # the store's engine: a forked child must not share its connections
    assert constructed["ops_modules"] == after["ops_modules"] == [], "an operations module was loaded"
    assert seen["plugins"] == 0
    assert seen["other_tasks"] == [], "a tool was registered on every Celery app in the process"
    assert not {"/metrics", "/healthz", "/readyz"} & set(seen["paths"]), seen["paths"]
