"""`tasks/cancel` with the broker down: the cancel answers at once, other requests keep flowing,
and the revoke gives up after its bound with one log line.

The broker is a `redis-server` of this test's own, stopped once the tasks exist.
The tool is `stubborn` (`terminate=True`): the one kind of tool whose cancel
publishes a revoke. Before the revoke went to a background thread with a bounded
publish, each cancel held one of the web process's 32 store threads in kombu's
endless reconnect loop; 40 of them stalled every request.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support import Deployment, McpHttp, OwnRedis, own_redis_deployment, wait_until

pytestmark = pytest.mark.integration

CANCELS = 40
WARM = 5
GAVE_UP = "given up after"


@pytest.fixture
def broker_down_later(tmp_path: Path) -> Iterator[tuple[Deployment, OwnRedis]]:
    with own_redis_deployment("tests.apps.runtime_app", tmp_path) as (deployment, broker):
        yield deployment, broker


def _timed(url: str, method: str, task_id: str) -> tuple[float, dict[str, Any]]:
    """(seconds, reply); a request still unanswered after 10 s reads as a 10 s error."""
    client = McpHttp(url)
    client.http.timeout = httpx.Timeout(10)
    started = time.monotonic()
    try:
        return time.monotonic() - started, client.task(method, task_id)
    except httpx.TimeoutException:
        return time.monotonic() - started, {"error": "no answer"}
    finally:
        client.close()


def test_cancel_with_the_broker_down_answers_at_once_and_the_revoke_gives_up(
    broker_down_later: tuple[Deployment, OwnRedis],
) -> None:
    deployment, broker = broker_down_later
    client = McpHttp(deployment.url)
    try:
        doomed = [client.create("stubborn", {"seconds": 60}) for _ in range(CANCELS)]
        other = client.create("work", {"seconds": 60})
        # Revokes delivered while the broker is up leave live broker connections behind (kombu's
        # pool keeps them); a publish on one of those, once the broker is gone, retries forever.
        warm = [client.create("stubborn", {"seconds": 60}) for _ in range(WARM)]
        with ThreadPoolExecutor(WARM) as pool:
            assert all(
                reply["result"]["resultType"] == "complete"
                for _, reply in pool.map(lambda task_id: _timed(deployment.url, "tasks/cancel", task_id), warm)
            )
        time.sleep(1)  # those revokes are published
        broker.stop()
        stopped = time.monotonic()
        with ThreadPoolExecutor(CANCELS + 4) as pool:
            cancels = [pool.submit(_timed, deployment.url, "tasks/cancel", task_id) for task_id in doomed]
            time.sleep(0.2)  # the cancels are in flight; the endpoint must still serve everyone else
            gets = [pool.submit(_timed, deployment.url, "tasks/get", other) for _ in range(4)]
            answered = [future.result() for future in cancels + gets]
        slow = [f"{elapsed:.1f}s: {reply.get('error') or 'answered'}" for elapsed, reply in answered if elapsed >= 3]
        assert slow == [], f"{len(slow)} of {len(answered)} requests were slow with the broker down: {slow[:3]}"
        assert all(reply.get("result", {}).get("resultType") == "complete" for _, reply in answered), answered
        assert all(client.get(task_id)["status"] == "cancelled" for task_id in doomed)
        assert client.get(other)["status"] == "working"
        web = deployment.procs[0]
        wait_until(lambda: GAVE_UP in web.text(), 15, "the revoke to give up")
        assert time.monotonic() - stopped < 15
        line = next(line for line in web.text().splitlines() if GAVE_UP in line)
        assert "'stubborn'" in line and "the tasks stay cancelled" in line, line
        assert not any(task_id in web.text() for task_id in doomed)
    finally:
        client.close()
