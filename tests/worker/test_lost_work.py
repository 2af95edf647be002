"""Nothing is lost: revokes without a worker, whole workers killed mid-job, a broker down at tools/call.

Each test drives its own worker processes on the module's queue; the janitor
runs on the worker's embedded beat every second with a 3 s stale timeout.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from celery_mcp_tasks.model import task_key
from celery_mcp_tasks.store.sql import SqlStore
from tests.support import Backend, Deployment, McpHttp, free_port, wait_until
from tests.worker.conftest import FAST, follow, job_pid, text_of

pytestmark = pytest.mark.integration


def kill_whole_worker(deployment: Deployment) -> None:
    """SIGKILL every worker process at once (main, pool children, beat): no clean-up of any kind."""
    for proc in deployment.procs:
        if proc.name.startswith("worker") and proc.popen.poll() is None:
            os.killpg(proc.popen.pid, signal.SIGKILL)
            proc.popen.wait(timeout=10)


@pytest.fixture(autouse=True)
def no_worker_left(deployment: Deployment) -> Iterator[None]:
    """Each test starts from no worker on the queue and leaves none behind."""
    yield
    for proc in deployment.procs:
        if proc.name.startswith("worker"):
            proc.stop()


def test_a_task_cancelled_before_any_worker_ran_it_never_starts_its_body(
    deployment: Deployment, client: McpHttp, tmp_path: Path
) -> None:
    marker = tmp_path / "started"
    task_id = client.create("work", {"seconds": 1, "marker": str(marker)})
    client.task("tasks/cancel", task_id)  # the revoke is lost: no worker is up
    worker = deployment.worker("worker-late", env=FAST)
    wait_until(
        lambda: (
            "job for tool 'work' skipped: its task is already final, or cannot be read in this process" in worker.text()
        ),
        20,
        "the worker to reach the message",
    )
    assert not marker.exists()
    assert client.get(task_id)["status"] == "cancelled"


def test_a_whole_worker_killed_mid_job_is_sent_again_and_completes(
    deployment: Deployment, client: McpHttp, backend: Backend
) -> None:
    deployment.worker("worker-doomed", env=FAST)
    task_id = client.create("work", {"seconds": 2})
    job_pid(client, task_id)
    kill_whole_worker(deployment)

    deployment.worker("worker-rescue", beat=True, env=FAST)
    done, seen = follow(client, task_id, timeout=40)  # bounds a hang; when the reaper acts: tests/test_janitor.py
    assert done["status"] == "completed" and text_of(done) == "worked 2s on attempt 1", seen
    store = SqlStore.from_url(backend.store_url)
    try:  # the janitor sent it again (the statusMessage saying so may be overwritten before a poll sees it)
        record = store.get(task_key(task_id))
        assert record is not None and (record.dispatches, record.resends) == (2, 1)
    finally:
        store.dispose()


def test_a_job_out_of_sends_fails_with_a_clear_message(deployment: Deployment, client: McpHttp) -> None:
    deployment.worker("worker-doomed", env=FAST)
    task_id = client.create("fragile", {"seconds": 30})  # max_sends=1: never sent again
    job_pid(client, task_id)
    kill_whole_worker(deployment)

    deployment.worker("worker-rescue", beat=True, env=FAST)
    failed = client.wait_for(task_id, timeout=30)
    assert failed["status"] == "failed"
    assert failed["error"] == {"code": -32603, "message": "The job was lost: no worker reported for 3s (sent 1 time)"}


def test_a_broker_that_is_down_at_tools_call_leaves_a_failed_task(deployment: Deployment) -> None:
    closed = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    # Change hints by row polling: this test is about the job's message, not the broker notifier.
    # The store named explicitly: a remote broker with the embedded default store is refused at start.
    url = deployment.web(
        "web-no-broker",
        CELERY_BROKER_URL=closed,
        MCP_TASKS_NOTIFY="poll",
        MCP_TASKS_DATABASE_URL=deployment.backend.store_url,
        **FAST,
    )
    client = McpHttp(url)
    try:
        started = time.monotonic()
        reply = client.call_tool("work", {"seconds": 1})["result"]
        assert time.monotonic() - started < 15  # a hang bound: the send gives up, it does not retry forever
        assert reply["resultType"] == "task" and reply["status"] == "failed"
        task = client.get(reply["taskId"])
        assert task["status"] == "failed"
        assert task["error"] == {"code": -32603, "message": "Could not enqueue the job", "data": "OperationalError"}
    finally:
        client.close()
