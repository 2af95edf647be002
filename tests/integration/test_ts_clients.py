"""Independent TypeScript clients, the official packages, against `serve` and a real worker.

- `@modelcontextprotocol/client` 2.x with `@modelcontextprotocol/ext-tasks` 0.2.x speak
  2026-07-28 with the Tasks extension: they create a task and follow it (polling
  `tasks/get`, or pushed `notifications/tasks` on `subscriptions/listen`), answer an
  `input_required` task (`tasks/update`) and cancel one (`tasks/cancel`).
- `@modelcontextprotocol/sdk` 1.x speaks the earlier era (the `initialize` handshake, no
  extension): a task tool answers synchronously, with `notifications/progress` while it
  waits, its question asked on the request stream, and `notifications/cancelled` ending it.

The client programs are tests/interop/*.mjs: each takes the server URL and a scenario
and prints one JSON line of what it observed. The packages and Node come from npm
(tests/support_node.py); without npm the tests skip, and fail when `CI` is set.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from celery_mcp_tasks.store.engine import normalize_url
from tests.support import Backend, Deployment, wait_until
from tests.support_node import npm_packages

pytestmark = pytest.mark.integration

EXT_TASKS = "@modelcontextprotocol/ext-tasks@0.2.2"
CLIENT = "@modelcontextprotocol/client@2.4.0"  # ext-tasks' peer: ^2.0.0
SDK1 = "@modelcontextprotocol/sdk@1.32.2"
SCRIPTS = Path(__file__).resolve().parent.parent / "interop"


@dataclass
class Clients:
    node: str
    scripts: Path

    def run(self, script: str, url: str, scenario: str, timeout: float = 120) -> dict[str, Any]:
        """Run one client program and return its JSON line (it must report `ok`)."""
        done = subprocess.run(
            [self.node, str(self.scripts / script), url, scenario],
            check=False,
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=self.scripts,
            env={**os.environ, "NODE_NO_WARNINGS": "1"},
        )
        lines = done.stdout.strip().splitlines()
        try:
            report: dict[str, Any] = json.loads(lines[-1])
        except (ValueError, IndexError):
            raise AssertionError(
                f"no JSON from {script} {scenario} (exit {done.returncode}):\n{done.stdout}\n{done.stderr}"
            ) from None
        assert done.returncode == 0 and report.get("ok"), f"{script} {scenario}: {report}\n{done.stderr}"
        return report


@pytest.fixture(scope="session")
def clients(tmp_path_factory: pytest.TempPathFactory) -> Clients:
    packages = npm_packages([EXT_TASKS, CLIENT, SDK1], what="the TypeScript MCP clients", min_node=(22, 0))
    # ESM resolves bare imports from the script's own directory: run copies beside the install's node_modules.
    scripts = tmp_path_factory.mktemp("ts-clients")
    (scripts / "node_modules").symlink_to(packages.root / "node_modules", target_is_directory=True)
    for script in SCRIPTS.glob("*.mjs"):
        shutil.copy(script, scripts / script.name)
    return Clients(packages.node, scripts)


@pytest.fixture(scope="module")
def interop(backend: Backend, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    """tests.apps.interop_app as `celery-mcp-tasks serve` plus a worker (a 200 ms poll hint: polling sees progress)."""
    logs = tmp_path_factory.mktemp(f"ts-clients-{backend.name}")
    with Deployment("tests.apps.interop_app", backend, logs) as deployment:
        deployment.web(MCP_TASKS_POLL_INTERVAL_MS="200")
        deployment.worker()
        yield deployment


def task_rows(deployment: Deployment, tool: str) -> list[dict[str, Any]]:
    engine = sa.create_engine(normalize_url(deployment.backend.store_url))
    try:
        with engine.connect() as conn:
            found = conn.execute(
                sa.text("SELECT status, status_message FROM mcp_tasks_task WHERE tool = :tool ORDER BY created_at"),
                {"tool": tool},
            )
            return [dict(row._mapping) for row in found]
    finally:
        engine.dispose()


def busy_runs_ended(deployment: Deployment) -> int:
    """How many `stay_busy` runs the worker finished: one that ends well before its 120 s saw the cancel."""
    return sum(
        1
        for line in deployment.first_worker().text().splitlines()
        if "Task stay_busy[" in line and "] succeeded in " in line
    )


# -- @modelcontextprotocol/client + @modelcontextprotocol/ext-tasks: 2026-07-28 with the extension -------------


def test_ext_tasks_follows_a_task_to_its_result(clients: Clients, interop: Deployment) -> None:
    report = clients.run("ext_tasks_client.mjs", interop.url, "follow")
    assert (report["era"], report["protocol"]) == ("modern", "2026-07-28")
    assert report["kind"] == "task"  # the call answered with a task, not a result
    assert report["outcome"] == {"status": "completed", "text": "counted to 3", "isError": False, "error": None}
    statuses = [seen["status"] for seen in report["seen"]]
    assert statuses[0] == "working" and statuses[-1] == "completed", report
    assert report["sent"].get("tasks/get", 0) >= 1, report  # followed by polling
    assert report["errors"] == []


def test_ext_tasks_follows_by_notifications_on_subscriptions_listen(clients: Clients, interop: Deployment) -> None:
    """The task's poll hint is ten minutes: the package saw every step because the server pushed it."""
    report = clients.run("ext_tasks_client.mjs", interop.url, "listen")
    assert report["kind"] == "task" and report["honored"] is True  # the ack named the task
    assert report["outcome"]["status"] == "completed" and report["outcome"]["text"] == "counted to 3"
    assert report["notified"][-1] == "completed", report
    assert "tasks/get" not in report["sent"], report  # nothing polled: the terminal state came as a notification
    messages = [seen["message"] for seen in report["seen"]]
    assert "step 3 of 3" in messages, report  # progress reached the package through notifications/tasks
    assert report["errors"] == []


def test_ext_tasks_answers_an_input_required_task_with_tasks_update(clients: Clients, interop: Deployment) -> None:
    report = clients.run("ext_tasks_client.mjs", interop.url, "input")
    assert report["asked"] == [{"message": "What is your name?", "scope": "task", "delivery": "task-update"}]
    assert "input_required" in [seen["status"] for seen in report["seen"]], report
    assert report["sent"].get("tasks/update") == 1, report
    assert report["outcome"] == {"status": "completed", "text": "Hello, Ada!", "isError": False, "error": None}
    assert report["errors"] == []


def test_ext_tasks_hears_a_question_asked_before_it_listened(clients: Clients, interop: Deployment) -> None:
    """The job asked before the listen, and the task's poll hint is ten minutes: without the stream's first
    notification (the task as it stands) the package would wait ten minutes for the question."""
    report = clients.run("ext_tasks_client.mjs", interop.url, "listenAfterAsked")
    assert report["asked"] == ["What is your name?"], report
    assert report["sent"].get("tasks/get") == report["reads"], report  # no poll of the package's own
    assert report["outcome"] == {"status": "completed", "text": "Hi, Lin!", "isError": False, "error": None}
    assert report["errors"] == []


def test_ext_tasks_cancels_a_running_task(clients: Clients, interop: Deployment) -> None:
    ended = busy_runs_ended(interop)
    report = clients.run("ext_tasks_client.mjs", interop.url, "cancel")
    assert report["kind"] == "task" and report["sent"].get("tasks/cancel") == 1, report
    assert report["seen"][-1] == "working", report  # cancelled while the job ran
    assert report["after"]["status"] == "cancelled", report  # read back through the package (tasks/get)
    assert task_rows(interop, "stay_busy")[-1]["status"] == "cancelled"
    wait_until(lambda: busy_runs_ended(interop) > ended, 30, "the cancelled job to stop")  # ctx.cancelled() saw it


# -- @modelcontextprotocol/sdk 1.x: the earlier era, synchronous calls ----------------------------------------


def test_sdk1_gets_progress_while_a_synchronous_call_waits(clients: Clients, interop: Deployment) -> None:
    report = clients.run("sdk1_client.mjs", interop.url, "progress")
    assert report["protocol"].startswith("2025-"), report  # the initialize handshake, an earlier-era session
    assert report.get("text") == "counted to 4", report  # the job's own result
    progress = report["progress"]  # onprogress runs only while the call still waits
    values = [p["progress"] for p in progress]
    assert values == sorted(set(values)), report  # strictly increasing
    steps = [p for p in progress if str(p.get("message")).startswith("step ")]  # the job's own reports
    assert len(steps) >= 2, report
    assert all(p.get("total") == 4 and p["message"] == f"step {p['progress']} of 4" for p in steps), report


def test_sdk1_answers_the_jobs_question_on_the_request_stream(clients: Clients, interop: Deployment) -> None:
    report = clients.run("sdk1_client.mjs", interop.url, "elicit")
    assert report["asked"] == [{"message": "What is your name?", "fields": ["name"]}], report
    assert report.get("text") == "Hi, Grace!", report


def test_sdk1_abort_cancels_the_hidden_task(clients: Clients, interop: Deployment) -> None:
    before, ended = len(task_rows(interop, "stay_busy")), busy_runs_ended(interop)
    report = clients.run("sdk1_client.mjs", interop.url, "abort")
    # Aborted mid-way: on the job's first progress notification, i.e. while it ran.
    assert report["aborted"] is True and report["progressed"] >= 1 and "text" not in report, report
    rows = wait_until(
        lambda: (rows := task_rows(interop, "stay_busy"))[before:] and rows[-1]["status"] == "cancelled" and rows,
        30,
        "the aborted call's task to end cancelled",
    )
    assert len(rows) == before + 1
    wait_until(lambda: busy_runs_ended(interop) > ended, 30, "the cancelled job to stop")
