"""Redis redelivers a message whose job still runs: the body runs once.

The broker is a `redis-server` of this test's own with a one-second visibility
timeout (`tests.apps.redelivery_app`), so the running job's message is handed
out again within seconds, to the same worker's other pool process. That copy
belongs to the same run (same dispatch, same attempt); it must see that the
first copy claimed the run and still heartbeats, and skip, saying why.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import Deployment, McpHttp, own_redis_deployment
from tests.worker.conftest import FAST

pytestmark = pytest.mark.integration

SKIPPED = "job for tool 'counted' skipped: another copy of this run is already running"


@pytest.fixture
def redelivering(tmp_path: Path) -> Iterator[Deployment]:
    with own_redis_deployment("tests.apps.redelivery_app", tmp_path, **FAST) as (deployment, _):
        yield deployment


def test_a_redelivered_copy_of_a_running_job_skips_its_body(redelivering: Deployment, tmp_path: Path) -> None:
    # Stale timeout 3 s, heartbeat every 0.75 s: the job outlives the stale timeout, its beats keep it fresh.
    worker = redelivering.worker(concurrency=2, env=FAST)
    marker = tmp_path / "runs"
    client = McpHttp(redelivering.url)
    try:
        task_id = client.create("counted", {"seconds": 8, "marker": str(marker)})
        done = client.wait_for(task_id, timeout=30)
        assert done["status"] == "completed", done
        runs = marker.read_text().splitlines()
        assert len(runs) == 1, f"the body ran {len(runs)} times, in pool processes {runs}"
        assert SKIPPED in worker.text()  # the broker did deliver it twice, and the copy said why it stood aside
        assert task_id not in worker.text()
    finally:
        client.close()
