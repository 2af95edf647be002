"""Test support: real web and worker processes, and a raw HTTP MCP client.

Backends: `embedded` (SQLite + Celery's filesystem broker in a temp dir, no
servers) always runs; `pg_redis` runs when MCP_TASKS_TEST_POSTGRES_URL and
MCP_TASKS_TEST_REDIS_URL are set (CI sets them and fails if they are missing).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import sqlalchemy as sa

ROOT = Path(__file__).resolve().parent.parent
EXT = "io.modelcontextprotocol/tasks"
PROTOCOL = "2026-07-28"
TERMINAL = ("completed", "failed", "cancelled")

POSTGRES_URL = os.environ.get("MCP_TASKS_TEST_POSTGRES_URL")
REDIS_URL = os.environ.get("MCP_TASKS_TEST_REDIS_URL")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def fresh_postgres_database(base_url: str) -> Iterator[str]:
    """A new, empty database on the test server, dropped afterwards."""
    name = f"mcp_tasks_test_{uuid.uuid4().hex[:12]}"
    admin = sa.create_engine(base_url.replace("postgresql://", "postgresql+psycopg://", 1), isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    url = sa.engine.make_url(base_url).set(database=name).render_as_string(hide_password=False)
    try:
        yield url
    finally:
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@dataclass
class Backend:
    name: str
    env: dict[str, str]

    @property
    def store_url(self) -> str:
        from celery_mcp_tasks.config import Settings

        return Settings.from_env(self.env).store_url


def process_env(backend: Backend, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MCP_TASKS_", "CELERY_"))}
    env.update(backend.env)
    env.update(extra)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env["PYTHONUNBUFFERED"] = "1"
    return env


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def stop(self, timeout: float = 15) -> None:
        if self.popen.poll() is not None:
            return
        self.popen.send_signal(signal.SIGTERM)
        try:
            self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.popen.pid, signal.SIGKILL)
            self.popen.wait(timeout=5)


def spawn(name: str, argv: list[str], env: dict[str, str], log_dir: Path) -> Proc:
    log = log_dir / f"{name}.log"
    handle = log.open("wb")
    popen = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=handle, stderr=subprocess.STDOUT, start_new_session=True)
    return Proc(name, popen, log)


def start_web(app: str, backend: Backend, log_dir: Path, name: str = "web", **extra_env: str) -> tuple[Proc, str]:
    port = free_port()
    proc = spawn(
        name,
        [sys.executable, "-m", "celery_mcp_tasks.cli", "serve", app, "--port", str(port), "--log-level", "warning"],
        process_env(backend, **extra_env),
        log_dir,
    )
    url = f"http://127.0.0.1:{port}/mcp"
    wait_until(lambda: _port_open(port) or _died(proc), 60, f"{name} to listen")
    if proc.popen.poll() is not None:
        raise RuntimeError(f"{name} exited:\n{proc.text()}")
    return proc, url


def start_worker(app: str, backend: Backend, log_dir: Path, name: str = "worker", *, pool: str = "prefork",
                 concurrency: int = 2, beat: bool = False, **extra_env: str) -> Proc:
    argv = [sys.executable, "-m", "celery", "-A", app, "worker", "-P", pool, "-c", str(concurrency),
            "--loglevel", "INFO", "--without-mingle", "--without-gossip", "-n", f"{name}-{uuid.uuid4().hex[:6]}@%h"]
    if beat:
        argv += ["-B", "-s", str(log_dir / f"{name}-beat-schedule")]
    proc = spawn(name, argv, process_env(backend, **extra_env), log_dir)
    wait_until(lambda: " ready." in proc.text() or _died(proc), 60, f"{name} to be ready")
    if proc.popen.poll() is not None:
        raise RuntimeError(f"{name} exited:\n{proc.text()}")
    return proc


def _died(proc: Proc) -> bool:
    return proc.popen.poll() is not None


def _port_open(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.2)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def wait_until(predicate: Any, timeout: float, what: str, interval: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise TimeoutError(f"timed out waiting for {what}")


@dataclass
class McpHttp:
    """A raw 2026-07-28 client: every header and envelope field under the test's control."""

    url: str
    capabilities: dict[str, Any] = field(default_factory=lambda: {"elicitation": {}, "extensions": {EXT: {}}})
    headers: dict[str, str] = field(default_factory=dict)
    _next_id: int = 0

    def __post_init__(self) -> None:
        self.http = httpx.Client(timeout=30, headers=self.headers)

    def close(self) -> None:
        self.http.close()

    def raw(self, method: str, params: dict[str, Any] | None = None, *, name: str | None = None,
            headers: dict[str, str] | None = None, capabilities: dict[str, Any] | None = None) -> httpx.Response:
        self._next_id += 1
        body_params = dict(params or {})
        body_params["_meta"] = {
            "io.modelcontextprotocol/protocolVersion": PROTOCOL,
            "io.modelcontextprotocol/clientCapabilities": self.capabilities if capabilities is None else capabilities,
        }
        sent = {"Accept": "application/json, text/event-stream", "MCP-Protocol-Version": PROTOCOL,
                "Mcp-Method": method}
        if name is not None:
            sent["Mcp-Name"] = name
        sent.update(headers or {})
        body = {"jsonrpc": "2.0", "id": self._next_id, "method": method, "params": body_params}
        return self.http.post(self.url, content=json.dumps(body), headers={**sent, "Content-Type": "application/json"})

    def rpc(self, method: str, params: dict[str, Any] | None = None, **kwargs: Any) -> dict[str, Any]:
        response = self.raw(method, params, **kwargs)
        if response.headers.get("content-type", "").startswith("text/event-stream"):
            for line in response.text.splitlines():
                if line.startswith("data:"):
                    message = json.loads(line[5:])
                    if "id" in message:
                        return message
            raise AssertionError("SSE response without a final message")
        return response.json()

    def call_tool(self, name: str, arguments: dict[str, Any] | None = None, **kwargs: Any) -> dict[str, Any]:
        return self.rpc("tools/call", {"name": name, "arguments": arguments or {}}, name=name, **kwargs)

    def task(self, method: str, task_id: str, **params: Any) -> dict[str, Any]:
        return self.rpc(method, {"taskId": task_id, **params}, name=task_id)

    def get(self, task_id: str) -> dict[str, Any]:
        reply = self.task("tasks/get", task_id)
        assert "result" in reply, reply
        return reply["result"]

    def wait_for(self, task_id: str, *statuses: str, timeout: float = 30) -> dict[str, Any]:
        wanted = statuses or TERMINAL
        return wait_until(lambda: (t := self.get(task_id))["status"] in wanted and t, timeout, f"status {wanted}")

    def create(self, name: str, arguments: dict[str, Any] | None = None) -> str:
        reply = self.call_tool(name, arguments)
        assert reply.get("result", {}).get("resultType") == "task", reply
        return reply["result"]["taskId"]


@dataclass
class Deployment:
    """One app's web process(es) and worker(s) on one backend, on a queue of their own."""

    app: str
    backend: Backend
    log_dir: Path
    queue: str = field(default_factory=lambda: f"mcp-test-{uuid.uuid4().hex[:10]}")
    procs: list[Proc] = field(default_factory=list)
    url: str = ""

    def env(self, **extra: str) -> dict[str, str]:
        return {"MCP_TASKS_QUEUE": self.queue, **extra}

    def web(self, name: str = "web", **extra: str) -> str:
        proc, url = start_web(self.app, self.backend, self.log_dir, name, **self.env(**extra))
        self.procs.append(proc)
        self.url = self.url or url
        return url

    def worker(self, name: str = "worker", **kwargs: Any) -> Proc:
        extra = kwargs.pop("env", {})
        proc = start_worker(self.app, self.backend, self.log_dir, name, **kwargs, **self.env(**extra))
        self.procs.append(proc)
        return proc

    def logs(self) -> str:
        return "\n".join(proc.text() for proc in self.procs)

    def stop(self) -> None:
        for proc in reversed(self.procs):
            proc.stop()

    def __enter__(self) -> Deployment:
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()
