"""One principal floods, another keeps working: two replicas behind haproxy, on PostgreSQL and Redis.

`tests.apps.quota_app` served twice (replicas a and b, round-robin through haproxy) with a
worker, all with the same quotas (5 unfinished tasks, 20 creations per 10 minutes per caller)
and fair queues. The flooder sends far more calls than its rate from several threads at once;
meanwhile the steady caller creates tasks one after the other and follows each to its end. The
flooder gets exactly its rate's worth of tasks, across both replicas, and every other call of
its is a clean -32029; the steady caller is never refused, and each of its tasks is created and
completed within the stated bound.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import pytest

from celery_mcp_tasks.migrate import upgrade
from tests.integration.test_replicas import _haproxy
from tests.support import (
    POSTGRES_URL,
    REDIS_URL,
    Backend,
    Deployment,
    McpHttp,
    fresh_postgres_database,
    start_web,
    start_worker,
)

pytestmark = [pytest.mark.integration, pytest.mark.postgres, pytest.mark.redis]

APP = "tests.apps.quota_app"
RATE = 20
ACTIVE = 5
FLOOD_CALLS = 200  # per flooding thread, at most
STEADY_TASKS = 10
CREATE_BOUND_S = 2.0
"""The bound: each of the steady caller's creations is answered within this, and ..."""
COMPLETE_BOUND_S = 5.0
"""... each of its tasks completes within this of its creation, while the flood goes on."""


@dataclass
class Flooded:
    proxy: str
    deployment: Deployment


@pytest.fixture(scope="module")
def flooded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Flooded]:
    if not (POSTGRES_URL and REDIS_URL):
        pytest.skip("set MCP_TASKS_TEST_POSTGRES_URL and MCP_TASKS_TEST_REDIS_URL to run")
    log_dir = tmp_path_factory.mktemp("flood")
    with fresh_postgres_database(POSTGRES_URL) as url:
        upgrade(url)
        env = {
            "MCP_TASKS_DATABASE_URL": url,
            "CELERY_BROKER_URL": REDIS_URL,
            "MCP_TASKS_IDEMPOTENCY_SECRET": "flood-" + uuid.uuid4().hex,
            "MCP_TASKS_QUOTA_ACTIVE": str(ACTIVE),
            "MCP_TASKS_QUOTA_CREATIONS": str(RATE),
            "MCP_TASKS_QUOTA_WINDOW_S": "600",
            "MCP_TASKS_FAIR_QUEUES": "8",
            "MCP_TASKS_WORKER_METRICS_PORT": "off",
        }
        deployment = Deployment(APP, Backend("flood", env), log_dir)
        try:
            with ThreadPoolExecutor(3) as pool:
                webs = [
                    pool.submit(start_web, APP, deployment.backend, log_dir, name, **deployment.env()) for name in "ab"
                ]
                worker = pool.submit(start_worker, APP, deployment.backend, log_dir, "worker", **deployment.env())
                (web_a, a), (web_b, b) = (future.result() for future in webs)
                deployment.procs += [web_a, web_b, worker.result()]
            proxy, proxy_url, _ = _haproxy(log_dir, a, b)
            deployment.procs.append(proxy)
            yield Flooded(proxy_url, deployment)
        finally:
            deployment.stop()


def steady_work(url: str, token: str) -> list[tuple[float, float, dict[str, Any]]]:
    """Create a task, follow it to its end, again: (seconds to create, seconds to complete, final task) each."""
    client = McpHttp(url, headers={"Authorization": f"Bearer {token}"})
    runs = []
    for index in range(STEADY_TASKS):
        started = time.monotonic()
        reply = client.call_tool("echo", {"label": f"steady-{index}"})
        created = time.monotonic()
        assert "result" in reply, reply  # never refused
        done = client.wait_for(reply["result"]["taskId"], timeout=60)
        runs.append((created - started, time.monotonic() - started, done))
    client.close()
    return runs


def flood(url: str, token: str, began: threading.Event, done: threading.Event) -> list[dict[str, Any]]:
    """Call as fast as one client can until the steady caller is done (at most FLOOD_CALLS calls); every reply."""
    client = McpHttp(url, headers={"Authorization": f"Bearer {token}"})
    replies: list[dict[str, Any]] = []
    while len(replies) < FLOOD_CALLS and not done.is_set():
        replies.append(client.call_tool("echo", {"label": f"flood-{len(replies)}"}))
        began.set()
    client.close()
    return replies


def test_a_flooding_principal_is_refused_cleanly_and_the_other_keeps_its_latency(flooded: Flooded) -> None:
    flooder, steady = f"flood-{uuid.uuid4().hex[:8]}", f"steady-{uuid.uuid4().hex[:8]}"
    alone = steady_work(flooded.proxy, f"alone-{uuid.uuid4().hex[:8]}")  # the same work, before any flood
    began, done = threading.Event(), threading.Event()
    with ThreadPoolExecutor(4) as pool:
        floods = [pool.submit(flood, flooded.proxy, flooder, began, done) for _ in range(4)]
        assert began.wait(30)  # the flood is on before the steady caller starts
        try:
            runs = steady_work(flooded.proxy, steady)
        finally:
            still_flooding = not any(future.done() for future in floods)
            done.set()
        replies = [reply for future in floods for reply in future.result()]

    created = [reply for reply in replies if "result" in reply]
    refused = [reply["error"] for reply in replies if "error" in reply]
    assert len(created) == RATE and len(refused) == len(replies) - RATE  # exactly the rate, across both replicas
    assert len(replies) > 2 * RATE and still_flooding  # far over its rate, all along the steady caller's work
    assert {error["code"] for error in refused} == {-32029}
    assert {error["data"]["limit"] for error in refused} <= {"active", "creations"}
    assert all(flooder not in str(error) for error in refused)

    assert [done["status"] for _, _, done in runs] == ["completed"] * STEADY_TASKS
    slowest_create = max(create for create, _, _ in runs)
    slowest_complete = max(complete for _, complete, _ in runs)
    print(
        f"flood: {len(replies)} calls, {len(created)} created; steady caller, slowest creation / completion:"
        f" {max(r[0] for r in alone):.3f} / {max(r[1] for r in alone):.3f} s alone,"
        f" {slowest_create:.3f} / {slowest_complete:.3f} s during the flood"
    )
    assert slowest_create < CREATE_BOUND_S and slowest_complete < COMPLETE_BOUND_S
