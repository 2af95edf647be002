"""pytest fixtures: your app served for real (web process + Celery worker), and a connected client.

Installed as a pytest plugin (entry point `celery_mcp_tasks`); its fixtures do
nothing until a test asks for one. Name the app once, in the pytest
configuration or as a fixture:

    [tool.pytest.ini_options]
    mcp_tasks_app = "myapp.tasks"

    @pytest.fixture(scope="module")     # or in a test module / conftest.py
    def mcp_tasks_app() -> str:
        return "myapp.tasks"

Then, with anyio's own pytest plugin (installed with the SDK):

    @pytest.mark.anyio
    async def test_report(mcp_tasks_client):
        result = await mcp_tasks_client.call_tool("write_report", {"topic": "tides"})
        assert result.content[0].text == "A 3-section report on tides."

    @pytest.mark.anyio
    async def test_asks_for_a_name(mcp_tasks_client, mcp_tasks_answers):
        mcp_tasks_answers.when("name", {"name": "Ada"})
        result = await mcp_tasks_client.call_tool("greet", {})

    @pytest.mark.anyio
    async def test_cancel(mcp_tasks_client, mcp_tasks_extension):
        handle = await mcp_tasks_extension.start(mcp_tasks_client, "work", {"seconds": 60})
        await handle.cancel()
        assert handle.status == "cancelled"

What runs: `celery-mcp-tasks dev APP` on a free port with a temporary data
directory (the embedded default: SQLite store and filesystem broker, no
servers; MCP_TASKS_DATABASE_URL / CELERY_BROKER_URL are ignored), i.e. the
real web process and a real supervised worker with beat. It is started once
per app (and `mcp_tasks_env`) for the whole session, waited for until the web
process answers and the worker replies to a ping, and ended at the end of the
session. Its output goes to `<data dir>/dev.log`, quoted when it fails to start; a failed test that used
`mcp_tasks_client` shows the lines it wrote during that test (a failed job's traceback is there).

This module imports only the standard library and pytest at import time: the
plugin costs nothing to a test run that does not use it.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from mcp import Client
    from mcp.client.session import ClientRequestContext
    from mcp_types import ElicitRequestParams, ElicitResult, ErrorData

    from celery_mcp_tasks.client import TasksClient

__all__ = [
    "Deployment",
    "ScriptedAnswers",
    "mcp_tasks_answers",
    "mcp_tasks_app",
    "mcp_tasks_client",
    "mcp_tasks_env",
    "mcp_tasks_extension",
    "mcp_tasks_server",
    "start_deployment",
]

INI_APP = "mcp_tasks_app"
START_TIMEOUT_S = 90.0
"""A cold start (imports, migrations, the worker's boot) takes seconds; this bounds a broken one."""
CALL_TIMEOUT_S = 60.0
"""The longest a plain `call_tool` in a test waits for its task (then the task is cancelled)."""
_STOP_TIMEOUT_S = 15.0
_SHOWN_LOG_CHARS = 6000
_LOG_MARK = pytest.StashKey[tuple[Path, int]]()
"""On a test that uses `mcp_tasks_client`: its deployment's log, and how long it was when the test began."""


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini(INI_APP, "celery-mcp-tasks: the APP (module path) that the mcp_tasks_* fixtures serve", default="")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """A failed test that used the client: what the served processes logged meanwhile, as a report section."""
    outcome = yield
    report: pytest.TestReport = outcome.get_result()  # type: ignore[attr-defined]
    mark = item.stash.get(_LOG_MARK, None)
    if mark is None or report.when != "call" or not report.failed:
        return
    log, start = mark
    _settled(log)
    try:
        with log.open("rb") as handle:
            handle.seek(start)
            written = handle.read().decode(errors="replace")
    except OSError:
        return
    if written.strip():
        shown = written if len(written) <= _SHOWN_LOG_CHARS else "...\n" + written[-_SHOWN_LOG_CHARS:]
        report.sections.append((f"celery-mcp-tasks dev log during the test ({log})", shown))


# -- the deployment ------------------------------------------------------------------


@dataclass
class Deployment:
    """One `celery-mcp-tasks dev APP` process: the web process and its supervised worker."""

    app: str
    url: str
    data_dir: Path
    proc: subprocess.Popen[bytes]
    log: Path = field(repr=False)

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def stop(self) -> None:
        """SIGTERM: `dev` ends its worker's process group (warm, then killed) and exits.

        If it has not in time, its process group is killed, and so is the worker's (a
        session of its own, found by the data directory on its command line).
        """
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=_STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                for pgid in {self.proc.pid, *_groups_mentioning(self.data_dir)}:
                    _killpg(pgid)
                self.proc.wait(timeout=5)


def _killpg(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _groups_mentioning(data_dir: Path) -> set[int]:
    """The process groups of live processes whose command line names `data_dir` (Linux: /proc), never ours."""
    names = {str(data_dir).encode(), str(data_dir.resolve()).encode()}
    own = {os.getpgid(0)}
    found: set[int] = set()
    try:
        entries = list(Path("/proc").iterdir())
    except OSError:
        return found
    for entry in entries:
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            pgid = os.getpgid(int(entry.name))
        except OSError:
            continue
        if pgid not in own and any(name in cmdline for name in names):
            found.add(pgid)
    return found


def _free_port(host: str) -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def _answers(host: str, port: int) -> bool:
    """The web process is up: its MCP endpoint answers HTTP at all.

    uvicorn serves nothing before the app's lifespan has run (a connection made sooner waits in
    the listening socket's backlog), so any status line means the app is ready. Not `/healthz`:
    health is an opt-in plugin on an operations port of its own.
    """
    try:
        with socket.create_connection((host, port), timeout=0.5) as sock:
            sock.sendall(f"GET /mcp HTTP/1.0\r\nHost: {host}:{port}\r\n\r\n".encode())
            return sock.recv(64).startswith(b"HTTP/1.1 ")
    except OSError:
        return False


def _worker_replies(env: Mapping[str, str], timeout_s: float) -> bool:
    """The worker is consuming: it answers a control ping over the broker the served processes use."""
    from celery import Celery

    from celery_mcp_tasks.app import configure_celery
    from celery_mcp_tasks.config import Settings

    app = Celery(f"mcp-tasks-ping-{uuid.uuid4().hex[:6]}", set_as_current=False)  # the user's app stays current
    configure_celery(app, Settings.from_env(env))
    try:
        return bool(app.control.ping(timeout=timeout_s, limit=1))
    finally:
        app.close()


_SERVICES = ("MCP_TASKS_DATABASE_URL", "CELERY_BROKER_URL")


def _process_env(
    cwd: Path, data_dir: Path, extra: Mapping[str, str], pythonpath: Sequence[Path] = ()
) -> dict[str, str]:
    """The served processes' environment: APP importable from `pythonpath` (pytest's own option), `cwd`
    and the current directory, as it is in the test process."""
    env = {k: v for k, v in os.environ.items() if k not in _SERVICES}
    env.update(extra)
    env["MCP_TASKS_DATA_DIR"] = str(data_dir)
    env["PYTHONUNBUFFERED"] = "1"
    paths = [*map(str, pythonpath), str(cwd), os.getcwd(), env.get("PYTHONPATH")]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(filter(None, paths)))
    return env


def start_deployment(
    app: str,
    data_dir: Path,
    *,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
    timeout_s: float = START_TIMEOUT_S,
    pythonpath: Sequence[Path] = (),
) -> Deployment:
    """Start `celery-mcp-tasks dev APP` on a free port; return once the web process and the worker answer.

    `cwd`: where APP is importable from (default: the current directory).
    `pythonpath`: more directories to import from, first (the fixtures pass pytest's `pythonpath` option).
    Raises `RuntimeError` with the process's output if it exits or is not ready in time.
    """
    host = "127.0.0.1"
    port = _free_port(host)
    data_dir.mkdir(parents=True, exist_ok=True)
    log = data_dir / "dev.log"
    workdir = cwd or Path.cwd()
    argv = [sys.executable, "-m", "celery_mcp_tasks.cli", "dev", app, "--port", str(port), "--data-dir", str(data_dir)]
    if any(name in (env or {}) for name in _SERVICES):
        argv.append("--keep-env")  # the database and broker `env` names, not the embedded ones
    served_env = _process_env(workdir, data_dir, env or {}, pythonpath)
    from celery_mcp_tasks.cli.shared import dies_with_parent

    with log.open("wb") as handle:
        proc = subprocess.Popen(
            argv,
            cwd=workdir,
            env=served_env,
            stdin=subprocess.DEVNULL,
            stdout=handle,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # a Ctrl-C in the terminal is pytest's to handle, not the deployment's
            # pytest killed outright (a CI job's timeout) ends the deployment too: `dev` stops its worker
            # (Linux, started from the main thread; else the session's end alone)
            preexec_fn=dies_with_parent(),
        )
    deployment = Deployment(app, f"http://{host}:{port}/mcp", data_dir, proc, log)
    deadline = time.monotonic() + timeout_s
    try:
        while not _answers(host, port):
            _check_alive(deployment, deadline)
            time.sleep(0.05)
        while not _worker_replies(served_env, timeout_s=1.0):
            _check_alive(deployment, deadline)
    except BaseException:
        deployment.stop()
        raise
    return deployment


def _check_alive(deployment: Deployment, deadline: float) -> None:
    status = deployment.proc.poll()
    if status is not None:
        raise RuntimeError(f"celery-mcp-tasks dev {deployment.app} exited ({status}):\n{deployment.output()[-4000:]}")
    if time.monotonic() > deadline:
        raise RuntimeError(
            f"celery-mcp-tasks dev {deployment.app} was not ready in time:\n{deployment.output()[-4000:]}"
        )


class _Deployments:
    """The session's running deployments, one per (app, env): modules that serve the same app share it."""

    def __init__(self, factory: pytest.TempPathFactory, cwd: Path, pythonpath: Sequence[Path] = ()) -> None:
        self._factory = factory
        self._cwd = cwd
        self._pythonpath = pythonpath
        self._running: dict[tuple[str, tuple[tuple[str, str], ...]], Deployment] = {}

    def get(self, app: str, env: Mapping[str, str]) -> Deployment:
        key = (app, tuple(sorted(env.items())))
        found = self._running.get(key)
        if found is None or found.proc.poll() is not None:
            data_dir = self._factory.mktemp(f"mcp-tasks-{app.replace(':', '.')}")
            found = self._running[key] = start_deployment(
                app, data_dir, cwd=self._cwd, env=env, pythonpath=self._pythonpath
            )
        return found

    def serving(self, url: str) -> Deployment | None:
        """The running deployment at `url` (None: that server is not one of these, e.g. an overridden fixture's)."""
        return next((found for found in self._running.values() if found.url == url), None)

    def stop(self) -> None:
        for deployment in self._running.values():
            deployment.stop()
        self._running.clear()


# -- answering questions ---------------------------------------------------------------


class ScriptedAnswers:
    """An elicitation callback answering from a script: the first rule whose text the question contains.

        answers.when("name", {"name": "Ada"}).when("colour", {"colour": "teal"})
        answers.when("proceed", action="decline")

    A question no rule matches is answered with `otherwise` (default: decline).
    `asked` lists every question's message, in order.
    """

    def __init__(self, *, otherwise: str = "decline") -> None:
        self.rules: list[tuple[str, str, dict[str, Any] | None]] = []
        self.otherwise = otherwise
        self.asked: list[str] = []

    def when(self, text: str, content: dict[str, Any] | None = None, *, action: str = "accept") -> ScriptedAnswers:
        """Answer a question whose message contains `text` (case-insensitive) with `content`."""
        self.rules.append((text.lower(), action, content))
        return self

    async def __call__(self, context: ClientRequestContext, params: ElicitRequestParams) -> ElicitResult | ErrorData:
        from mcp_types import ElicitResult

        message = params.message
        self.asked.append(message)
        for text, action, content in self.rules:
            if text in message.lower():
                return ElicitResult(action=action, content=content if action == "accept" else None)  # type: ignore[arg-type]
        return ElicitResult(action=self.otherwise)  # type: ignore[arg-type]


# -- the fixtures ----------------------------------------------------------------------


@pytest.fixture(scope="session")
def _mcp_tasks_deployments(tmp_path_factory: pytest.TempPathFactory, pytestconfig: pytest.Config) -> Iterator[Any]:
    # pytest's `pythonpath` option puts directories on the test process's sys.path: the served app's too.
    pythonpath = [Path(entry) for entry in pytestconfig.getini("pythonpath")]
    deployments = _Deployments(tmp_path_factory, pytestconfig.rootpath, pythonpath)
    try:
        yield deployments
    finally:
        deployments.stop()


@pytest.fixture(scope="module")
def mcp_tasks_app(pytestconfig: pytest.Config) -> str:
    """The APP to serve: the `mcp_tasks_app` ini option; override this fixture to choose per module."""
    app = str(pytestconfig.getini(INI_APP) or "").strip()
    if not app:
        raise pytest.UsageError(
            "celery-mcp-tasks: name the app to serve: `mcp_tasks_app = myapp.tasks` in the pytest configuration, "
            "or a fixture `mcp_tasks_app` returning it"
        )
    return app


@pytest.fixture(scope="module")
def mcp_tasks_env() -> dict[str, str]:
    """Extra environment for the served app's processes (e.g. MCP_TASKS_* settings); override to set."""
    return {}


@pytest.fixture(scope="module")
def mcp_tasks_server(mcp_tasks_app: str, mcp_tasks_env: dict[str, str], _mcp_tasks_deployments: Any) -> str:
    """The MCP endpoint URL of the app, served by a real web process with a real worker (shared per session)."""
    deployment: Deployment = _mcp_tasks_deployments.get(mcp_tasks_app, mcp_tasks_env)
    return deployment.url


def _settled(log: Path, quiet_s: float = 0.2, bound_s: float = 2.0) -> None:
    """Wait until `log` has not grown for `quiet_s` (at most `bound_s`): a failed job's traceback is logged just
    after its task is recorded failed, which the test may have seen first."""
    deadline = time.monotonic() + bound_s
    size, still_since = -1, time.monotonic()
    while time.monotonic() < deadline:
        now = log.stat().st_size if log.exists() else 0
        if now != size:
            size, still_since = now, time.monotonic()
        elif time.monotonic() - still_since >= quiet_s:
            return
        time.sleep(0.05)


@pytest.fixture
def _mcp_tasks_log_mark(request: pytest.FixtureRequest, mcp_tasks_server: str, _mcp_tasks_deployments: Any) -> None:
    """Where the served deployment's log stands as the test begins (`pytest_runtest_makereport` shows what
    follows); nothing for a server that is not one of the plugin's (an overridden `mcp_tasks_server`)."""
    deployment: Deployment | None = _mcp_tasks_deployments.serving(mcp_tasks_server)
    if deployment is not None:
        log = deployment.log
        request.node.stash[_LOG_MARK] = (log, log.stat().st_size if log.exists() else 0)


@pytest.fixture
def mcp_tasks_answers() -> ScriptedAnswers:
    """The client's elicitation callback: script answers with `.when(text, content)` before calling."""
    return ScriptedAnswers()


@pytest.fixture
def mcp_tasks_extension() -> TasksClient:
    """The client's `TasksClient`: `start(client, tool, args)` gives a `TaskHandle` (follow, answer, cancel)."""
    from celery_mcp_tasks.client import TasksClient

    return TasksClient(timeout=CALL_TIMEOUT_S)


@pytest.fixture(scope="session")  # set up before the module's server: nothing is started for a test that would hang
def _mcp_tasks_on_anyio(request: pytest.FixtureRequest) -> None:
    """The client fixture is anyio's (the SDK's runner): pytest-asyncio in auto mode would take it over and run
    it on an event loop of its own, where every call hangs. Said before anything is started."""
    config = request.config
    try:
        mode = config.getoption("asyncio_mode", None) or config.getini("asyncio_mode")
    except ValueError:  # pytest-asyncio is not installed: no such option
        return
    if mode == "auto":
        pytest.fail(
            "mcp_tasks_client runs under anyio (@pytest.mark.anyio); pytest-asyncio's asyncio_mode=auto takes it "
            "over and its calls hang: set asyncio_mode = strict (pytest-asyncio's default) in the pytest "
            "configuration",
            pytrace=False,
        )


@pytest.fixture
async def mcp_tasks_client(
    _mcp_tasks_on_anyio: None,
    mcp_tasks_server: str,
    mcp_tasks_extension: TasksClient,
    mcp_tasks_answers: ScriptedAnswers,
    _mcp_tasks_log_mark: None,
) -> AsyncIterator[Client]:
    """An SDK `Client` connected to the app, with the Tasks extension and the scripted answers."""
    async with _connected(mcp_tasks_server, mcp_tasks_extension, mcp_tasks_answers) as client:
        yield client


@asynccontextmanager
async def _connected(url: str, extension: TasksClient, answers: ScriptedAnswers) -> AsyncIterator[Client]:
    """The SDK's `Client`, whose close tolerates the SDK's own teardown race and nothing else.

    The race (mcp 2.3, client/streamable_http.py): a JSON response still in flight when the
    client closes (a poll the test no longer waits for, answered while the session's DELETE is
    under way) is forwarded into the session's already closed read stream, and the
    BrokenResourceError leaves the transport's task group. The test is over and nothing of it
    is lost: that alone is ignored, at close, never when connecting.
    """
    import anyio
    from mcp import Client

    connected = False
    try:
        async with Client(url, extensions=[extension], elicitation_callback=answers) as client:
            connected = True
            yield client
    except BaseExceptionGroup as group:
        _, rest = group.split((anyio.BrokenResourceError, anyio.ClosedResourceError))
        if not connected or rest is not None:
            raise
