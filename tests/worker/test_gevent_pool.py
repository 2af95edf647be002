"""A job on Celery's gevent pool: its hard time limit fails the task at once, as on prefork."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import Backend, Deployment, McpHttp

pytestmark = pytest.mark.integration


def test_a_gevent_worker_fails_a_task_past_its_hard_time_limit_naming_the_limit(tmp_path: Path) -> None:
    """gevent raises its Timeout in the job's greenlet and Celery reports it once the run's request is gone:
    without the job turning it into the run's own failure, the task stayed `working` for the janitor to send
    again, each copy cut short at the limit."""
    backend = Backend("embedded", {"MCP_TASKS_DATA_DIR": str(tmp_path / "data")})
    with Deployment("tests.apps.runtime_app", backend, tmp_path) as deployment:
        client = McpHttp(deployment.web())
        worker = deployment.worker(pool="gevent")
        try:
            failed = client.wait_for(client.create("stuck", {"seconds": 30}), timeout=20)
            assert failed["status"] == "failed", worker.text()
            assert failed["error"]["message"] == (
                "Job failed: TimeLimitExceeded: the job ran longer than its time limit (1 s, time_limit, "
                "task_time_limit or the worker's --time-limit) and was stopped"
            )
        finally:
            client.close()
