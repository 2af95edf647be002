"""What Celery carries and shows: the tool's name, never the MCP task id.

The raw message is read off the broker before any worker takes it; Celery
events (what Flower shows) are captured from a worker started with `-E`.
"""

from __future__ import annotations

import json
import re
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from celery import Celery

from celery_mcp_tasks.app import configure_celery
from celery_mcp_tasks.config import Settings
from celery_mcp_tasks.model import task_key
from celery_mcp_tasks.worker.job import HIDDEN_ARGS
from tests.support import Backend, Deployment, McpHttp, process_env, spawn, wait_until
from tests.worker.conftest import FAST

pytestmark = pytest.mark.integration


def raw_messages(backend: Backend, queue: str) -> list[bytes]:
    """The queue's messages exactly as the broker holds them."""
    settings = Settings.from_env(backend.env)
    if settings.embedded_broker:
        return [path.read_bytes() for path in sorted((settings.broker_folder / "queue").glob(f"*.{queue}.msg"))]
    import redis

    client = redis.Redis.from_url(backend.env["CELERY_BROKER_URL"])
    try:
        return list(client.lrange(queue, 0, -1))
    finally:
        client.close()


def celery_app(backend: Backend) -> Celery:
    app = Celery("observer")
    configure_celery(app, Settings.from_env(backend.env))
    return app


@pytest.fixture
def web_only(deployment: Deployment) -> Iterator[McpHttp]:
    client = McpHttp(deployment.web("web-privacy", **FAST))
    yield client
    client.close()


def test_the_message_names_the_tool_and_carries_only_the_row_key(
    deployment: Deployment, backend: Backend, web_only: McpHttp
) -> None:
    task_id = web_only.create("work", {"seconds": 0.1})
    raw = wait_until(lambda: raw_messages(backend, deployment.queue), 10, "the message on the broker")
    assert len(raw) == 1 and task_id.encode() not in raw[0]
    message = json.loads(raw[0])
    headers = message["headers"]
    assert headers["task"] == "tests.apps.runtime_app.work" and headers["shadow"] == "work"
    assert headers["mcp_task_key"] == task_key(task_id) and headers["mcp_task_dispatch"] == 1
    assert headers["id"] != task_id
    assert task_id not in json.dumps(message)


def test_celery_events_show_the_tool_name_and_never_the_task_id(
    deployment: Deployment, backend: Backend, web_only: McpHttp
) -> None:
    events: list[dict[str, Any]] = []
    connected = threading.Event()
    app = celery_app(backend)

    def capture() -> None:
        with app.connection_for_read() as connection:
            receiver = app.events.Receiver(connection, handlers={"*": events.append})
            connected.set()
            try:
                receiver.capture(limit=None, timeout=30, wakeup=False)
            except Exception:  # noqa: BLE001 - the timeout ends the capture
                pass

    watcher = threading.Thread(target=capture, daemon=True)
    watcher.start()
    assert connected.wait(10)
    worker = spawn(
        "worker-events",
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            deployment.app,
            "worker",
            "-E",
            "-P",
            "prefork",
            "-c",
            "1",
            "--loglevel",
            "INFO",
            "--without-mingle",
            "--without-gossip",
            "-n",
            f"events-{uuid.uuid4().hex[:6]}@%h",
        ],
        process_env(backend, **deployment.env(**FAST)),
        deployment.log_dir,
    )
    deployment.procs.append(worker)
    wait_until(lambda: " ready." in worker.text(), 60, "the worker")

    task_id = web_only.create("work", {"seconds": 0.1})
    assert web_only.wait_for(task_id)["status"] == "completed"
    mine = wait_until(
        lambda: [
            e
            for e in events
            if e.get("type", "").startswith("task-")
            and any(x["type"] == "task-succeeded" for x in events if x.get("uuid") == e.get("uuid"))
        ],
        20,
        "the task events",
    )
    received = [e for e in mine if e["type"] == "task-received"]
    assert received and all(e["name"] == "work" for e in received)
    assert all((e["args"], e["kwargs"]) == ("()", HIDDEN_ARGS["kwargsrepr"]) for e in received)  # not {'seconds': ...}
    assert {"task-received", "task-started", "task-succeeded"} <= {e["type"] for e in mine}
    assert task_id not in repr(events)

    # Nor in any log line, whatever the job does: ask for input, fail with a traceback, get cancelled.
    ids = [
        task_id,
        web_only.create("two_rounds"),
        web_only.create("hopeless"),
        web_only.create("work", {"seconds": 30}),
    ]
    web_only.wait_for(ids[1], "input_required")
    web_only.task("tasks/update", ids[1], inputResponses={"name": {"action": "accept", "content": {"name": "x"}}})
    web_only.task("tasks/cancel", ids[3])
    for other in ids[1:3]:
        web_only.wait_for(other, "input_required", "completed", "failed", timeout=20)
    worker.stop()
    logs = deployment.logs()
    assert "Task hopeless[" in logs and not [i for i in ids if i in logs]
    # Retries are new messages (autoretry_for): they hide the arguments too.
    retried = [e for e in events if e.get("type") == "task-received" and e.get("name") == "hopeless"]
    assert len(retried) >= 2 and all(e["kwargs"] == HIDDEN_ARGS["kwargsrepr"] for e in retried)


def test_the_worker_log_at_info_holds_no_result_and_no_argument_and_no_succeeded_none(
    deployment: Deployment, web_only: McpHttp, tmp_path: Path
) -> None:
    worker = deployment.worker("worker-logs", beat=True, env=FAST)  # --loglevel INFO, prefork, janitor every 1 s
    secret = f"secret-{uuid.uuid4().hex[:8]}"
    worked = web_only.create("work", {"seconds": 0.05, "marker": str(tmp_path / secret)})
    asks = web_only.create("two_rounds")
    web_only.create("elsewhere")
    failing = web_only.create("hopeless")
    assert web_only.wait_for(worked)["status"] == "completed"
    web_only.wait_for(asks, "input_required")
    web_only.task("tasks/update", asks, inputResponses={"name": {"action": "accept", "content": {"name": secret}}})
    web_only.wait_for(asks, "input_required", "completed", timeout=20)
    web_only.task("tasks/update", asks, inputResponses={"colour": {"action": "accept", "content": {"colour": secret}}})
    answered = web_only.wait_for(asks, timeout=20)
    assert answered["status"] == "completed" and secret in answered["result"]["content"][0]["text"]
    assert web_only.wait_for(failing, timeout=20)["status"] == "failed"
    wait_until(lambda: "ended its run" in worker.text() and "handed off" in worker.text(), 20, "the hand-off line")
    wait_until(
        lambda: re.search(r"Task celery_mcp_tasks\.janitor\[\S+\] succeeded in \S+s: None", worker.text()),
        20,
        "a plain task's own success line (the janitor keeps Celery's logging)",
    )
    worker.stop()

    log = worker.text()
    assert secret not in log and "worked 0.05s" not in log and " likes " not in log
    assert re.search(r"^.*Task work\[\S+\] succeeded in [\d.]+s$", log, re.M)
    # Both rounds that asked (an earlier test's leftover message may add one more).
    assert len(re.findall(r"Task two_rounds\[\S+\] ended its run in [\d.]+s: waiting for input$", log, re.M)) >= 2
    assert re.search(r"Task elsewhere\[\S+\] ended its run in [\d.]+s: handed off$", log, re.M)
    assert re.search(r"Task hopeless\[\S+\] retry: ", log) and re.search(r"Task hopeless\[\S+\] raised unexpected", log)
    tools = "|".join(("work", "two_rounds", "elsewhere", "hopeless"))
    assert not re.search(rf"Task ({tools})\[\S+\] succeeded in \S+: ", log)  # no value, not even None
    assert log.count("celery-mcp-tasks: task tools ") == 1
