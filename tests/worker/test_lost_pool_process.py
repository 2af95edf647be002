"""A job whose pool process dies: Celery's own lost-worker path, with the janitor's reaper out of its way.

The worker reports a killed pool process as a `WorkerLostError` (after `worker_lost_wait`, 1 s in
tests.apps.runtime_app), the signal bridge maps it to the job's retry, and the next attempt runs.
The other modules' deployment reaps a job silent for 3 s; on a loaded machine that reaper can
re-send a run before Celery's retry of it is even scheduled, and then the retry these tests follow
never happens (a re-send is a new dispatch: test_lost_work.py covers it). So this module's
deployment reaps only after two minutes.
"""

from __future__ import annotations

import os
import signal

import pytest

from celery_mcp_tasks.model import task_key
from celery_mcp_tasks.store.sql import SqlStore
from tests.support import Backend, McpHttp, Proc
from tests.worker.conftest import JANITOR_INTERVAL_S, follow, job_pid, text_of

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("worker")]


@pytest.fixture(scope="module")
def runtime_env() -> dict[str, str]:
    """The reaper out of the way: Celery's own retry must settle the lost job, not the janitor."""
    return {"MCP_TASKS_STALE_TIMEOUT_S": "120", "MCP_TASKS_JANITOR_INTERVAL_S": f"{JANITOR_INTERVAL_S:g}"}


def test_killing_the_pool_process_retries_the_job_once_and_it_completes(client: McpHttp, worker: Proc) -> None:
    task_id = client.create("survivor", {"seconds": 2})
    pid = job_pid(client, task_id)
    os.kill(pid, signal.SIGKILL)
    done, seen = follow(client, task_id, worker=worker)
    assert done["status"] == "completed" and text_of(done) == "survived on attempt 2", seen
    assert any(message and "attempt 2" in message for _, message in seen), seen


def test_a_job_that_always_kills_its_process_fails_after_its_retries(client: McpHttp, backend: Backend) -> None:
    task_id = client.create("poison")  # max_retries=1
    failed = client.wait_for(task_id, timeout=30)
    assert failed["status"] == "failed"
    assert failed["error"]["message"].startswith("Job failed: WorkerLostError"), failed
    store = SqlStore.from_url(backend.store_url)
    try:  # its one send ran twice (the first attempt and its one retry): bounded, never a loop
        record = store.get(task_key(task_id))
        assert record is not None and record.attempt == 1 and record.dispatches == 1, record
    finally:
        store.dispose()
