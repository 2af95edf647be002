"""`terminate=True` on a worker whose pool cannot kill a job: said once at start, never a traceback per cancel.

(`dev` and `stdio` run prefork, which terminates: tests/integration/test_dev_command.py.)
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.support import Backend, Deployment, McpHttp, wait_until

pytestmark = pytest.mark.integration

WARNING = "pool cannot terminate a running job"


def test_a_threads_worker_says_once_that_it_cannot_terminate_and_logs_no_traceback_per_cancel(
    tmp_path: Path,
) -> None:
    backend = Backend("embedded", {"MCP_TASKS_DATA_DIR": str(tmp_path / "data")})
    with Deployment("tests.apps.runtime_app", backend, tmp_path) as deployment:
        client = McpHttp(deployment.web())
        worker = deployment.worker(pool="threads")
        try:
            assert worker.text().count(WARNING) == 1
            assert "'scribble'" in worker.text() and "'stubborn'" in worker.text()
            for n in range(2):
                scribbles = tmp_path / f"scribbles-{n}"
                task_id = client.create("scribble", {"path": str(scribbles), "seconds": 1.5})
                wait_until(scribbles.exists, 30, "the job to write")
                client.task("tasks/cancel", task_id)
                assert client.get(task_id)["status"] == "cancelled"
            time.sleep(2.5)  # the revokes reached the worker, and the jobs ran to their end
            log = worker.text()
            assert "kill_job" not in log and "Traceback" not in log, log
            assert log.count(WARNING) == 1
        finally:
            client.close()
