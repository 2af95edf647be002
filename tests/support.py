"""Test support: real web and worker processes, and a raw HTTP MCP client.

Backends: `embedded` (SQLite + Celery's filesystem broker in a temp dir, no
servers) always runs; `pg_redis` runs when MCP_TASKS_TEST_POSTGRES_URL and
MCP_TASKS_TEST_REDIS_URL are set (CI sets them and fails if they are missing).

External programs (promtool, prometheus, haproxy, redis-server, Chromium, npm)
are found through `tool()`: without one, a test skips with the reason and how to
install it, except under MCP_TASKS_TEST_REQUIRE_TOOLS=1 (`.ci/run` sets it after
installing them all), where the same test fails: CI never skips them.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, NoReturn

import httpx
import pytest
import redis
import sqlalchemy as sa

ROOT = Path(__file__).resolve().parent.parent
EXT = "io.modelcontextprotocol/tasks"
PROTOCOL = "2026-07-28"
TERMINAL = ("completed", "failed", "cancelled")

POSTGRES_URL = os.environ.get("MCP_TASKS_TEST_POSTGRES_URL")
REDIS_URL = os.environ.get("MCP_TASKS_TEST_REDIS_URL")
REQUIRE_TOOLS = os.environ.get("MCP_TASKS_TEST_REQUIRE_TOOLS", "") not in ("", "0")


def unavailable(what: str, reason: str) -> NoReturn:
    """Skip a test that needs `what` (an external program) - or fail it where every tool must be there."""
    if REQUIRE_TOOLS:
        pytest.fail(f"{what} unavailable with MCP_TASKS_TEST_REQUIRE_TOOLS set: {reason}")
    pytest.skip(f"{what} unavailable: {reason}")


def tool(name: str, install: str, *, path: str | None = None) -> str:
    """The external program `name` (on PATH, or at `path`), or `unavailable` saying how to `install` it."""
    found = (path if os.access(path, os.X_OK) else None) if path else shutil.which(name)
    if found is None:
        unavailable(name, f"{path or name} is not installed ({install})")
    return found


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def silent_server() -> Iterator[int]:
    """A port whose server accepts connections and never answers (a hung database, a broker gone silent): its
    port. The connections it held are closed on the way out, so whatever still waits on one ends then."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.1)
        while not stop.is_set():
            try:
                accepted.append(server.accept()[0])
            except TimeoutError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1]
    finally:
        stop.set()
        thread.join()
        for conn in accepted:
            conn.close()
        server.close()


@contextmanager
def fresh_postgres_database(base_url: str, options: str = "") -> Iterator[str]:
    """A new, empty database on the test server (`options`: CREATE DATABASE's, e.g. a locale), dropped afterwards."""
    name = f"mcp_tasks_test_{uuid.uuid4().hex[:12]}"
    admin = sa.create_engine(
        base_url.replace("postgresql://", "postgresql+psycopg://", 1), isolation_level="AUTOCOMMIT"
    )
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}" {options}'))
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
    # PROMETHEUS_MULTIPROC_DIR too: a process under test counts where its test says, never where the runner did.
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("MCP_TASKS_", "CELERY_")) and k != "PROMETHEUS_MULTIPROC_DIR"
    }
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
    wait_until(lambda: port_open(port) or _died(proc), 60, f"{name} to listen")
    if proc.popen.poll() is not None:
        raise RuntimeError(f"{name} exited:\n{proc.text()}")
    return proc, url


def start_worker(
    app: str,
    backend: Backend,
    log_dir: Path,
    name: str = "worker",
    *,
    pool: str = "prefork",
    concurrency: int = 2,
    beat: bool = False,
    queues: str | None = None,
    **extra_env: str,
) -> Proc:
    argv = [
        sys.executable,
        "-m",
        "celery",
        "-A",
        app,
        "worker",
        "-P",
        pool,
        "-c",
        str(concurrency),
        "--loglevel",
        "INFO",
        "--without-mingle",
        "--without-gossip",
        "-n",
        f"{name}-{uuid.uuid4().hex[:6]}@%h",
    ]
    if beat:
        argv += ["-B", "-s", str(log_dir / f"{name}-beat-schedule")]
    if queues is not None:
        argv += ["-Q", queues]
    # Many test workers share one machine: none claims the default metrics port unless a test asks.
    extra_env.setdefault("MCP_TASKS_WORKER_METRICS_PORT", "off")
    proc = spawn(name, argv, process_env(backend, **extra_env), log_dir)
    wait_until(lambda: " ready." in proc.text() or _died(proc), 60, f"{name} to be ready")
    if proc.popen.poll() is not None:
        raise RuntimeError(f"{name} exited:\n{proc.text()}")
    return proc


def _died(proc: Proc) -> bool:
    return proc.popen.poll() is not None


def port_open(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.2)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def probe_client() -> httpx.Client:
    """An HTTP client that times `/readyz` and `/healthz` as an orchestrator's probe sees them: a new
    connection per request, but the client built once, outside the timing. `httpx.get` builds a client
    (and its TLS context) per call: on a loaded machine that alone took 0.1-0.5 s of the "2 s" measured."""
    return httpx.Client(timeout=10, limits=httpx.Limits(max_keepalive_connections=0))


def wait_until(predicate: Any, timeout: float, what: str, interval: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise TimeoutError(f"timed out waiting for {what}")


@contextmanager
def served_in_thread(app: Any, host: str = "127.0.0.1") -> Iterator[str]:
    """`app` served by uvicorn (its lifespan on) in a thread of this process, on a free port of `host`; yields
    its base URL (`http://host:port`)."""
    import uvicorn

    sock = socket.socket()
    sock.bind((host, 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        wait_until(lambda: server.started, 10, "the server to start")
        yield f"http://{host}:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()


def without_meta(task: dict[str, Any]) -> dict[str, Any]:
    """A task as tasks/get renders it, minus the per-response `_meta`: what must not change between reads."""
    return {key: value for key, value in task.items() if key != "_meta"}


def celery_id_of(client: McpHttp, task_id: str, dispatch: int = 1) -> str:
    """The Celery message id of a task's `dispatch`-th send, as an operator derives it: from the row key (never
    the id itself), the task's `createdAt` (what `tasks/get` says, to the millisecond) and the dispatch."""
    from types import SimpleNamespace

    from celery_mcp_tasks.model import celery_message_id, task_key

    created = round(datetime.fromisoformat(client.get(task_id)["createdAt"]).timestamp() * 1000)
    record = SimpleNamespace(key=task_key(task_id), created_at=created, dispatches=dispatch)
    return celery_message_id(record)  # type: ignore[arg-type]


_RUN_ENDS = (" succeeded in ", " ended its run in ", " raised unexpected", "Discarding revoked task")


def run_ended(proc: Proc, client: McpHttp, task_id: str, dispatch: int = 1, timeout: float = 30) -> str:
    """Wait for the worker's trace line that closes the job's run, and return it.

    Celery writes it after the task_success/task_failure signal, i.e. after the signal
    bridge tried to record the outcome: once it is there, a late result had its chance.
    A message discarded as revoked counts too (the job never ran).
    """
    marker = f"[{celery_id_of(client, task_id, dispatch)}]"

    def closing_line() -> str | None:
        for line in proc.text().splitlines():
            if marker in line and any(end in line for end in _RUN_ENDS):
                return line
        return None

    return wait_until(closing_line, timeout, f"the trace line closing run {dispatch} of the job")


def worker_caught_up(backend: Backend, proc: Proc, timeout: float = 20) -> None:
    """Ping the worker over its control channel and wait for the reply.

    A worker handles control messages one at a time, in order: once it answers a ping
    sent now, it has finished handling every revoke sent before (a terminate, and the
    `task_revoked` signal the bridge hears, run inside that handler).
    """
    import re

    from celery import Celery

    from celery_mcp_tasks.app import configure_celery
    from celery_mcp_tasks.config import Settings

    match = re.search(r"(\S+@\S+) ready\.", proc.text())
    assert match, "the worker never said it was ready"
    app = Celery("test-control")
    configure_celery(app, Settings.from_env(backend.env))
    try:
        replies = app.control.ping(destination=[match.group(1)], timeout=timeout, limit=1)
    finally:
        app.close()
    assert replies, f"{match.group(1)} did not answer a ping within {timeout}s"


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

    def raw(
        self,
        method: str,
        params: dict[str, Any] | None = None,
        *,
        name: str | None = None,
        headers: dict[str, str] | None = None,
        capabilities: dict[str, Any] | None = None,
        meta: dict[str, Any] | None = None,
    ) -> httpx.Response:
        self._next_id += 1
        body_params = dict(params or {})
        body_params["_meta"] = {
            "io.modelcontextprotocol/protocolVersion": PROTOCOL,
            "io.modelcontextprotocol/clientCapabilities": self.capabilities if capabilities is None else capabilities,
            **(meta or {}),
        }
        sent = {"Accept": "application/json, text/event-stream", "MCP-Protocol-Version": PROTOCOL, "Mcp-Method": method}
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

    def console(self, token: str, name: str = "console", **extra: str) -> str:
        """`celery-mcp-tasks console APP` on a port of its own, with operator `token`: its root URL, once it answers."""
        port = free_port()
        env = process_env(self.backend, **self.env(MCP_TASKS_CONSOLE_TOKEN=token, **extra))
        argv = [sys.executable, "-m", "celery_mcp_tasks.cli", "console", self.app, "--port", str(port)]
        proc = spawn(name, argv, env, self.log_dir)
        self.procs.append(proc)
        root = f"http://127.0.0.1:{port}"

        def up() -> bool:
            if proc.popen.poll() is not None:
                raise RuntimeError(f"console exited:\n{proc.text()}")
            try:
                return httpx.get(f"{root}/api/overview", timeout=1).status_code == 401  # up, and asks for a token
            except httpx.TransportError:
                return False

        wait_until(up, 60, "the console to listen")
        return root

    def logs(self) -> str:
        return "\n".join(proc.text() for proc in self.procs)

    def first_worker(self) -> Proc:
        return next(proc for proc in self.procs if proc.name.startswith("worker"))

    def stop(self) -> None:
        for proc in reversed(self.procs):
            proc.stop()

    def __enter__(self) -> Deployment:
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()


class OwnRedis:
    """A `redis-server` of a test's own on a free port: stopping and restarting it disturbs nothing else.

    `start()` skips the test when `redis-server` is not installed (see `tool`); `stop()` kills the
    server at once, as a crashed or restarted server goes away; `start()` again brings it back on the
    same port.
    """

    def __init__(self, log_dir: Path) -> None:
        self.port = free_port()
        self.log_dir = log_dir
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        binary = tool("redis-server", "Debian: apt-get install redis-server")
        log = (self.log_dir / "redis.log").open("ab")
        self.proc = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        wait_until(lambda: self._answers(), 10, "redis-server to answer")

    def _answers(self) -> bool:
        try:
            return bool(redis.Redis.from_url(self.url, socket_connect_timeout=0.2).ping())
        except redis.RedisError:
            return False

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()  # the broker goes away at once, as a crashed or restarted server does
            self.proc.wait(timeout=10)


@contextmanager
def own_redis_server(log_dir: Path) -> Iterator[OwnRedis]:
    """A started `OwnRedis` (its `url` is the broker URL), stopped afterwards."""
    broker = OwnRedis(log_dir)
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()


@contextmanager
def own_redis_deployment(app: str, log_dir: Path, **web_env: str) -> Iterator[tuple[Deployment, OwnRedis]]:
    """`app` on a fresh Postgres database and an `OwnRedis` broker, its web process started.

    Skips unless MCP_TASKS_TEST_POSTGRES_URL is set.
    """
    if not POSTGRES_URL:
        pytest.skip("set MCP_TASKS_TEST_POSTGRES_URL to run")
    with own_redis_server(log_dir) as broker, fresh_postgres_database(POSTGRES_URL) as url:
        backend = Backend("pg_own_redis", {"MCP_TASKS_DATABASE_URL": url, "CELERY_BROKER_URL": broker.url})
        with Deployment(app, backend, log_dir) as deployment:
            deployment.web(**web_env)
            yield deployment, broker


@contextmanager
def table_locked(url: str, table: str) -> Iterator[threading.Event]:
    """`table` locked ACCESS EXCLUSIVE by another session (every read of it waits) until the block
    ends or the yielded event is set."""
    from celery_mcp_tasks.store.engine import create_store_engine

    engine = create_store_engine(url)
    release, locked = threading.Event(), threading.Event()

    def hold() -> None:
        with engine.begin() as conn:
            conn.execute(sa.text(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE"))
            locked.set()
            release.wait(30)

    holder = threading.Thread(target=hold, daemon=True)
    holder.start()
    try:
        assert locked.wait(10), f"could not lock {table}"
        yield release
    finally:
        release.set()
        holder.join(10)
        engine.dispose()


@contextmanager
def database_gone_at(target: Any, verb: str, nth: int) -> Iterator[None]:
    """The database going away at the `nth` statement beginning with `verb` (e.g. "DELETE") on `target` (an
    engine, or `sqlalchemy.engine.Engine` for engines the code under test makes): an OperationalError raised
    where the driver would run it, as a dropped connection raises it."""
    seen = 0

    def gone(conn: Any, cursor: Any, statement: str, *_: Any) -> None:
        nonlocal seen
        if statement.lstrip().upper().startswith(verb):
            seen += 1
            if seen == nth:
                raise sa.exc.OperationalError(statement, {}, Exception("server closed the connection unexpectedly"))

    sa.event.listen(target, "before_cursor_execute", gone)
    try:
        yield
    finally:
        sa.event.remove(target, "before_cursor_execute", gone)
