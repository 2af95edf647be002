"""A deployment that forgot `celery beat` (web + worker, no `-B`): what the user sees.

Nothing crashes and new work runs, but lost work is never reaped: a task whose whole
worker was killed stays `working`, with its last statusMessage, past its stale timeout,
for as long as no janitor runs. Sending the janitor once (what beat does every interval)
settles it. Embedded backend only: the schedule, not the broker, is under test here.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import pytest
from celery import Celery

from celery_mcp_tasks.app import configure_celery
from celery_mcp_tasks.config import Settings
from celery_mcp_tasks.model import now_ms, task_key
from celery_mcp_tasks.store.sql import SqlStore
from tests.support import Deployment, McpHttp, wait_until
from tests.worker.conftest import FAST, RUNTIME_APP, STALE_TIMEOUT_S, job_pid, text_of

pytestmark = [pytest.mark.integration, pytest.mark.parametrize("backend", ["embedded"], indirect=True)]

JANITOR_TASK = "celery_mcp_tasks.janitor"


@pytest.fixture
def no_beat(backend, tmp_path) -> Iterator[Deployment]:  # type: ignore[no-untyped-def]
    with Deployment(RUNTIME_APP, backend, tmp_path) as deployment:
        deployment.web(**FAST)
        yield deployment


def test_without_beat_lost_work_stays_working_and_everything_else_keeps_going(no_beat: Deployment) -> None:
    client = McpHttp(no_beat.url)
    store = SqlStore.from_url(no_beat.backend.store_url)
    try:
        doomed = no_beat.worker("worker-doomed", env=FAST)  # no beat, here or anywhere
        task_id = client.create("fragile", {"seconds": 60})  # max_sends=1: a janitor would fail it at once
        job_pid(client, task_id)
        lost = client.get(task_id)
        version = store.get(task_key(task_id)).version  # type: ignore[union-attr]
        os.killpg(doomed.popen.pid, signal.SIGKILL)  # the whole worker: main process and pool alike
        doomed.popen.wait(timeout=10)

        survivor = no_beat.worker("worker-survivor", env=FAST)
        key = task_key(task_id)
        # The task is stale by the reaper's own measure: a janitor run now would settle it.
        wait_until(
            lambda: (
                key
                in {r.key for r in store.stale(heartbeat_before_ms=now_ms() - int(STALE_TIMEOUT_S * 1000), limit=1000)}
            ),
            30,
            "the lost task to be stale",
        )
        probe = client.create("work", {"seconds": 0})  # the surviving worker consumes and completes new work
        assert text_of(client.wait_for(probe)) == "worked 0s on attempt 1"

        record = store.get(key)
        assert record is not None and record.version == version  # not one write since the worker died
        still = client.get(task_id)
        assert {k: v for k, v in still.items() if k != "_meta"} == {k: v for k, v in lost.items() if k != "_meta"}
        assert still["status"] == "working" and still["statusMessage"].endswith(": working")
        assert f"Task {JANITOR_TASK}[" not in survivor.text()  # nobody sends it
        assert survivor.popen.poll() is None
        assert "Traceback" not in no_beat.logs()

        # What beat would have done: send the janitor once.
        sender = Celery("by-hand")
        configure_celery(sender, Settings.from_env({**no_beat.backend.env, "MCP_TASKS_QUEUE": no_beat.queue}))
        sender.send_task(JANITOR_TASK)
        sender.close()
        failed = client.wait_for(task_id, timeout=30)
        assert failed["status"] == "failed"
        assert failed["error"]["message"] == "The job was lost: no worker reported for 3s (sent 1 time)"
    finally:
        store.dispose()
        client.close()
