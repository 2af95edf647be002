"""`celery-mcp-tasks dev`: the web process and a supervised worker (with beat) on one machine.

Three promises make `dev` something to trust on a first run:

- The port is ours before anything starts: it is bound here and the socket is
  handed to uvicorn, so a busy port is the first error, and `--call` can never
  talk to some other server that happens to own it.
- The worker (and the beat it embeds) is supervised. If it dies, `dev` says
  why and exits non-zero instead of serving tasks that stay `Queued` forever.
- The worker runs in a process group of its own, which `dev` always ends:
  Ctrl-C (or SIGTERM) is a warm shutdown, then the whole group is killed after
  a bound. On Linux the worker also gets SIGTERM if `dev` itself is killed.
"""

from __future__ import annotations

import collections
import ctypes
import errno
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from celery_mcp_tasks.config import redact_url

__all__ = ["DevOptions", "WorkerSupervisor", "bind_port", "celery_target", "run_dev"]

PREFIX = "celery-mcp-tasks dev"
WARM_SHUTDOWN_S = 6.0
"""How long a running job gets to finish after Ctrl-C before the worker's group is killed."""
_TAIL_LINES = 40


class DevStop(Exception):
    """SIGTERM or SIGINT reached `dev`: leave through the `finally` blocks that end the worker."""


@dataclass(frozen=True)
class DevOptions:
    app: str
    host: str = "127.0.0.1"
    port: int = 8000
    data_dir: str | None = None
    keep_env: bool = False
    call: tuple[str, str] | None = None


def bind_port(host: str, port: int) -> socket.socket:
    """Bind and listen now; a busy port is an error before anything else happens.

    Made as uvicorn makes its own (`Config.bind_socket`): with `IPPROTO_TCP`, which
    asyncio checks before it sets `TCP_NODELAY` on each accepted connection. Without
    it every response waited ~40 ms for a delayed ACK (uvicorn writes headers and
    body separately).
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise SystemExit(
                f"{PREFIX}: port {port} on {host} is already in use (another server?); "
                f"stop it or pick another with --port"
            ) from None
        raise SystemExit(f"{PREFIX}: cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    sock.listen(2048)
    sock.set_inheritable(False)
    return sock


def celery_target(app_path: str, tasks: Any) -> str:
    """What `celery -A ...` must be given to find `tasks.celery`, or a one-line error saying what to add."""
    from celery.app.utils import find_app

    module_name = app_path.partition(":")[0]
    try:
        found = find_app(module_name)
    except AttributeError:
        found = None
    if found is tasks.celery:
        return module_name
    module = sys.modules.get(module_name)
    name = next((k for k, v in vars(module).items() if v is tasks), "tasks") if module else "tasks"
    raise SystemExit(
        f"celery-mcp-tasks: `celery -A {module_name} worker` cannot find this app's Celery app: "
        f"add `celery = {name}.celery` to {module_name}"
    )


def _display_path(path: Path) -> str:
    """A path as the user would type it: relative when it is under the working directory."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve())) or "."
    except ValueError:
        return str(path)


def banner(settings: Any, url: str) -> list[str]:
    data_dir = settings.resolved_data_dir
    if settings.database_url:
        store = redact_url(settings.database_url)
    else:
        store = f"sqlite:///{_display_path(data_dir / 'tasks.db')}"
    if settings.embedded_broker:
        broker = f"filesystem:// ({_display_path(settings.broker_folder)})"
    else:
        broker = redact_url(settings.celery_broker_url)
    return [
        f"{PREFIX}: MCP endpoint {url}",
        f"  store   {store}",
        f"  broker  {broker}",
        f"  data    {_display_path(data_dir)}",
    ]


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    """Linux: the worker gets SIGTERM (a warm shutdown) if `dev` is killed outright."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


class WorkerSupervisor:
    """A `celery worker` in its own process group, its output forwarded and its death reported."""

    def __init__(self, argv: list[str], env: dict[str, str], *, on_death: Callable[[], None]) -> None:
        self._argv = argv
        self._env = env
        self._on_death = on_death
        self._tail: collections.deque[str] = collections.deque(maxlen=_TAIL_LINES)
        self._stopping = threading.Event()
        self.died: int | None = None
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            self._argv,
            env=self._env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None,
        )
        threading.Thread(target=self._forward, name="dev-worker-output", daemon=True).start()

    def _forward(self) -> None:
        proc = self.proc
        assert proc is not None and proc.stdout is not None
        for raw in proc.stdout:
            line = raw.decode(errors="replace").rstrip("\n")
            self._tail.append(line)
            print(line, file=sys.stderr, flush=True)
        status = proc.wait()
        if not self._stopping.is_set():
            self.died = status
            self._on_death()

    def why(self) -> str:
        """The worker's last meaningful line (an exception's message, usually)."""
        for line in reversed(self._tail):
            text = line.strip()
            if text and not text.startswith(("File ", "^", "~")):
                return text
        return "(no output)"

    def stop(self, warm_s: float = WARM_SHUTDOWN_S) -> None:
        """Warm shutdown, then the whole process group is killed: nothing outlives `dev`."""
        self._stopping.set()
        proc = self.proc
        if proc is None:
            return
        try:
            if proc.poll() is None:
                _killpg(proc.pid, signal.SIGTERM)
                proc.wait(timeout=warm_s)
        except (subprocess.TimeoutExpired, KeyboardInterrupt, DevStop):
            pass  # a second Ctrl-C, or a job that does not end: no more waiting
        finally:
            _killpg(proc.pid, signal.SIGKILL)  # the embedded beat and any pool child included
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass


def _killpg(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _raise_stop(signum: int, frame: FrameType | None) -> None:
    raise DevStop(signal.Signals(signum).name)


def _worker_argv(target: str, settings: Any, *, node: str = "dev@%h", schedule: str = "beat-schedule") -> list[str]:
    """`celery worker -B` as `dev` runs it; `stdio` names its own node and beat schedule file."""
    return [
        sys.executable,
        "-m",
        "celery",
        "--quiet",
        "-A",
        target,
        "worker",
        "-B",
        "-P",
        "threads",
        "-c",
        "4",
        "--loglevel",
        "WARNING",
        "--without-mingle",
        "--without-gossip",
        "-n",
        node,
        "-s",
        str(settings.resolved_data_dir / schedule),
    ]


def run_dev(options: DevOptions) -> int:
    """Serve (or call one tool) with a supervised worker; the exit status says what happened."""
    import uvicorn

    from celery_mcp_tasks.cli import call, load_app, quiet_libraries, start_ops_server
    from celery_mcp_tasks.migrate import upgrade

    sock = bind_port(options.host, options.port)
    # --data-dir wins over MCP_TASKS_DATA_DIR; the worker inherits the one chosen here.
    os.environ["MCP_TASKS_DATA_DIR"] = options.data_dir or os.environ.get("MCP_TASKS_DATA_DIR") or ".celery-mcp-tasks"
    if not options.keep_env:
        for name in ("MCP_TASKS_DATABASE_URL", "CELERY_BROKER_URL"):
            os.environ.pop(name, None)
    tasks = load_app(options.app)
    target = celery_target(options.app, tasks)
    quiet_libraries()
    if options.call:
        logging.getLogger("mcp").setLevel(logging.WARNING)  # the server's INFO lines would interleave the call's
    tasks.preflight("serve", need_schema=False)  # e.g. --keep-env with an unreachable database: one line
    upgrade(tasks.settings.store_url)

    host = f"[{options.host}]" if ":" in options.host else options.host
    url = f"http://{host}:{options.port}/mcp"
    print("\n".join(banner(tasks.settings, url)), flush=True)

    from celery_mcp_tasks.ops.logs import uvicorn_log_config

    config = uvicorn.Config(
        tasks.asgi_app(host=options.host),
        log_level="warning" if options.call else "info",
        timeout_graceful_shutdown=3,
        lifespan="on",
        log_config=uvicorn_log_config(tasks.settings),  # json: uvicorn's lines go through the JSON root handler
    )
    server = uvicorn.Server(config)
    stopped = threading.Event()

    def on_worker_death() -> None:
        stopped.set()
        server.should_exit = True

    cwd = os.getcwd()
    env = {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "PYTHONPATH": os.pathsep.join(filter(None, [cwd, os.environ.get("PYTHONPATH")])),
    }
    worker = WorkerSupervisor(_worker_argv(target, tasks.settings), env, on_death=on_worker_death)
    previous = {sig: signal.signal(sig, _raise_stop) for sig in (signal.SIGTERM,)}
    status = 0
    ops = start_ops_server(tasks, None, None)  # MCP_TASKS_OPS_HOST/PORT, when a plugin added routes
    try:
        worker.start()
        if options.call:
            thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="dev-web", daemon=True)
            thread.start()
            try:
                status = call(url, options.call[0], options.call[1], abort=stopped.is_set)
            finally:
                server.should_exit = True
                thread.join(timeout=5)
        else:
            server.run(sockets=[sock])
    except (KeyboardInterrupt, DevStop):
        status = 130
    finally:
        if ops is not None:
            ops.stop()
        worker.stop()
        sock.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if worker.died is not None:
        print(f"{PREFIX}: the worker exited (status {worker.died}): {worker.why()}", file=sys.stderr)
        return 1
    return status
