"""A Redis Sentinel broker whose primary goes away while a job runs: the worker survives, the job's task ends.

kombu's Sentinel transport builds its connections as the Redis one does, so it had the same fault: before the
fix (`redis_transport.SentinelTransport`), the worker ended with "Unrecoverable error: AttributeError('NoneType'
object has no attribute 'hostname')". The test owns its Redis and its sentinel, on free ports.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from tests.support import (
    POSTGRES_URL,
    Backend,
    Deployment,
    McpHttp,
    OwnRedis,
    free_port,
    fresh_postgres_database,
    tool,
    wait_until,
)

pytestmark = pytest.mark.integration

MASTER = "mcp-tasks-test"


class OwnSentinel:
    """One sentinel watching `primary` (quorum 1, down after 1 s): alone it never fails over, it only says where
    the primary is, and that it is down while it is."""

    def __init__(self, primary: OwnRedis, log_dir: Path) -> None:
        self.port = free_port()
        self.config = log_dir / "sentinel.conf"
        self.config.write_text(
            f"port {self.port}\nbind 127.0.0.1\ndir {log_dir}\n"
            f"sentinel monitor {MASTER} 127.0.0.1 {primary.port} 1\n"
            f"sentinel down-after-milliseconds {MASTER} 1000\n"
        )
        binary = tool("redis-server", "Debian: apt-get install redis-server")
        with (log_dir / "sentinel.log").open("ab") as log:
            self.proc = subprocess.Popen([binary, str(self.config), "--sentinel"], stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_until(self._knows_the_primary, 10, "the sentinel to know the primary")
        except BaseException:
            self.stop()
            raise

    def _knows_the_primary(self) -> bool:
        try:
            client = redis.Redis(port=self.port, socket_connect_timeout=0.2)
            return client.sentinel_get_master_addr_by_name(MASTER) is not None
        except redis.RedisError:
            return False

    @property
    def url(self) -> str:
        return f"sentinel://127.0.0.1:{self.port}/0"

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=10)


@pytest.fixture
def sentinel_deployment(tmp_path: Path) -> Iterator[tuple[Deployment, OwnRedis]]:
    if not POSTGRES_URL:
        pytest.skip("set MCP_TASKS_TEST_POSTGRES_URL to run")
    primary = OwnRedis(tmp_path)
    primary.start()
    try:
        sentinel = OwnSentinel(primary, tmp_path)
    except BaseException:
        primary.stop()
        raise
    try:
        with fresh_postgres_database(POSTGRES_URL) as url:
            env = {"MCP_TASKS_DATABASE_URL": url, "CELERY_BROKER_URL": sentinel.url, "TEST_SENTINEL_MASTER": MASTER}
            with Deployment("tests.apps.sentinel_app", Backend("pg_sentinel", env), tmp_path) as deployment:
                deployment.web()
                yield deployment, primary
    finally:
        sentinel.stop()
        primary.stop()


def test_a_worker_survives_the_sentinels_primary_going_away_mid_job(
    sentinel_deployment: tuple[Deployment, OwnRedis],
) -> None:
    deployment, primary = sentinel_deployment
    worker = deployment.worker(concurrency=2)
    client = McpHttp(deployment.url)
    try:
        task_id = client.create("work", {"seconds": 10})
        wait_until(lambda: "working" in (client.get(task_id).get("statusMessage") or ""), 30, "the job to start")
        primary.stop()
        wait_until(lambda: "consumer: Connection to broker lost" in worker.text(), 30, "the worker to see the outage")
        primary.start()
        done = client.wait_for(task_id, timeout=90)
        assert done["status"] == "completed", done
        assert worker.popen.poll() is None, worker.text()[-3000:]
        again = client.create("work", {"seconds": 0.2})  # the worker consumes again after the outage
        assert client.wait_for(again, timeout=60)["status"] == "completed"
        assert "Unrecoverable error" not in worker.text()
        # The job's message, unacknowledged when the primary went: the fixed channel's error, not kombu's crash.
        assert "the broker connection is already closed" in worker.text()
    finally:
        client.close()
