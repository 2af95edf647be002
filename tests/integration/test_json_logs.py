"""MCP_TASKS_LOG_FORMAT=json with real processes: `serve`, a prefork `celery worker` and `celery beat`.

Each process's stderr is captured apart from its stdout: stderr must be JSON and
nothing else, stdout is where Celery's banner goes (and nothing else does).
Tasks are run through the web process, then every process is stopped, so start-up
and shutdown lines are judged too. A request whose path holds a task id shows it
redacted, in JSON and (uvicorn's own handlers, text mode) in plain lines alike.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import uuid
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from celery_mcp_tasks.model import new_task_id, task_key
from celery_mcp_tasks.ops.redaction import redact
from celery_mcp_tasks.worker.janitor import METRIC
from tests.support import ROOT, Backend, McpHttp, free_port, port_open, process_env, wait_until

pytestmark = pytest.mark.integration

APP = "tests.apps.json_logs_app"
REQUIRED = ("time", "level", "logger", "event", "message")
WORKER_FLAGS = ("--without-mingle", "--without-gossip")


@dataclass
class Captured:
    """A process whose stdout and stderr are written to files of their own."""

    name: str
    popen: subprocess.Popen[bytes]
    out: Path
    err: Path

    def stderr(self) -> str:
        return self.err.read_text(errors="replace")

    def stdout(self) -> str:
        return self.out.read_text(errors="replace")

    def records(self) -> list[dict[str, Any]]:
        """The JSON lines on stderr so far (a line that does not parse yet is skipped here, judged later)."""
        found = []
        for line in self.stderr().splitlines():
            try:
                found.append(json.loads(line))
            except ValueError:
                continue
        return found

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(timeout=5)


def _spawn(name: str, argv: list[str], env: dict[str, str], log_dir: Path) -> Captured:
    out, err = log_dir / f"{name}.out", log_dir / f"{name}.err"
    with out.open("wb") as stdout, err.open("wb") as stderr:
        popen = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=stdout, stderr=stderr, start_new_session=True)
    return Captured(name, popen, out, err)


def _has(proc: Captured, **fields: Any) -> bool:
    return any(all(record.get(k) == v for k, v in fields.items()) for record in proc.records())


def _run_ended(proc: Captured, tool: str) -> bool:
    ends = ("celery.task.succeeded", "celery.task.run_ended")
    return any(r.get("event") in ends and r.get("tool") == tool for r in proc.records())


@dataclass
class Run:
    web: Captured
    worker: Captured
    beat: Captured
    ids: dict[str, str]
    secrets: list[str]
    probe: str
    """A task id in a request's path (`mcp-<id>`, next to a `-`): the access line must not show it."""

    @property
    def procs(self) -> list[Captured]:
        return [self.web, self.worker, self.beat]


@pytest.fixture(scope="module")
def run(backend: Backend, tmp_path_factory: pytest.TempPathFactory) -> Run:
    """Web, worker and beat in json mode; an echo, a question answered and a cancel; then all stopped."""
    log_dir = tmp_path_factory.mktemp(f"json-logs-{backend.name}")
    env = process_env(
        backend,
        MCP_TASKS_QUEUE=f"mcp-test-{uuid.uuid4().hex[:10]}",
        MCP_TASKS_LOG_FORMAT="json",
        MCP_TASKS_JANITOR_INTERVAL_S="1",
        MCP_TASKS_WORKER_METRICS_PORT="off",  # no fixed port shared with other tests' workers
    )
    port, ops_port = free_port(), free_port()
    celery = [sys.executable, "-m", "celery"]
    node = f"json-{uuid.uuid4().hex[:6]}@%h"
    serve = [sys.executable, "-m", "celery_mcp_tasks.cli", "serve", APP, "--port", str(port)]
    # With an ops plugin on: its listener's probes stay out of the access lines, the MCP server's stay in.
    web = _spawn("web", [*serve, "--ops-port", str(ops_port)], {**env, "MCP_TASKS_HEALTH": "on"}, log_dir)
    procs = [web]
    try:
        # The web process migrates the store first: worker and beat refuse an unmigrated one.
        wait_until(lambda: port_open(port) or web.popen.poll() is not None, 60, "web to listen")
        worker_argv = [*celery, "-A", APP, "worker", "-P", "prefork", "-c", "2", "--loglevel", "INFO"]
        worker = _spawn("worker", [*worker_argv, *WORKER_FLAGS, "-n", node], env, log_dir)
        # --quiet: beat's banner is left out of stdout (the worker keeps its own, to show where it goes)
        beat_argv = [*celery, "--quiet", "-A", APP, "beat", "--loglevel", "INFO", "-s", str(log_dir / "s")]
        beat = _spawn("beat", beat_argv, env, log_dir)
        procs += [worker, beat]
        ready = lambda: any(r.get("message", "").endswith(" ready.") for r in worker.records())  # noqa: E731
        wait_until(lambda: ready() or worker.popen.poll() is not None, 60, "the worker to be ready")
        for proc in procs:
            assert proc.popen.poll() is None, f"{proc.name} exited:\n{proc.stderr()}"
        secrets = [f"arg-{uuid.uuid4().hex}", f"answer-{uuid.uuid4().hex}"]
        probe = new_task_id()
        assert httpx.get(f"http://127.0.0.1:{port}/t/mcp-{probe}", timeout=30).status_code == 404
        assert httpx.get(f"http://127.0.0.1:{ops_port}/healthz", timeout=30).status_code == 200
        client = McpHttp(f"http://127.0.0.1:{port}/mcp")
        try:
            ids = {"echo": client.create("echo", {"secret": secrets[0]})}
            assert client.wait_for(ids["echo"])["status"] == "completed"
            ids["ask"] = client.create("ask", {"secret": secrets[0]})
            client.wait_for(ids["ask"], "input_required")
            answer = {"name": {"action": "accept", "content": {"name": secrets[1]}}}
            assert "result" in client.task("tasks/update", ids["ask"], inputResponses=answer)
            done = client.wait_for(ids["ask"])
            assert done["status"] == "completed" and secrets[1] in json.dumps(done["result"])
            ids["linger"] = client.create("linger", {"seconds": 30})
            client.wait_for(ids["linger"], "working")
            wait_until(lambda: _has(worker, event="task.started", tool="linger"), 30, "linger to start")
            assert "result" in client.task("tasks/cancel", ids["linger"])
        finally:
            client.close()
        for tool in ("echo", "ask"):
            wait_until(lambda t=tool: _has(worker, event="task.finished", tool=t), 30, f"{tool} finished in the log")
        wait_until(lambda: _run_ended(worker, "linger"), 30, "linger's run to end")
        wait_until(lambda: _has(worker, event=METRIC), 30, "a janitor sweep sent by beat")
    finally:
        for proc in reversed(procs):
            proc.stop()
    return Run(web, worker, beat, ids, [*secrets, *(s[::-1] for s in secrets)], probe)


def test_every_line_on_stderr_is_one_json_object_with_the_common_fields(run: Run) -> None:
    for proc in run.procs:
        lines = [line for line in proc.stderr().splitlines() if line.strip()]
        assert lines, f"{proc.name} logged nothing"
        for line in lines:
            record = json.loads(line)  # anything else on stderr fails here, with the line
            assert isinstance(record, dict) and all(field in record for field in REQUIRED), line
            assert (
                record["time"].endswith("Z") and datetime.fromisoformat(record["time"]).utcoffset().total_seconds() == 0
            )


def test_stdout_has_only_the_worker_banner(run: Run) -> None:
    assert run.web.stdout() == ""
    assert run.beat.stdout() == ""  # `celery --quiet ... beat`: no banner
    banner = run.worker.stdout()
    assert "[tasks]" in banner and "celery-mcp-tasks: task tools ask, echo, linger" in banner
    assert not any(line.startswith('{"time"') for line in banner.splitlines())  # no log record strayed here


def test_a_run_logs_the_lifecycle_with_tool_and_key_prefix(run: Run) -> None:
    keys = {tool: task_key(task_id)[:8] for tool, task_id in run.ids.items()}
    web, worker = run.web.records(), run.worker.records()

    def events(records: list[dict[str, Any]], tool: str) -> list[dict[str, Any]]:
        return [r for r in records if r.get("event", "").startswith("task.") and r.get("tool") == tool]

    created = events(web, "echo")
    assert [r["event"] for r in created] == ["task.created"] and created[0]["key"] == keys["echo"]
    ran = events(worker, "echo")
    assert [r["event"] for r in ran] == ["task.started", "task.finished"]
    started, finished = ran
    assert started["key"] == finished["key"] == keys["echo"] and started["level"] == "DEBUG"
    assert isinstance(started["queue_wait_ms"], int) and started["attempt"] == 1
    assert finished["level"] == "INFO" and finished["status"] == "completed" and finished["duration_ms"] >= 0

    asked = [r["event"] for r in events(worker, "ask")]
    assert asked == ["task.started", "task.input_required", "task.started", "task.finished"]
    cancelled = [r for r in events(web, "linger") if r["event"] == "task.finished"]
    assert len(cancelled) == 1 and cancelled[0]["status"] == "cancelled" and cancelled[0]["key"] == keys["linger"]


def test_celery_and_job_lines_of_a_run_name_its_tool_and_key(run: Run) -> None:
    key = task_key(run.ids["echo"])[:8]
    worker = run.worker.records()
    received = [r for r in worker if r["event"] == "celery.task.received" and "echo[" in r["message"]]
    assert received, "Celery's task-received line is JSON with its event name"
    for event in ("celery.task.succeeded", "log"):
        assert any(r["event"] == event and r.get("tool") == "echo" and r.get("key") == key for r in worker), event
    said = [r for r in worker if r["message"] == "the job says hello"]
    printed = [r for r in worker if r["message"] == "a job's print goes to the log"]
    assert said and said[0]["logger"] == "json_logs_app" and said[0]["key"] == key
    assert printed and printed[0]["logger"] == "celery.redirected" and printed[0]["tool"] == "echo"


def test_the_janitor_sweep_renders_its_event_fields(run: Run) -> None:
    sweeps = [r for r in run.worker.records() if r["event"] == METRIC]
    assert sweeps and all(isinstance(r["removed"], int) and isinstance(r["failed"], int) for r in sweeps)
    assert any("Sending due task" in r["message"] for r in run.beat.records())


def test_no_line_holds_a_task_id_a_row_key_an_argument_or_a_result(run: Run) -> None:
    forbidden = [*run.ids.values(), *(task_key(i) for i in run.ids.values()), *run.secrets, "result-", run.probe]
    for proc in run.procs:
        for stream, text in (("stderr", proc.stderr()), ("stdout", proc.stdout())):
            for line in text.splitlines():
                leaked = [value for value in forbidden if value in line]
                assert not leaked, f"{proc.name} {stream}: {line}"


def test_an_access_line_shows_a_task_id_in_its_path_redacted_with_its_fields(run: Run) -> None:
    probes = [r for r in run.web.records() if r["event"] == "http.request" and r.get("http_path", "").startswith("/t/")]
    # Usually "/t/mcp-<redacted>"; "/t/<redacted>" when the id's 39th and 40th characters make "mcp-..." a
    # window shaped like an id too (~1 in 100 ids): redaction errs on the side of hiding more.
    expected = redact(f"/t/mcp-{run.probe}")
    assert expected in ("/t/mcp-<redacted>", "/t/<redacted>")
    assert [(r["http_method"], r["http_path"], r["http_status"]) for r in probes] == [("GET", expected, 404)]
    assert not [r for r in run.web.records() if r.get("http_path") == "/healthz"]  # the ops listener's: no line


def test_in_text_mode_uvicorns_own_lines_redact_task_ids(backend: Backend, tmp_path: Path) -> None:
    """uvicorn's stock handlers (access lines on stdout), plus the redaction filter: the docs' promise in text."""
    port = free_port()
    env = process_env(backend, MCP_TASKS_QUEUE=f"mcp-test-{uuid.uuid4().hex[:10]}", MCP_TASKS_LOG_FORMAT="text")
    serve = [sys.executable, "-m", "celery_mcp_tasks.cli", "serve", APP, "--port", str(port)]
    web = _spawn("web-text", serve, env, tmp_path)
    probe = new_task_id()
    try:
        wait_until(lambda: port_open(port) or web.popen.poll() is not None, 60, "web to listen")
        assert httpx.get(f"http://127.0.0.1:{port}/t/{probe}-1", timeout=30).status_code == 404
        wait_until(lambda: "/t/" in web.stdout(), 10, "the access line")
    finally:
        web.stop()
    assert probe not in web.stdout() + web.stderr()
    (line,) = [line for line in web.stdout().splitlines() if "/t/" in line]
    assert '"GET /t/<redacted>-1 HTTP/1.1" 404' in line and not line.startswith("{")  # uvicorn's own text format


def test_logs_json_given_in_code_makes_uvicorns_own_lines_json_too(backend: Backend, tmp_path: Path) -> None:
    """`Logs(json=True)` in the app's code is what MCP_TASKS_LOG_FORMAT=json turns on: uvicorn's start-up and
    access lines are JSON objects as well, not its own text."""
    port = free_port()
    env = process_env(backend, MCP_TASKS_QUEUE=f"mcp-test-{uuid.uuid4().hex[:10]}")
    env.pop("MCP_TASKS_LOG_FORMAT", None)
    serve = [
        sys.executable,
        "-m",
        "celery_mcp_tasks.cli",
        "serve",
        "tests.apps.json_logs_code_app",
        "--port",
        str(port),
    ]
    web = _spawn("web-code", serve, env, tmp_path)
    try:
        wait_until(lambda: port_open(port) or web.popen.poll() is not None, 60, "web to listen")
        assert httpx.get(f"http://127.0.0.1:{port}/t/nothing", timeout=30).status_code == 404
        wait_until(lambda: "/t/nothing" in web.stderr(), 10, "the access line")
    finally:
        web.stop()
    lines = [line for line in web.stderr().splitlines() if line.strip()]
    assert lines and all(line.startswith("{") for line in lines), lines
    records = [json.loads(line) for line in lines]
    assert any(record["logger"] == "uvicorn.error" and "Uvicorn running" in record["message"] for record in records)
    assert any(record["logger"] == "uvicorn.access" for record in records)
    assert "/t/nothing" not in web.stdout()
