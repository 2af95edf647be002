"""A cancel that terminates a job never stalls the prefork pool (`celery_mcp_tasks.worker.termination`).

The pool process of a terminated job ends by writing a last message to the pool under a lock
its siblings share (on the embedded backend, whose pool is billiard's threaded one); the worker
answers that message with a SIGTERM. Taken by another thread of the ending process, that SIGTERM
used to end it with the lock held, and no job ran again on that worker. Here the jobs are
terminated at several moments after the worker received them, and after each one the worker
must still run a job. A module of its own: a stalled worker fails these tests, not the next ones.
"""

from __future__ import annotations

import time

import pytest

from tests.support import McpHttp, Proc, celery_id_of, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("worker")]

DELAYS_S = (0.0, 0.02, 0.05, 0.1, 0.2, 0.3)


def _received(client: McpHttp, worker: Proc, task_id: str) -> None:
    marker = f"[{celery_id_of(client, task_id)}] received"
    wait_until(lambda: marker in worker.text(), 30, "the worker to receive the job", interval=0.005)


def _still_runs_a_job(client: McpHttp, after: str) -> None:
    task_id = client.create("work", {"seconds": 0.01})
    try:
        done = client.wait_for(task_id, timeout=30)
    except TimeoutError:
        pytest.fail(f"the worker ran no job after it terminated one {after}: {client.get(task_id)['status']}")
    assert done["status"] == "completed", done


def _terminate(client: McpHttp, worker: Proc, tool: str, delay_s: float) -> None:
    task_id = client.create(tool, {"seconds": 60})
    _received(client, worker, task_id)
    time.sleep(delay_s)
    client.task("tasks/cancel", task_id)
    assert client.get(task_id)["status"] == "cancelled"


def test_terminating_a_job_at_any_moment_after_receipt_leaves_the_pool_running(client: McpHttp, worker: Proc) -> None:
    for delay_s in DELAYS_S:
        _terminate(client, worker, "stubborn", delay_s)
        _still_runs_a_job(client, f"{delay_s:g}s after receipt")


def test_a_thread_of_the_job_that_takes_sigterm_does_not_stall_the_pool(client: McpHttp, worker: Proc) -> None:
    """The job's own thread leaves SIGTERM unblocked and keeps the GIL busy, which holds the ending process
    between its last write and its release of the lock: without the guard, the worker's SIGTERM lands there."""
    for delay_s in (0.0, 0.1, 0.3):
        _terminate(client, worker, "stubborn_and_busy", delay_s)
        _still_runs_a_job(client, f"with a busy thread, {delay_s:g}s after receipt")
