"""What the commands share: loading APP, the start-up checks, the ops listener, and a supervised `celery worker`.

The worker (`dev`, `stdio`) runs in a process group of its own that the command always ends (a warm
shutdown, then the group is killed); if it dies, the command says why and exits non-zero instead of
serving tasks that stay `Queued` forever.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import errno
import importlib
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import IO, Any

from celery_mcp_tasks.config import ConfigError, redact_url
from celery_mcp_tasks.ops.root_handler import plain_root_logging

_ops_logger = logging.getLogger("celery_mcp_tasks.ops")


def load_app(path: str) -> Any:
    """Import APP (`module` or `module:attribute`) and return its `McpTasks`; one-line errors otherwise.

    The command is the application here: once APP is imported, it configures root logging
    (`plain_root_logging`) unless APP did (`McpTasks` itself leaves logging alone), at INFO, where
    migrations and HTTP client chatter are noise: those loggers are set to WARNING unless APP set a level.
    """
    tasks = _import_app(path)
    plain_root_logging()
    for name in ("alembic", "httpx", "httpx2"):
        chatty = logging.getLogger(name)
        if chatty.level == logging.NOTSET:
            chatty.setLevel(logging.WARNING)
    return tasks


def prepare(tasks: Any, role: str, *, migrate: bool) -> None:
    """The start-up checks (once per start: never an "Internal server error" at the first call), after
    migrating when asked."""
    from celery_mcp_tasks.app import internals  # loaded with the app anyway; not for `--help`

    if migrate:  # checked first: a store that cannot be reached, or must not be used, is never migrated
        from celery_mcp_tasks.migrate import upgrade

        internals(tasks).preflight(role, need_schema=False)
        url = tasks.settings.store_url
        moved = upgrade(url)
        if moved is not None:  # the schema changed under every process on this store: the operator hears of it
            logging.getLogger("celery_mcp_tasks").info(
                "upgraded the task store %s from %s to %s",
                redact_url(url),
                named_revisions(moved[0]),
                named_revisions(moved[1]),
            )
    internals(tasks).preflight(role)


def named_revisions(revisions: tuple[str, ...]) -> str:
    """Migration revisions as the CLI says them: `base (no tables)`, or the ids, marked `(head)` at this release's."""
    from celery_mcp_tasks.preflight import script_heads

    if not revisions:
        return "base (no tables)"
    return ", ".join(sorted(revisions)) + (" (head)" if set(revisions) == script_heads()[0] else "")


def _import_app(path: str) -> Any:
    from celery_mcp_tasks.app import McpTasks

    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    module_name, _, attribute = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and (module_name == exc.name or module_name.startswith(exc.name + ".")):  # APP, not its imports
            raise SystemExit(
                f"celery-mcp-tasks: cannot import {module_name!r} (APP is a module path such as "
                f"myapp.tasks, importable from {os.getcwd()})"
            ) from None
        raise
    except (ValueError, TypeError) as exc:
        where = "" if isinstance(exc, ConfigError) else _refused_at(exc, module_name)  # a setting: said as such
        if not where:
            raise  # the app's own error: its traceback shows where
        raise SystemExit(f"celery-mcp-tasks: {where}: {exc}") from None
    if attribute:
        found = getattr(module, attribute, None)
        if not isinstance(found, McpTasks):
            raise SystemExit(f"celery-mcp-tasks: {path} is not a McpTasks instance")
        return found
    candidates = [value for value in vars(module).values() if isinstance(value, McpTasks)]
    if len(candidates) != 1:
        raise SystemExit(
            f"celery-mcp-tasks: {module_name} must define exactly one McpTasks "
            f"(found {len(candidates)}); name it as {module_name}:NAME"
        )
    return candidates[0]


def _refused_at(exc: BaseException, app_module: str) -> str:
    """`file:line` of the declaration in APP's package that this package refused (a tool named twice, an async
    tool, ...), or "" when `exc` was raised elsewhere. This package raises those with the whole story in their
    message; an error raised by the app's own code, or by this package's internals, keeps its traceback."""
    frames = list(traceback.walk_tb(exc.__traceback__))  # (frame, line), the innermost last

    def package(frame: FrameType) -> str:
        return str(frame.f_globals.get("__name__") or "").partition(".")[0]

    if not frames or package(frames[-1][0]) != "celery_mcp_tasks":
        return ""
    app = app_module.partition(".")[0]
    # The innermost of APP's frames: past the SDK's own decorator, say, for `tasks.server.tool()`.
    declared = next(((frame, line) for frame, line in reversed(frames) if package(frame) == app), None)
    return "" if declared is None else f"{os.path.relpath(declared[0].f_code.co_filename)}:{declared[1]}"


def uvicorn_logging(tasks: Any) -> dict[str, Any] | None:
    """uvicorn's `log_config` for APP: none when its `Logs` plugin writes JSON (uvicorn's lines then go through
    the JSON root handler), whether code (`Logs(json=True)`) or MCP_TASKS_LOG_FORMAT=json turned it on."""
    from celery_mcp_tasks.app import internals  # loaded with the app anyway; not for `--help`
    from celery_mcp_tasks.ops.logs import uvicorn_log_config

    return uvicorn_log_config(internals(tasks).plugins)


def bind_port(command: str, host: str, port: int) -> socket.socket:
    """Bind now, for `command` (`dev`, `serve`, `console`): a busy port is one line before anything else happens
    (before the app is imported, the store migrated or a worker started)."""
    try:
        return bound_socket(host, port)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise SystemExit(
                f"celery-mcp-tasks {command}: port {port} on {host} is already in use (another server?); "
                f"stop it or pick another with --port"
            ) from None
        raise SystemExit(f"celery-mcp-tasks {command}: cannot listen on {host}:{port}: {exc.strerror or exc}") from None


def bound_socket(host: str, port: int) -> socket.socket:
    """A socket bound to host:port now (OSError when it cannot be: a port another server listens on), for uvicorn
    to serve. Not listening yet: asyncio listens when the server starts, so a connection before the app is ready
    is refused, not left hanging (a TCP probe sees the port closed until then).

    With `IPPROTO_TCP`, as uvicorn's own: asyncio checks it before it sets `TCP_NODELAY` on each accepted
    connection, without which every response waited ~40 ms for a delayed ACK.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(False)
    return sock


def start_ops_server(tasks: Any, host: str | None, port: int | None, *, log_level: str | None, set_by: str) -> Any:
    """The plugins' operations routes on a listener of their own (None when no plugin added any, or off).

    MCP_TASKS_OPS_PORT is read (and a bad one refused) whether or not a plugin serves. A port that cannot be
    bound is one warning line naming what to set (`set_by`); the MCP server runs on without it."""
    from celery_mcp_tasks.ops.serving import OpsServer, ops_address

    bind_host, bind_port = ops_address(host, port)
    app = tasks.ops_app()
    if not app.routes or bind_port is None:
        return None
    try:
        sock = bound_socket(bind_host, bind_port)
    except OSError as exc:
        why = "is not free" if exc.errno == errno.EADDRINUSE else f"cannot be bound ({exc.strerror or exc})"
        _ops_logger.warning(
            "celery-mcp-tasks: the operations port %s:%d %s; serving MCP without it (set %s)",
            bind_host,
            bind_port,
            why,
            set_by,
        )
        return None
    server = OpsServer(app, sock, log_level=log_level, log_config=uvicorn_logging(tasks)).start()
    _ops_logger.info("celery-mcp-tasks: operations routes on http://%s:%d", bind_host, bind_port)
    return server


WARM_SHUTDOWN_S = 6.0  # how long a running job gets to finish after Ctrl-C before the worker's group is killed


class Stopped(Exception):
    """SIGTERM or SIGINT reached the command: leave through the `finally` blocks that end the worker."""


def celery_target(app_path: str, tasks: Any) -> str:
    """What `celery -A ...` must be given to find `tasks.celery`, or a one-line error saying what to add."""
    from celery_mcp_tasks.worker.celery_internals import find_app

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


def display_path(path: Path) -> str:
    """A path as the user would type it: relative when it is under the working directory."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve())) or "."
    except ValueError:
        return str(path)


def banner(tasks: Any) -> list[str]:
    """Where this app keeps its tasks and messages (the embedded default shows its files); the broker is the
    one its Celery app uses (a broker set in code, with `--keep-env`, included)."""
    settings = tasks.settings
    data_dir = settings.resolved_data_dir
    store = f"sqlite:///{display_path(data_dir / 'tasks.db')}"
    if settings.database_url:
        store = redact_url(settings.database_url)
    broker_url = str(tasks.celery.conf.broker_url or "")
    broker = redact_url(broker_url)
    if broker_url.startswith("filesystem://") and settings.embedded_broker:
        broker = f"filesystem:// ({display_path(settings.broker_folder)})"
    return [f"  store   {store}", f"  broker  {broker}", f"  data    {display_path(data_dir)}"]


def dies_with_parent(sig: int = signal.SIGTERM) -> Callable[[], None] | None:
    """A `preexec_fn` by which the child gets `sig` when this process is killed outright (`dev` gets SIGTERM when
    the pytest run that started it is; its worker SIGQUIT when `dev` is), or None where that cannot hold: not
    Linux, or not the main thread (the kernel signals when the starting *thread* ends). `prctl` is looked up
    here, not between fork and exec."""
    if not sys.platform.startswith("linux") or threading.current_thread() is not threading.main_thread():
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def preexec() -> None:  # pragma: no cover - runs in the child between fork and exec
        prctl(1, sig)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # the parent died before that took effect
            os._exit(1)

    return preexec


def claim_data_dir(folder: Path, command: str) -> IO[str] | None:
    """This process's claim on the embedded broker's data directory, held until the file is closed or the process
    ends (`flock`). Two supervised workers on one filesystem broker take each other's jobs, and either one's exit
    kills the other's: a second `dev` or `stdio` there is refused (SystemExit naming the holder). None without
    `fcntl` (not POSIX)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows
        return None
    try:
        folder.mkdir(parents=True, exist_ok=True)
        claim = open(folder / "worker.lock", "a+")  # noqa: SIM115 - held open for the life of the worker
    except OSError as exc:  # a read-only working directory (a desktop client's `/`), a full disk: one line
        raise SystemExit(
            f"celery-mcp-tasks {command}: cannot write the data directory {folder.resolve()} "
            f"({exc.strerror or type(exc).__name__}); give it one it can write (--data-dir or MCP_TASKS_DATA_DIR)"
        ) from None
    try:
        fcntl.flock(claim, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        claim.seek(0)
        holder = claim.read().strip() or "another process"
        claim.close()
        raise SystemExit(
            f"celery-mcp-tasks {command}: {holder} already runs a worker on the data directory "
            f"{display_path(folder)}; a second one would take its jobs and kill them when either exits. "
            f"Give each its own data directory (--data-dir or MCP_TASKS_DATA_DIR)"
        ) from None
    claim.truncate(0)
    claim.write(f"celery-mcp-tasks {command} (pid {os.getpid()})")
    claim.flush()
    return claim


class WorkerSupervisor:
    """`celery worker -B` consuming `supervised_queues`, in its own process group, its output forwarded and its
    death reported (`on_death`, from a thread waiting for it); `command` (dev, stdio) names its node and holds the data
    directory, and `stdio` keeps a beat schedule file of its own. `log_level`: the worker's (a `--log-level` given
    to `dev`), so a job's own INFO lines show; None: WARNING, without Celery's lines for every task."""

    def __init__(
        self,
        target: str,
        tasks: Any,
        *,
        on_death: Callable[[], None] = lambda: None,
        command: str = "dev",
        schedule: str = "beat-schedule",
        log_level: str | None = None,
    ) -> None:
        queues = supervised_queues(tasks)
        self._command = command
        self._data_dir = tasks.settings.resolved_data_dir
        self._embedded = str(tasks.celery.conf.broker_url or "").startswith("filesystem://")
        self._claim: IO[str] | None = None
        self._argv = [sys.executable, "-m", "celery", "--quiet", "-A", target, "worker", "-B", *WORKER_POOL]
        # uvicorn's "trace" is Celery's DEBUG (Celery has no lower level)
        level = "DEBUG" if log_level == "trace" else (log_level or "WARNING").upper()
        self._argv += ["--loglevel", level, "--without-mingle", "--without-gossip", "-n", f"{command}@%h"]
        self._argv += ["-s", str(self._data_dir / schedule), *(["-Q", ",".join(queues)] if queues else [])]
        self._on_death = on_death
        self._tail: collections.deque[str] = collections.deque(maxlen=40)
        self._stopping = threading.Event()
        self.died: int | None = None
        self.proc: subprocess.Popen[bytes] | None = None

    def claim(self) -> None:
        """Claim the embedded broker's data directory (SystemExit when another `dev` or `stdio` holds it): before
        anything is migrated or announced."""
        if self._embedded and self._claim is None:
            self._claim = claim_data_dir(self._data_dir, self._command)

    def start(self) -> None:
        self._data_dir.mkdir(parents=True, exist_ok=True)  # beat's schedule file is there, whatever the broker
        self.claim()
        path = os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")]))
        self.proc = subprocess.Popen(
            self._argv,
            env={**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": path},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            # `dev` killed outright: a cold shutdown (Celery's SIGQUIT), its jobs ended at once, as `stop` would
            # (a warm one waits for them however long they run, and the worker lived on beside the next `dev`).
            preexec_fn=dies_with_parent(signal.SIGQUIT),
        )
        output = threading.Thread(target=self._forward, name="celery-mcp-tasks-worker-output", daemon=True)
        output.start()
        threading.Thread(target=self._watch, args=(output,), name="celery-mcp-tasks-worker-watch", daemon=True).start()

    def _forward(self) -> None:
        proc = self.proc
        assert proc is not None and proc.stdout is not None
        for raw in proc.stdout:
            line = raw.decode(errors="replace").rstrip("\n")
            self._tail.append(line)
            print(line, file=sys.stderr, flush=True)

    def _watch(self, output: threading.Thread) -> None:
        """The worker's main process ending is its death, whatever holds its output: its beat or a pool child
        outliving a SIGKILL of it keeps the pipe open (and is killed with the process group by `stop`)."""
        proc = self.proc
        assert proc is not None
        status = proc.wait()
        output.join(timeout=1.0)  # its last lines, for `why`, unless an orphan still holds the pipe
        if not self._stopping.is_set():
            self.died = status
            self._on_death()

    def why(self) -> str:
        """How the worker died: killed by a signal from outside, or its exit status (a crash: its signal) and last
        meaningful line (an exception's message, usually)."""
        last = (line.strip() for line in reversed(self._tail))
        text = next((text for text in last if text and not text.startswith(("File ", "^", "~"))), "(no output)")
        if self.died is not None and self.died < 0:
            try:
                name = signal.Signals(-self.died).name
            except ValueError:
                name = f"signal {-self.died}"
            if -self.died in _KILLS:  # its last line is whatever it was doing, not why it ended
                return f"the worker was killed ({name})"
            return f"the worker crashed ({name}): {text}"
        return f"the worker exited (status {self.died}): {text}"

    def stop(self, warm_s: float = WARM_SHUTDOWN_S) -> bool:
        """Warm shutdown, then the whole process group is killed: nothing outlives `dev`. The data directory's
        claim goes last. True when the worker had not ended its warm shutdown within `warm_s`."""
        self._stopping.set()
        proc = self.proc
        late = False
        try:
            if proc is not None and proc.poll() is None:
                # The worker's main process only: it ends its pool and beat itself (a pool
                # child's own SIGTERM would be logged as a lost process).
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout=warm_s)
        except subprocess.TimeoutExpired:
            late = True
        except (KeyboardInterrupt, Stopped):
            pass  # a second Ctrl-C: no more waiting
        finally:
            try:
                if proc is not None:
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(proc.pid, signal.SIGKILL)  # the embedded beat and any pool child included
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        proc.wait(timeout=5)
            finally:
                if self._claim is not None:
                    self._claim.close()  # unlocks
                    self._claim = None
        return late


_KILLS = frozenset({signal.SIGKILL, signal.SIGTERM, signal.SIGINT, signal.SIGQUIT, signal.SIGHUP})
"""Signals by which something outside ends a worker (as opposed to a crash: SIGSEGV, SIGABRT, ...)."""


def _raise_stop(signum: int, frame: FrameType | None) -> None:
    raise Stopped(signal.Signals(signum).name)


@contextlib.contextmanager
def sigterm_stops() -> Iterator[None]:
    """SIGTERM raises `Stopped` for the duration (the previous handler back after)."""
    previous = signal.signal(signal.SIGTERM, _raise_stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


# Prefork, not threads: only it can kill a running job (`terminate=True` tools); it forks its children
# from the loaded app (the store's engine is disposed in each child). Measured on the quickstart
# (2026-12-03, 2 cores): ready in ~1.4-2.4 s either way; -c 4 holds ~310 MB PSS against ~110 MB for
# threads, and autoscaling from one child took 3.4 s for four one-second jobs, against 1.1 s.
WORKER_POOL = ("-P", "prefork", "-c", "4")


def tool_queues(tasks: Any) -> dict[str, list[str]]:
    """{queue: [task tools sent to it]}, routed as jobs are sent (the job's options, task_routes; with
    MCP_TASKS_FAIR_QUEUES, the default queue's tools to each of its shards instead, `worker.fairness`)."""
    from celery_mcp_tasks.app import internals  # loaded with the app anyway; not for `--help`
    from celery_mcp_tasks.worker.fairness import routed_queue, shard_queues

    queues: dict[str, list[str]] = {}
    for tool in sorted(internals(tasks).tools.values(), key=lambda t: t.name):
        if (queue := routed_queue(tasks.celery, tool.celery_name)) is not None:  # None: routed by exchange alone
            queues.setdefault(queue, []).append(tool.name)
    default = str(tasks.celery.conf.task_default_queue)
    if tasks.settings.fair_queues is not None and default in queues:
        on_default = queues.pop(default)
        queues.update(dict.fromkeys(shard_queues(default, tasks.settings.fair_queues), on_default))
    return queues


def supervised_queues(tasks: Any) -> list[str]:
    """What the worker `dev` and `stdio` start must consume: every task tool's queue and the janitor's.

    Empty when that is the default queue alone (Celery's own default then applies).
    """
    from celery_mcp_tasks.worker.janitor import JANITOR_TASK

    celery = tasks.celery
    default = str(celery.conf.task_default_queue)
    janitor = celery.amqp.router.route({}, JANITOR_TASK).get("queue")
    wanted = [default, str(getattr(janitor, "name", janitor) or default), *tool_queues(tasks)]
    queues = list(dict.fromkeys(wanted))
    return [] if queues == [default] else queues


def printable(value: object, *, lines: bool = False) -> str:
    """A server's text as a terminal may show it: every character that is not printable (an escape sequence
    a job's message may hold, which would move the cursor or clear the screen; a newline, unless `lines`) as a
    space."""
    return "".join(ch if ch.isprintable() or (lines and ch == "\n") else " " for ch in str(value))
