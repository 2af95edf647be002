"""Mounted inside a FastAPI app (its lifespan composed with ours), push still reaches listen streams."""

from __future__ import annotations

import sys
from pathlib import Path

import httpx
import pytest

from celery_mcp_tasks.migrate import upgrade
from tests.mcp.listen_client import ListenStream
from tests.support import Backend, McpHttp, free_port, process_env, spawn, start_worker, wait_until

pytestmark = pytest.mark.integration


def test_the_app_mounted_under_fastapi_pushes_task_changes(tmp_path: Path) -> None:
    backend = Backend("embedded", {"MCP_TASKS_DATA_DIR": str(tmp_path / "data")})
    upgrade(backend.store_url)
    port = free_port()
    web = spawn(
        "web",
        [sys.executable, "-m", "uvicorn", "tests.apps.mounted_app:app", "--port", str(port), "--log-level", "warning"],
        process_env(backend),
        tmp_path,
    )
    worker = None
    try:
        base = f"http://127.0.0.1:{port}"
        wait_until(lambda: _answers(f"{base}/hello") or web.popen.poll() is not None, 60, "the FastAPI app")
        assert web.popen.poll() is None, web.text()
        # Health is an opt-in plugin on an operations port of its own: the mounted MCP app adds no route for it.
        assert httpx.get(f"{base}/healthz").status_code == 404
        worker = start_worker("examples.quickstart.app", backend, tmp_path)
        client = McpHttp(f"{base}/mcp")
        task_id = client.create("write_report", {"topic": "mounts", "sections": 1})
        stream = ListenStream(f"{base}/mcp", {"taskIds": [task_id]})
        try:
            assert stream.ack()["notifications"]["taskIds"] == [task_id]
            statuses = []
            while not statuses or statuses[-1] != "completed":
                statuses.append(stream.task(timeout=60)["status"])
            assert statuses[-1] == "completed"
        finally:
            stream.close()
            client.close()
    finally:
        if worker is not None:
            worker.stop()
        web.stop()


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1).status_code == 200
    except httpx.HTTPError:
        return False
