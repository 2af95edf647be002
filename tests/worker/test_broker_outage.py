"""A Redis outage while a job runs: the worker survives, the job's task ends, consuming resumes.

The test owns its Redis (a `redis-server` of its own on a free port), so stopping
and restarting it disturbs nothing else. Before the transport fix
(`celery_mcp_tasks.worker.redis_transport`), the worker died here every time with
"Unrecoverable error: AttributeError('NoneType' object has no attribute 'hostname')".
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from tests.support import POSTGRES_URL, Backend, Deployment, McpHttp, free_port, fresh_postgres_database, wait_until

pytestmark = pytest.mark.integration


class OwnRedis:
    def __init__(self, log_dir: Path) -> None:
        self.port = free_port()
        self.log_dir = log_dir
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            if os.environ.get("CI"):
                pytest.fail("redis-server is not installed: the broker outage test must run in CI")
            pytest.skip("redis-server is not installed")
        log = (self.log_dir / "redis.log").open("ab")
        self.proc = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        wait_until(lambda: self._answers(), 10, "redis-server to answer")

    def _answers(self) -> bool:
        try:
            return bool(redis.Redis.from_url(self.url, socket_connect_timeout=0.2).ping())
        except redis.RedisError:
            return False

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()  # the broker goes away at once, as a crashed or restarted server does
            self.proc.wait(timeout=10)


@pytest.fixture
def outage(tmp_path: Path) -> Iterator[tuple[Deployment, OwnRedis]]:
    if not POSTGRES_URL:
        pytest.skip("set MCP_TASKS_TEST_POSTGRES_URL to run")
    broker = OwnRedis(tmp_path)
    broker.start()
    try:
        with fresh_postgres_database(POSTGRES_URL) as url:
            backend = Backend("pg_own_redis", {"MCP_TASKS_DATABASE_URL": url, "CELERY_BROKER_URL": broker.url})
            with Deployment("tests.apps.runtime_app", backend, tmp_path) as deployment:
                deployment.web()
                yield deployment, broker
    finally:
        broker.stop()


def test_a_worker_survives_redis_going_away_mid_job_and_resumes_consuming(outage: tuple[Deployment, OwnRedis]):
    deployment, broker = outage
    worker = deployment.worker(concurrency=2)
    client = McpHttp(deployment.url)
    try:
        task_id = client.create("work", {"seconds": 6})
        wait_until(lambda: "working" in (client.get(task_id).get("statusMessage") or ""), 30, "the job to start")
        broker.stop()
        # The outage reached the worker, which is now failing to reconnect: only then does Redis come back.
        wait_until(
            lambda: (
                "consumer: Connection to broker lost" in worker.text()
                and "consumer: Cannot connect to redis://" in worker.text()
            ),
            30,
            "the worker to see the outage",
        )
        broker.start()
        done = client.wait_for(task_id, timeout=60)
        assert done["status"] == "completed", done
        assert worker.popen.poll() is None, worker.text()[-3000:]
        again = client.create("work", {"seconds": 0.2})  # the worker consumes again after the outage
        assert client.wait_for(again, timeout=60)["status"] == "completed"
        assert "Unrecoverable error" not in worker.text()
    finally:
        client.close()
