"""`celery-mcp-tasks dev`: the README's first command, and the ways `dev` must never mislead.

Each test runs `dev` as a user does, in a process group of its own (the terminal's
foreground group): a busy port, a worker that cannot start, an app module that
`celery -A` cannot read, Ctrl-C while a job runs.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support import POSTGRES_URL, REDIS_URL, ROOT, McpHttp, free_port, fresh_postgres_database, wait_until

pytestmark = pytest.mark.integration


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MCP_TASKS_", "CELERY_"))}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), str(ROOT)])  # this checkout, not an installed copy
    env.update(extra)
    return env


def _dev(*args: str, env: dict[str, str] | None = None, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "celery_mcp_tasks.cli", "dev", *args],
        cwd=ROOT,
        env=env or _env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _processes_mentioning(text: str) -> list[int]:
    """Every live process whose command line names `text` (our data dir: the worker and its beat)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = next(
                (line for line in (entry / "status").read_text().splitlines() if line.startswith("State:")), ""
            )
        except OSError:
            continue
        if text in cmdline and "zombie" not in state:
            found.append(int(entry.name))
    return found


def test_dev_runs_the_quickstart_from_working_to_completed(tmp_path: Path):
    data = tmp_path / "data"
    run = _dev(
        "examples.quickstart.app",
        "--data-dir",
        str(data),
        "--port",
        str(free_port()),
        "--call",
        "write_report",
        '{"topic": "tides"}',
    )
    assert run.returncode == 0, run.stdout + run.stderr
    lines = run.stdout.splitlines()
    assert lines[0].startswith("celery-mcp-tasks dev: MCP endpoint http://127.0.0.1:")
    assert f"  store   sqlite:///{data / 'tasks.db'}" in lines
    assert f"  data    {data}" in lines
    assert "created task: status=working" in lines
    assert "status=working  (Writing section 3 of 3)" in lines
    assert lines[-2:] == ["status=completed", "A 3-section report on tides."]
    assert (data / "tasks.db").is_file()  # SQLite, no servers
    assert not _processes_mentioning(str(data))
    assert '"POST /mcp HTTP/1.1"' not in run.stdout  # with --call, the server's access lines stay out


@pytest.mark.postgres
@pytest.mark.redis
def test_dev_keeping_the_environment_runs_beat_and_names_the_broker_its_app_uses(tmp_path: Path):
    """`--keep-env` (an app whose broker and store are set for it): the data directory does not exist yet and
    no embedded broker makes it; beat's schedule file is kept there all the same, and the banner names the
    broker the app's Celery uses."""
    if not (POSTGRES_URL and REDIS_URL):
        pytest.skip("set MCP_TASKS_TEST_POSTGRES_URL and MCP_TASKS_TEST_REDIS_URL to run")
    data = tmp_path / "data"  # not made yet
    with fresh_postgres_database(POSTGRES_URL) as url:
        run = _tides(tmp_path, _env(MCP_TASKS_DATABASE_URL=url, CELERY_BROKER_URL=REDIS_URL), "--keep-env")
    output = run.stdout + run.stderr
    assert run.returncode == 0, output
    assert f"  broker  {REDIS_URL}" in run.stdout.splitlines()
    assert "Removing corrupted schedule file" not in output, output  # beat did not die for want of its folder
    assert (data / "beat-schedule.dat").is_file() or (data / "beat-schedule").is_file()


def test_dev_says_it_ignores_a_database_and_broker_set_in_the_environment(tmp_path: Path):
    """Exported for `serve`, they would leave a user wondering why `dev` showed SQLite: one line says so."""
    env = _env(
        MCP_TASKS_DATABASE_URL="postgresql://nobody@127.0.0.1:1/none", CELERY_BROKER_URL="redis://:s3cr3tpw@x:1/0"
    )
    run = _tides(tmp_path, env)
    assert run.returncode == 0, run.stdout + run.stderr
    assert (
        "celery-mcp-tasks dev: ignoring MCP_TASKS_DATABASE_URL, CELERY_BROKER_URL: dev runs embedded "
        "(--keep-env uses them)"
    ) in run.stderr.splitlines()
    assert (
        "s3cr3tpw" not in run.stderr
        and f"  store   sqlite:///{tmp_path / 'data' / 'tasks.db'}" in run.stdout.splitlines()
    )


def test_dev_takes_the_servers_and_workers_log_level(tmp_path: Path):
    port = str(free_port())
    call = ("--call", "write_report", '{"topic": "tides", "sections": 1}')
    run = _dev("examples.quickstart.app", "--data-dir", str(tmp_path), "--port", port, "--log-level", "INFO", *call)
    assert run.returncode == 0, run.stdout + run.stderr
    assert '"POST /mcp HTTP/1.1" 200' in run.stdout  # uvicorn's access lines, asked for over --call's default
    worker = run.stderr  # the worker's output is forwarded to dev's stderr
    assert "Task write_report[" in worker and "succeeded in" in worker  # its INFO lines too


def test_a_busy_port_is_an_error_before_anything_happens(tmp_path: Path):
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen(8)
        other.settimeout(0.5)
        port = other.getsockname()[1]
        run = _dev(
            "examples.quickstart.app",
            "--data-dir",
            str(tmp_path / "data"),
            "--port",
            str(port),
            "--call",
            "write_report",
            '{"topic": "tides"}',
            timeout=60,
        )
        with pytest.raises(socket.timeout):
            other.accept()  # --call never talked to the process that owns the port
    assert run.returncode != 0
    assert run.stderr.strip().splitlines() == [
        f"celery-mcp-tasks dev: port {port} on 127.0.0.1 is already in use (another server?); "
        "stop it or pick another with --port"
    ]
    assert not (tmp_path / "data").exists()  # nothing was started or written


def test_a_worker_that_cannot_start_ends_dev_with_its_error(tmp_path: Path):
    run = _dev(
        "tests.apps.broken_worker_app",
        "--data-dir",
        str(tmp_path / "data"),
        "--port",
        str(free_port()),
        "--call",
        "never_runs",
        "{}",
        timeout=90,
    )
    assert run.returncode == 1, run.stdout + run.stderr
    assert run.stderr.strip().splitlines()[-1] == (
        "celery-mcp-tasks dev: the worker exited (status 1): "
        "ModuleNotFoundError: No module named 'tests.apps.module_that_does_not_exist'"
    )
    assert "status=completed" not in run.stdout
    assert not _processes_mentioning(str(tmp_path / "data"))


def test_an_app_module_celery_cannot_read_gets_one_line_saying_what_to_add(tmp_path: Path):
    for app in ("tests.apps.no_celery_attribute_app", "tests.apps.no_celery_attribute_app:jobs"):
        run = _dev(app, "--data-dir", str(tmp_path / "data"), "--port", str(free_port()), timeout=60)
        assert run.returncode != 0
        assert run.stderr.strip().splitlines() == [
            "celery-mcp-tasks: `celery -A tests.apps.no_celery_attribute_app worker` cannot find this app's "
            "Celery app: add `celery = jobs.celery` to tests.apps.no_celery_attribute_app"
        ]


def test_module_colon_attribute_names_the_app_and_data_dir_wins_over_the_environment(tmp_path: Path):
    chosen, ignored = tmp_path / "chosen", tmp_path / "ignored"
    run = _dev(
        "examples.quickstart.app:tasks",
        "--data-dir",
        str(chosen),
        "--port",
        str(free_port()),
        "--call",
        "write_report",
        '{"topic": "eels", "sections": 1}',
        env=_env(MCP_TASKS_DATA_DIR=str(ignored)),
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"  data    {chosen}" in run.stdout.splitlines()
    assert run.stdout.splitlines()[-1] == "A 1-section report on eels."
    assert (chosen / "tasks.db").is_file() and not ignored.exists()


def _sigint_ignored() -> None:  # pragma: no cover - runs in the child between fork and exec
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def test_ctrl_c_while_a_job_runs_ends_everything_within_seconds(tmp_path: Path):
    """Started with SIGINT ignored, as a shell script's background job is (and as this test runner may be):
    the Ctrl-C still ends `dev` as interrupted. uvicorn stops on SIGINT whatever the disposition and then
    re-raises it; before, that ignored re-raise ended `dev` with 0 whenever the runner ignored SIGINT."""
    data, port = tmp_path / "data", free_port()
    dev = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "celery_mcp_tasks.cli",
            "dev",
            "tests.apps.runtime_app",
            "--data-dir",
            str(data),
            "--port",
            str(port),
        ],
        cwd=ROOT,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        preexec_fn=_sigint_ignored,
    )
    client = McpHttp(f"http://127.0.0.1:{port}/mcp")
    try:
        task_id = wait_until(lambda: _try_create(client), 60, "dev to serve")
        client.wait_for(task_id, "working", timeout=30)
        wait_until(lambda: "sleeping" in (client.get(task_id).get("statusMessage") or ""), 30, "the job to run")
        assert _processes_mentioning(str(data)), "the worker should be running"
        # "within seconds": a stubborn job must not hold dev up (it sleeps 120 s)
        output = _ctrl_c(dev, data, within_s=20)
        assert "the worker had not finished its warm shutdown within 6 s: killed it and any job" in output
    finally:
        _stop(dev, client, data)


def _ctrl_c(dev: subprocess.Popen[bytes], data: Path, *, within_s: float) -> str:
    """What the terminal does on Ctrl-C (SIGINT to the whole foreground group); `dev`'s output once it ended as
    interrupted, without a traceback, and nothing of it left behind."""
    os.killpg(dev.pid, signal.SIGINT)
    dev.wait(timeout=within_s)
    output = dev.stdout.read().decode(errors="replace") if dev.stdout else ""
    assert dev.returncode == 130, output
    assert "Traceback" not in output, output
    wait_until(lambda: not _processes_mentioning(str(data)), 5, "no process left behind")
    return output


def _stop(dev: subprocess.Popen[bytes], client: McpHttp, data: Path) -> None:
    client.close()
    if dev.poll() is None:
        os.killpg(dev.pid, signal.SIGKILL)
    for pid in _processes_mentioning(str(data)):
        os.kill(pid, signal.SIGKILL)


def test_ctrl_c_on_an_idle_dev_lets_the_worker_finish_its_warm_shutdown(tmp_path: Path):
    """An idle worker on the embedded broker took ~7 s to stop (Celery drains it 2 s at a time, and once more
    after the stop): `dev` killed it at 6 s, every time. Now it stops by itself, and nothing is killed."""
    data, port = tmp_path / "data", free_port()
    dev = _dev_on_runtime_app(data, port, stderr=subprocess.STDOUT)
    client = McpHttp(f"http://127.0.0.1:{port}/mcp")
    try:
        task_id = wait_until(lambda: _try_create(client, "work", {"seconds": 0}), 60, "dev to serve")
        client.wait_for(task_id, "completed", timeout=60)  # the worker is up and idle again
        output = _ctrl_c(dev, data, within_s=30)
        assert "Warm shutdown" in output and "killed it" not in output, output
    finally:
        _stop(dev, client, data)


def _try_create(client: McpHttp, tool: str = "stubborn", arguments: dict[str, float] | None = None) -> str | None:
    try:
        return client.create(tool, {"seconds": 120} if arguments is None else arguments)
    except Exception:  # noqa: BLE001 - not listening yet
        return None


def test_a_terminate_tool_cancelled_under_dev_stops_within_a_second(tmp_path: Path):
    """`dev` runs a pool that can kill a job: a busy `terminate=True` job stops at its cancel, quietly."""
    data, port, scribbles = tmp_path / "data", free_port(), tmp_path / "scribbles"
    dev = _dev_on_runtime_app(data, port, stderr=subprocess.STDOUT)
    client = McpHttp(f"http://127.0.0.1:{port}/mcp")

    def create() -> str | None:
        try:
            return client.create("scribble", {"path": str(scribbles), "seconds": 120})
        except Exception:  # noqa: BLE001 - not listening yet
            return None

    try:
        task_id = wait_until(create, 60, "dev to serve")
        first = wait_until(lambda: scribbles.exists() and scribbles.read_text(), 30, "the job to write")
        wait_until(lambda: scribbles.read_text() not in ("", first), 5, "the job to write again")
        client.task("tasks/cancel", task_id)
        assert client.get(task_id)["status"] == "cancelled"
        time.sleep(1.0)
        stopped = scribbles.read_text()
        time.sleep(0.5)  # ten writes' worth: the file no longer changes
        assert scribbles.read_text() == stopped, "the job was not terminated within a second"
        os.killpg(dev.pid, signal.SIGINT)
        dev.wait(timeout=20)
        output = dev.stdout.read().decode(errors="replace") if dev.stdout else ""
        assert "kill_job" not in output and "Traceback" not in output, output
        assert '"POST /mcp HTTP/1.1"' not in output  # no line per request unless --log-level asks for them
        assert "Uvicorn running on" in output or "Application startup complete" in output  # its other lines stay
    finally:
        client.close()
        if dev.poll() is None:
            os.killpg(dev.pid, signal.SIGKILL)
        for pid in _processes_mentioning(str(data)):
            os.kill(pid, signal.SIGKILL)


def _tides(tmp_path: Path, env: dict[str, str], *options: str) -> subprocess.CompletedProcess[str]:
    """`dev --call write_report` on the quickstart, one section, in `env`."""
    data, port = str(tmp_path / "data"), str(free_port())
    return _dev("examples.quickstart.app", *options, "--data-dir", data, "--port", port, *_ONE_SECTION, env=env)


_ONE_SECTION = ("--call", "write_report", '{"topic": "tides", "sections": 1}')


@pytest.mark.parametrize("busy", [False, True])
def test_dev_call_with_an_operations_plugin_says_its_port_once_and_adds_no_server_chatter(tmp_path: Path, busy: bool):
    """The ops listener takes `dev`'s log level (warning with --call), says where it serves only once it is
    bound, and a busy port is one warning naming the one setting `dev` reads for it."""
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        if busy:
            other.listen(8)
        ops_port = other.getsockname()[1]
        if not busy:
            other.close()
        run = _tides(tmp_path, _env(MCP_TASKS_HEALTH="on", MCP_TASKS_OPS_PORT=str(ops_port)))
    said = run.stdout + run.stderr
    assert run.returncode == 0, said
    assert "Uvicorn running" not in said and "Started server process" not in said and "Errno" not in said, said
    where = f"operations routes on http://127.0.0.1:{ops_port}"
    warning = f"the operations port 127.0.0.1:{ops_port} is not free; serving MCP without it (set MCP_TASKS_OPS_PORT)"
    assert (said.count(warning), said.count(where)) == ((1, 0) if busy else (0, 1)), said


def test_a_bad_ops_port_is_refused_with_no_plugin_serving_on_it(tmp_path: Path):
    run = _tides(tmp_path, _env(MCP_TASKS_OPS_PORT="abc"))
    assert run.returncode == 1, run.stdout + run.stderr
    assert run.stderr.strip().splitlines()[-1] == (
        "celery-mcp-tasks: configuration error: MCP_TASKS_OPS_PORT: expected a TCP port or off, got 'abc'"
    )


def test_a_worker_killed_outright_ends_dev_though_its_beat_outlives_it(tmp_path: Path):
    """SIGKILL of the worker's main process leaves its beat (and pool children) alive, holding the output pipe:
    dev used to keep serving tasks that stayed `Queued` for good."""
    data, port = tmp_path / "data", free_port()
    dev = _dev_on_runtime_app(data, port, stderr=subprocess.PIPE)
    try:
        wait_until(lambda: _worker_main(dev.pid) is not None, 60, "dev's worker to start")
        worker = _worker_main(dev.pid)
        assert worker is not None
        # Its four pool processes and the embedded beat (`worker -B` forks it once the worker is up).
        wait_until(lambda: len(_children(worker)) >= 5, 60, "the worker's pool and beat")
        os.kill(worker, signal.SIGKILL)
        dev.wait(timeout=30)
        errors = dev.stderr.read().decode(errors="replace") if dev.stderr else ""
        assert dev.returncode == 1, errors
        assert errors.strip().splitlines()[-1] == "celery-mcp-tasks dev: the worker was killed (SIGKILL)", errors
        wait_until(lambda: not _processes_mentioning(str(data)), 10, "no process left behind")
    finally:
        if dev.poll() is None:
            os.killpg(dev.pid, signal.SIGKILL)
        for pid in _processes_mentioning(str(data)):
            os.kill(pid, signal.SIGKILL)


def test_dev_killed_outright_takes_its_worker_and_running_job_along(tmp_path: Path):
    """SIGKILL of `dev` gave its worker a warm shutdown, which waits for the job however long it runs: the worker
    and a job that ignores cancels lived on, unsupervised, beside the next `dev`. Now the worker gets Celery's
    cold shutdown, and holds the data directory while it lives."""
    data, port = tmp_path / "data", free_port()
    dev = _dev_on_runtime_app(data, port, stderr=subprocess.STDOUT)
    client = McpHttp(f"http://127.0.0.1:{port}/mcp")
    try:
        task_id = wait_until(lambda: _try_create(client), 60, "dev to serve")
        wait_until(lambda: "sleeping" in (client.get(task_id).get("statusMessage") or ""), 30, "the job to run")
        os.kill(dev.pid, signal.SIGKILL)
        dev.wait(timeout=10)
        wait_until(lambda: not _processes_mentioning(str(data)), 20, "the worker and its job to end")
    finally:
        _stop(dev, client, data)


def _dev_on_runtime_app(data: Path, port: int, *, stderr: int) -> subprocess.Popen[bytes]:
    """`dev tests.apps.runtime_app` in a session of its own, its stdout piped (stderr: `stderr`)."""
    argv = [sys.executable, "-m", "celery_mcp_tasks.cli", "dev", "tests.apps.runtime_app"]
    return subprocess.Popen(
        [*argv, "--data-dir", str(data), "--port", str(port)],
        cwd=ROOT,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=stderr,
        start_new_session=True,
    )


def _children(parent: int) -> list[tuple[int, str]]:
    """(pid, command line) of each live child of `parent`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            status = (entry / "status").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        ppid = next((line.split()[1] for line in status.splitlines() if line.startswith("PPid:")), "")
        if ppid == str(parent) and "State:\tZ" not in status:
            found.append((int(entry.name), cmdline))
    return found


def _worker_main(dev_pid: int) -> int | None:
    """The `celery worker` process `dev` started (its child; the worker's own children are not dev's)."""
    return next((pid for pid, cmdline in _children(dev_pid) if " worker " in cmdline), None)
