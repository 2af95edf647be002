"""A Redis outage while a job runs: the worker survives, the job's task ends, consuming resumes.

The test owns its Redis (a `redis-server` of its own on a free port), so stopping
and restarting it disturbs nothing else. Before the transport fix
(`celery_mcp_tasks.worker.kombu_internals.redis_transport`), the worker died here every time with
"Unrecoverable error: AttributeError('NoneType' object has no attribute 'hostname')".
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import Deployment, McpHttp, OwnRedis, own_redis_deployment, wait_until

pytestmark = pytest.mark.integration


@pytest.fixture
def outage(tmp_path: Path) -> Iterator[tuple[Deployment, OwnRedis]]:
    with own_redis_deployment("tests.apps.runtime_app", tmp_path) as (deployment, broker):
        yield deployment, broker


def test_a_worker_survives_redis_going_away_mid_job_and_resumes_consuming(outage: tuple[Deployment, OwnRedis]) -> None:
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
                and "consumer: Cannot connect to " in worker.text()  # kombu names the transport as the scheme
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
