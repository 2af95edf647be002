"""A tool added to the web processes before the workers know it: Celery drops its job's message at a worker of
the older release, and the task fails at once saying what to do, rather than at the stale timeout."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import Backend, Deployment, McpHttp

pytestmark = pytest.mark.integration

NOTE = "the-launch-codes"


def test_a_tool_no_worker_knows_fails_its_task_at_once_saying_to_restart_the_workers(
    backend: Backend, tmp_path: Path
) -> None:
    with Deployment("tests.apps.upgrade_app", backend, tmp_path) as deployment:
        client = McpHttp(deployment.web(UPGRADE_APP_ADDED="1"))
        worker = deployment.worker()  # the older release: it has no `added`
        try:
            task_id = client.create("added", {"note": NOTE})
            ended = client.wait_for(task_id, timeout=20)  # the stale timeout is minutes away
            assert ended["status"] == "failed"
            assert ended["statusMessage"] == (
                "The worker that got the job does not know tool 'added': restart the workers with the code that defines it"
            )
            assert client.wait_for(client.create("kept"))["status"] == "completed"  # the worker itself is fine
        finally:
            client.close()
        log = worker.text()
        assert "tool 'added': this worker does not know it; its task failed (restart the workers)" in log
        assert task_id not in log
        assert NOTE not in log and "<an MCP task's arguments are not logged>" in log  # Celery's line, trimmed
