"""`celery-mcp-tasks stdio APP`: the app over stdin/stdout, as a desktop or IDE client launches it.

The official SDK client starts the command itself (embedded default in a temp
data dir, so the command starts its own worker); each test checks that closing
the client leaves no process behind. Raw runs prove that stdout carries
JSON-RPC only, even from an app that prints at import, and that a bad APP or a
dead worker ends in one line.
"""

from __future__ import annotations

import json
import os
import re
import select
import signal
import sqlite3
import subprocess
import sys
import uuid
from contextlib import closing
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client, StdioServerParameters
from mcp_types import CallToolResult

from celery_mcp_tasks.cli.stdio import wants_worker
from celery_mcp_tasks.client import TasksClient, TaskState
from celery_mcp_tasks.migrate import upgrade
from celery_mcp_tasks.testing import ScriptedAnswers
from tests.conftest import needs_pg_redis
from tests.support import POSTGRES_URL, REDIS_URL, ROOT, Backend, fresh_postgres_database, start_worker, wait_until

pytestmark = pytest.mark.integration

NOISY_APP = '''
print("hello from the app at import")

from celery_mcp_tasks import McpTasks

tasks = McpTasks("noisy")
celery = tasks.celery


@tasks.mcp_task
def shout(text: str) -> str:
    """Prints in the worker, then answers."""
    print(f"shouting {text}")
    return text.upper()


@tasks.server.tool()
def echo(text: str) -> str:
    """A plain tool of the web side: prints in the server process itself."""
    print(f"echoing {text}", end="")  # no newline: held in sys.stdout's buffer until the process ends
    return text
'''


def _params(data: Path, *args: str, app: str = "tests.apps.runtime_app") -> StdioServerParameters:
    return StdioServerParameters(
        command=sys.executable,
        args=["-m", "celery_mcp_tasks.cli", "stdio", app, "--data-dir", str(data), *args],
        env={"PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])},  # this checkout, not an installed copy
        cwd=ROOT,
    )


def _alive_mentioning(text: str) -> list[int]:
    """Live (non-zombie) processes whose command line names `text`: a unique data dir finds ours."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            status = (entry / "status").read_text()
        except OSError:
            continue
        if text in cmdline and "zombie" not in status:
            found.append(int(entry.name))
    return found


def _worker_pids(data: Path) -> list[int]:
    marker = str(data / "stdio-beat-schedule")
    return [pid for pid in _alive_mentioning(marker) if "celery" in Path(f"/proc/{pid}/cmdline").read_text()]


def _nothing_left(data: Path) -> None:
    wait_until(lambda: not _alive_mentioning(str(data)), 15, "every process of the stdio server to end")


def text(result: CallToolResult) -> str:
    return "".join(getattr(item, "text", "") for item in result.content)


def test_an_earlier_era_client_gets_a_task_tools_result_synchronously(tmp_path: Path) -> None:
    data = tmp_path / "data"

    async def scenario() -> tuple[CallToolResult, list[int]]:
        async with Client(_params(data), mode="legacy") as client:
            result = await client.call_tool("work", {"seconds": 0.2})
            return result, _worker_pids(data)

    result, workers = anyio.run(scenario)
    assert not result.is_error
    assert text(result) == "worked 0.2s on attempt 1"
    assert workers, "the command started no worker of its own on the embedded default"
    _nothing_left(data)
    assert (data / "tasks.db").is_file()


def test_a_2026_client_creates_a_task_follows_it_by_push_and_answers_its_questions(tmp_path: Path) -> None:
    data = tmp_path / "data"
    answers = ScriptedAnswers().when("name", {"name": "Ada"}).when("colour", {"colour": "teal"})
    # A polling interval far beyond the test's bound: the task can only be followed by push (listen).
    tasks = TasksClient(poll_floor_s=120, poll_ceiling_s=120)

    async def scenario() -> tuple[list[TaskState], CallToolResult, CallToolResult]:
        async with Client(_params(data), extensions=[tasks], elicitation_callback=answers) as client:
            with anyio.fail_after(60):
                handle = await tasks.start(client, "work", {"seconds": 0.5})
                assert handle.id is not None
                seen = [state async for state in handle.updates()]
                worked = await handle.result()
                asked = await client.call_tool("two_rounds", {})
            return seen, worked, asked

    seen, worked, asked = anyio.run(scenario)
    assert seen[-1].status == "completed"
    assert any((state.status_message or "").endswith(": working") for state in seen), seen
    assert text(worked) == "worked 0.5s on attempt 1"
    assert text(asked).startswith("Ada likes teal")
    assert answers.asked == ["Your name?", "Favourite colour?"]
    _nothing_left(data)


@needs_pg_redis
def test_on_postgres_and_redis_it_serves_the_configured_store_and_workers_elsewhere_run_the_jobs(
    tmp_path: Path,
) -> None:
    assert POSTGRES_URL and REDIS_URL
    with fresh_postgres_database(POSTGRES_URL) as url:
        backend = Backend("pg_redis", {"MCP_TASKS_DATABASE_URL": url, "CELERY_BROKER_URL": REDIS_URL})
        # A queue of its own: a test run beside this one on the same Redis would otherwise take its jobs.
        queue = {"MCP_TASKS_QUEUE": f"stdio-{uuid.uuid4().hex[:12]}"}
        upgrade(url)  # the separate worker refuses an unmigrated store
        worker = start_worker(
            "tests.apps.runtime_app", backend, tmp_path, pool="threads", MCP_TASKS_QUEUE=queue["MCP_TASKS_QUEUE"]
        )
        tasks = TasksClient(poll_floor_s=120, poll_ceiling_s=120)  # followed by push (PostgreSQL NOTIFY) only
        params = _params(tmp_path / "unused")
        params.env = {**(params.env or {}), **backend.env, **queue}

        async def scenario() -> tuple[CallToolResult, list[int]]:
            async with Client(params, extensions=[tasks]) as client:
                with anyio.fail_after(60):
                    return await client.call_tool("work", {"seconds": 1.5}), _worker_pids(tmp_path / "unused")

        try:
            result, own_workers = anyio.run(scenario)
        finally:
            worker.stop()
    assert text(result) == "worked 1.5s on attempt 1"
    assert own_workers == []  # a networked broker: the command started no worker of its own
    assert "stdio-beat-schedule" not in worker.text()
    _nothing_left(tmp_path / "unused")


def _read_message(proc: subprocess.Popen[bytes], timeout: float) -> dict[str, Any]:
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    assert ready, "no JSON-RPC message on stdout in time"
    line = proc.stdout.readline()
    assert line, "stdout closed"
    message: dict[str, Any] = json.loads(line)
    return message


def _send(proc: subprocess.Popen[bytes], message: dict[str, Any]) -> None:
    assert proc.stdin is not None
    proc.stdin.write(json.dumps({"jsonrpc": "2.0", **message}).encode() + b"\n")
    proc.stdin.flush()


def _initialize(proc: subprocess.Popen[bytes]) -> None:
    """The handshake, by hand, on a 2025-11-25 session (no extension: calls are answered synchronously)."""
    client = {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}
    _send(proc, {"id": 1, "method": "initialize", "params": client})
    assert _read_message(proc, 60)["id"] == 1
    _send(proc, {"method": "notifications/initialized"})


def _launch(tmp_path: Path, *args: str) -> tuple[subprocess.Popen[bytes], Path]:
    err = tmp_path / "stderr.log"
    # As a desktop client launches it: no settings of this machine, and Python's own buffering of stdout.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MCP_TASKS_", "CELERY_", "PYTHONUNBUFFERED"))}
    proc = subprocess.Popen(
        [sys.executable, "-m", "celery_mcp_tasks.cli", "stdio", *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=err.open("wb"),
        env=env,
        cwd="/",
        start_new_session=True,
    )
    return proc, err


def test_stdout_carries_json_rpc_only_even_from_an_app_that_prints(tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "noisy_app.py").write_text(NOISY_APP)
    # Launched from / with --directory: what a client that cannot set a working directory does.
    proc, err = _launch(tmp_path, "noisy_app", "--directory", str(project))
    try:
        _initialize(proc)
        _send(proc, {"id": 2, "method": "tools/call", "params": {"name": "shout", "arguments": {"text": "hi"}}})
        reply = _read_message(proc, 60)
        assert reply["id"] == 2 and reply["result"]["content"][0]["text"] == "HI", reply
        wait_until(lambda: "shouting hi" in err.read_text(), 10, "the worker's print on stderr")
        proc.send_signal(signal.SIGTERM)  # a client that ends the server by signal: still a clean exit
        assert proc.wait(timeout=30) == 0
        assert proc.stdout is not None
        rest = proc.stdout.read()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    for line in rest.splitlines():
        assert json.loads(line)["jsonrpc"] == "2.0", line
    log = err.read_text()
    assert "hello from the app at import" in log
    assert "celery-mcp-tasks stdio: serving noisy_app over stdin/stdout" in log
    assert "  data    .celery-mcp-tasks" in log  # the default data dir, in --directory
    assert (project / ".celery-mcp-tasks" / "tasks.db").is_file()
    _nothing_left(project)


def test_a_client_gone_before_a_calls_answer_ends_the_server_without_a_traceback(tmp_path: Path) -> None:
    """A desktop client killed outright leaves the server's stdout closed: its next write (a call's answer) fails
    with a broken pipe. That is the client leaving, as closed stdin is: a clean exit, and no traceback in the
    client's log (the SDK raises it inside an exception group, past the command's own handler)."""
    proc, err = _launch(tmp_path, "tests.apps.runtime_app", "--directory", str(ROOT), "--data-dir", str(tmp_path))
    marker = tmp_path / "started"
    try:
        _initialize(proc)
        call = {"name": "work", "arguments": {"seconds": 1, "marker": str(marker)}}
        _send(proc, {"id": 2, "method": "tools/call", "params": call})
        wait_until(marker.exists, 60, "the job to start")
        assert proc.stdout is not None and proc.stdin is not None
        proc.stdout.close()  # as a killed client's end of the pipe is: the answer, a second later, meets it closed
        with closing(sqlite3.connect(tmp_path / "tasks.db")) as db:
            wait_until(
                lambda: db.execute("SELECT status FROM mcp_tasks_task").fetchall() == [("completed",)],
                60,
                "the job to end, and its answer to be written",
            )
        proc.stdin.close()  # the SDK's reader, in a thread, leaves only now
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    log = err.read_text()
    assert "Traceback" not in log and "BrokenPipeError" not in log, log
    _nothing_left(tmp_path)


def test_what_the_server_process_prints_never_follows_the_last_message_on_stdout(tmp_path: Path) -> None:
    """A web-side tool's print sat in sys.stdout's buffer past the wire's end, and the SDK had given fd 1 back
    to stdout by then: it came out after the last JSON-RPC message. The client closes stdin here (the SDK's
    way), so the process ends normally and flushes."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "noisy_app.py").write_text(NOISY_APP)
    proc, err = _launch(tmp_path, "noisy_app", "--directory", str(project))
    try:
        _initialize_legacy(proc)
        _send(proc, {"id": 2, "method": "tools/call", "params": {"name": "echo", "arguments": {"text": "hi"}}})
        reply = _read_message(proc, 60)
        assert reply["id"] == 2 and reply["result"]["content"][0]["text"] == "hi", reply
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.close()
        rest = proc.stdout.read()
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert b"echoing" not in rest, rest
    for line in rest.splitlines():
        assert json.loads(line)["jsonrpc"] == "2.0", line
    assert "echoing hi" in err.read_text()
    _nothing_left(project)


def _initialize_legacy(proc: subprocess.Popen[bytes]) -> None:
    """The 2025-11-25 handshake: an earlier-era client, so a task tool answers synchronously."""
    params = {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}
    _send(proc, {"id": 1, "method": "initialize", "params": params})
    assert _read_message(proc, 60)["id"] == 1
    _send(proc, {"method": "notifications/initialized"})


def _statuses(data: Path, tool: str) -> list[str]:
    with closing(sqlite3.connect(data / "tasks.db")) as conn:
        return [row[0] for row in conn.execute("SELECT status FROM mcp_tasks_task WHERE tool = ?", (tool,))]


def test_a_signal_during_a_synchronous_call_cancels_its_hidden_task(tmp_path: Path) -> None:
    data, marker = tmp_path / "data", tmp_path / "started"
    proc, _ = _launch(tmp_path, "tests.apps.runtime_app", "--directory", str(ROOT), "--data-dir", str(data))
    try:
        _initialize_legacy(proc)
        arguments = {"seconds": 120, "marker": str(marker)}
        _send(proc, {"id": 2, "method": "tools/call", "params": {"name": "work", "arguments": arguments}})
        wait_until(marker.exists, 60, "the job to start")
        assert _statuses(data, "work") == ["working"]
        proc.send_signal(signal.SIGTERM)  # the call is still waiting: its handler never unwinds
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert _statuses(data, "work") == ["cancelled"]  # not `working` with its job running for nobody
    _nothing_left(data)


def test_a_dead_worker_ends_the_server_with_one_line(tmp_path: Path) -> None:
    data = tmp_path / "data"
    proc, err = _launch(tmp_path, "tests.apps.runtime_app", "--directory", str(ROOT), "--data-dir", str(data))
    try:
        found = wait_until(lambda: re.search(r"worker  pid (\d+)", err.read_text()), 60, "the worker's pid")
        pid = int(found.group(1))
        wait_until(lambda: pid in _worker_pids(data), 10, "the worker process")
        os.kill(pid, signal.SIGKILL)
        assert proc.wait(timeout=30) == 1
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    last = err.read_text().strip().splitlines()[-1]
    assert last == "celery-mcp-tasks stdio: the worker was killed (SIGKILL)", last
    _nothing_left(data)


def _refused_start(cwd: Path, app: str, data: Path | None = None) -> subprocess.CompletedProcess[str]:
    """`stdio APP` run from `cwd` (the data directory too, unless `data`) with stdin closed, for an APP that cannot
    start."""
    return subprocess.run(
        [sys.executable, "-m", "celery_mcp_tasks.cli", "stdio", app, "--data-dir", str(data or cwd)],
        cwd=cwd,
        env={k: v for k, v in os.environ.items() if not k.startswith(("MCP_TASKS_", "CELERY_"))},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_bad_app_is_one_line_on_stderr_and_nothing_on_stdout(tmp_path: Path) -> None:
    run = _refused_start(tmp_path, "no_such_module.tasks")
    assert run.returncode == 1
    assert run.stdout == ""
    assert run.stderr.strip().splitlines() == [
        f"celery-mcp-tasks: cannot import 'no_such_module.tasks' (APP is a module path such as myapp.tasks, "
        f"importable from {tmp_path})"
    ]


def test_an_app_missing_a_dependency_is_not_said_to_be_missing_itself(tmp_path: Path) -> None:
    """`pandas_tasks.py` importing a `pandas` that is not installed: the app is there, its dependency is not
    (the check compared names by prefix, and blamed the APP path)."""
    (tmp_path / "needy_tasks.py").write_text("import needy\n")
    run = _refused_start(tmp_path, "needy_tasks")
    assert run.returncode == 1 and run.stdout == ""
    assert "cannot import 'needy_tasks'" not in run.stderr
    assert "ModuleNotFoundError: No module named 'needy'" in run.stderr


def test_a_data_directory_it_cannot_write_is_one_line_naming_the_option(tmp_path: Path) -> None:
    """A desktop client may start the command in `/` or a read-only folder, where the default data directory
    (`./.celery-mcp-tasks`) cannot be made: one line with the full path and the option, not a traceback."""
    (tmp_path / "a-file").write_text("")
    data = tmp_path / "a-file" / "data"  # under a file: not a directory, for any user (root writes read-only ones)
    run = _refused_start(ROOT, "examples.quickstart.app", data)
    assert run.returncode == 1 and run.stdout == ""
    assert run.stderr.strip().splitlines() == [
        f"celery-mcp-tasks stdio: cannot write the data directory {data} (Not a directory); give it one it can write"
        " (--data-dir or MCP_TASKS_DATA_DIR)"
    ], run.stderr


def test_a_worker_is_started_by_default_only_on_the_embedded_broker() -> None:
    assert wants_worker(None, "filesystem://")
    assert not wants_worker(None, "redis://127.0.0.1:6379/0")  # its workers run elsewhere
    assert wants_worker(True, "redis://127.0.0.1:6379/0")
    assert not wants_worker(False, "filesystem://")


def test_a_second_server_on_the_same_data_directory_is_refused_in_one_line(tmp_path: Path) -> None:
    """Two supervised workers on one filesystem broker would take each other's jobs, and either one's exit would
    kill the other's: a second `stdio` (or `dev`) there stops at start, naming the one that holds it."""
    from tests.support import free_port

    data = tmp_path / "data"

    def command(*args: str) -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("MCP_TASKS_", "CELERY_"))}
        argv = [sys.executable, "-m", "celery_mcp_tasks.cli", *args]
        return subprocess.run(
            argv, cwd=ROOT, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120
        )

    first, err = _launch(tmp_path, "tests.apps.runtime_app", "--directory", str(ROOT), "--data-dir", str(data))
    try:
        wait_until(lambda: "worker  pid" in err.read_text(), 60, "the first server's worker")
        held = f"celery-mcp-tasks stdio (pid {first.pid}) already runs a worker on the data directory {data}"
        second = command("stdio", "tests.apps.runtime_app", "--data-dir", str(data))
        assert second.returncode == 1 and second.stdout == ""
        assert "serving" not in second.stderr  # refused before anything was migrated or announced
        assert second.stderr.strip().splitlines()[-1] == (
            f"celery-mcp-tasks stdio: {held}; a second one would take its jobs and kill them when either exits. "
            "Give each its own data directory (--data-dir or MCP_TASKS_DATA_DIR)"
        ), second.stderr
        dev = ["dev", "tests.apps.runtime_app", "--data-dir", str(data), "--port", str(free_port())]
        refused = command(*dev, "--call", "work", '{"seconds": 0}')
        assert refused.returncode == 1 and f"celery-mcp-tasks dev: {held}" in refused.stderr, refused.stderr
        assert "MCP endpoint" not in refused.stdout
        assert first.poll() is None and len(_worker_pids(data)) >= 1  # the first one runs on, untouched
        _initialize_legacy(first)
        _send(first, {"id": 2, "method": "tools/call", "params": {"name": "work", "arguments": {"seconds": 0}}})
        assert _read_message(first, 60)["result"]["content"][0]["text"] == "worked 0s on attempt 1"
        assert first.stdin is not None
        first.stdin.close()  # the client leaves: the directory is free again
        assert first.wait(timeout=30) == 0
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
            first.wait()
    _nothing_left(data)
    again = command(*dev, "--call", "work", '{"seconds": 0}')
    assert again.returncode == 0, again.stderr
