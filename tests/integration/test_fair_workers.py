"""Fair workers (MCP_TASKS_FAIR_QUEUES): one principal's burst does not starve another's job.

Two web processes of `tests.apps.quota_app` on one broker: one routes jobs to the default queue's
shards by owner, the other (the control) to the default queue itself. With no worker running,
principal A queues a burst through each, then principal B one job through each; then one worker
(one process, prefetching one message) drains everything. B's job through the fair web starts
after a couple of A's jobs at most; through the control it waits for the whole burst.
"""

from __future__ import annotations

import sys
import uuid
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from celery_mcp_tasks.mcp.principal import anonymous_caller
from celery_mcp_tasks.model import task_key
from celery_mcp_tasks.store.engine import normalize_url
from celery_mcp_tasks.worker.fairness import shard_queue
from tests.support import Backend, Deployment, McpHttp, Proc, process_env, spawn, wait_until

pytestmark = pytest.mark.integration

APP = "tests.apps.quota_app"
SHARDS = "4"
BURST = 12
SECRET = {"MCP_TASKS_IDEMPOTENCY_SECRET": "fair-tests-" + uuid.uuid4().hex}


@pytest.fixture(scope="module")
def deployment(backend: Backend, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    with Deployment(APP, backend, tmp_path_factory.mktemp(f"fair-{backend.name}")) as deployment:
        deployment.web("web-fair", MCP_TASKS_FAIR_QUEUES=SHARDS, **SECRET)
        yield deployment


def rows(deployment: Deployment, label: str, tool: str = "echo") -> list[dict[str, Any]]:
    engine = sa.create_engine(normalize_url(deployment.backend.store_url))
    try:
        with engine.connect() as conn:
            found = conn.execute(
                sa.text("SELECT owner, status, started_at, arguments FROM mcp_tasks_task WHERE tool = :tool"),
                {"tool": tool},
            )
            every = [dict(row) for row in found.mappings()]
    finally:
        engine.dispose()
    return [row for row in every if label in str(row["arguments"])]


def start_rank(deployment: Deployment, label: str, owner: str) -> int:
    """Where `owner`'s job started among the jobs labelled `label` (1: first)."""
    ordered = sorted(rows(deployment, label), key=lambda row: row["started_at"])
    return [row["owner"] for row in ordered].index(owner) + 1


def test_a_burst_of_one_principal_does_not_hold_back_another_principals_job(deployment: Deployment) -> None:
    plain_url = deployment.web("web-plain", **SECRET)
    fair_url = deployment.url
    flood_token = f"flood-{uuid.uuid4().hex[:10]}"
    label = {"fair": f"fair-{uuid.uuid4().hex[:8]}", "plain": f"plain-{uuid.uuid4().hex[:8]}"}

    for url, name in ((fair_url, "fair"), (plain_url, "plain")):
        flooder = McpHttp(url, headers={"Authorization": f"Bearer {flood_token}"})
        for _ in range(BURST):
            flooder.create("echo", {"label": label[name]})
        flooder.close()
    flood_owner = rows(deployment, label["fair"])[0]["owner"]
    assert flood_token in flood_owner
    queue = str(deployment.queue)
    # B: a principal whose jobs go to another shard than A's (owners differ only in the token).
    other_token = next(
        token
        for token in (f"steady-{uuid.uuid4().hex[:10]}" for _ in range(100))
        if shard_queue(queue, flood_owner.replace(flood_token, token), int(SHARDS))
        != shard_queue(queue, flood_owner, int(SHARDS))
    )
    steady_owner = flood_owner.replace(flood_token, other_token)
    for url, name in ((fair_url, "fair"), (plain_url, "plain")):
        steady = McpHttp(url, headers={"Authorization": f"Bearer {other_token}"})
        steady.create("echo", {"label": label[name]})
        steady.close()

    start_worker(deployment, APP)

    def drained() -> bool:
        every = rows(deployment, label["fair"]) + rows(deployment, label["plain"])
        return len(every) == 2 * (BURST + 1) and all(row["status"] == "completed" for row in every)

    wait_until(drained, 120, "the worker to run every job")
    assert start_rank(deployment, label["plain"], steady_owner) == BURST + 1  # the control: behind the burst
    assert start_rank(deployment, label["fair"], steady_owner) <= 3  # fair: about one of A's per turn


def test_the_console_shows_the_shard_a_fair_routed_job_went_to(deployment: Deployment) -> None:
    """The console's detail names the queue the dispatcher sent the job to: the owner's shard, not the
    default queue no job of the tool goes to."""
    token = f"console-{uuid.uuid4().hex[:10]}"
    root = deployment.console("fair-console-token-0123456789", MCP_TASKS_FAIR_QUEUES=SHARDS, **SECRET)
    caller = McpHttp(deployment.url, headers={"Authorization": f"Bearer {token}"})
    label = f"console-{uuid.uuid4().hex[:8]}"
    task_id = caller.create("echo", {"label": label})
    caller.close()
    owner = rows(deployment, label)[0]["owner"]
    with httpx.Client(
        base_url=root, headers={"Authorization": "Bearer fair-console-token-0123456789"}, timeout=10
    ) as api:
        detail = api.get(f"/api/tasks/{task_key(task_id)}").json()
    assert detail["queue"] == shard_queue(str(deployment.queue), owner, int(SHARDS))


def start_worker(deployment: Deployment, app: str, *queues: str) -> Proc:
    """One worker, one process, one message prefetched: it consumes the default queue and its shards (or, with
    `queues`, what its `-Q` names)."""
    argv = [sys.executable, "-m", "celery", "-A", app, "worker", "-P", "prefork", "-c", "1"]
    argv += ["--prefetch-multiplier", "1", "--without-mingle", "--without-gossip", "--loglevel", "INFO"]
    argv += ["-n", f"fair-{uuid.uuid4().hex[:6]}@%h", *(["-Q", ",".join(queues)] if queues else [])]
    env = process_env(
        deployment.backend,
        **deployment.env(MCP_TASKS_FAIR_QUEUES=SHARDS, MCP_TASKS_WORKER_METRICS_PORT="off", **SECRET),
    )
    worker = spawn("worker-fair", argv, env, deployment.log_dir)
    deployment.procs.append(worker)
    return worker


def test_a_worker_whose_queues_leave_out_the_shards_says_so_at_start(deployment: Deployment) -> None:
    """A worker given `-Q` consumes only what it names: with the default queue alone, every job sent to a shard
    would wait for nobody."""
    queue = str(deployment.queue)
    worker = start_worker(deployment, APP, queue)
    wait_until(lambda: " ready." in worker.text() or worker.popen.poll() is not None, 60, "the worker")
    shards = ",".join(shard_queue_names := [f"{queue}.fair{n}" for n in range(int(SHARDS))])
    assert (
        f"celery-mcp-tasks: warning: this worker consumes {queue!r} but not its shards {', '.join(shard_queue_names)}"
        in worker.text()
    ), worker.text()
    assert f"(-Q {queue},{shards})" in worker.text()
    worker.stop()
    deployment.procs.remove(worker)


def test_anonymous_clients_counted_per_client_each_take_their_turn(
    backend: Backend, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """With MCP_TASKS_QUOTA_ANONYMOUS=per_client each client address is a caller of its own for the fair queues
    as for the quotas: every anonymous job went to one shard, and one client's burst held back all others."""
    app = "examples.guide.many_callers"  # no authentication: every caller is anonymous
    with Deployment(app, backend, tmp_path_factory.mktemp(f"fair-anonymous-{backend.name}")) as deployment:
        url = deployment.web(
            "web-anonymous", MCP_TASKS_FAIR_QUEUES=SHARDS, MCP_TASKS_QUOTA_ANONYMOUS="per_client", **SECRET
        )
        queue = str(deployment.queue)

        def shard(address: str) -> str:
            client = anonymous_caller(SimpleNamespace(client=SimpleNamespace(host=address)))
            return shard_queue(queue, None, int(SHARDS), client)

        flood_address = "192.0.2.10"  # uvicorn trusts loopback's X-Forwarded-For: the test is that proxy
        steady_address = next(a for a in (f"192.0.2.{n}" for n in range(11, 250)) if shard(a) != shard(flood_address))
        label = f"anonymous-{uuid.uuid4().hex[:8]}"
        flooder = McpHttp(url, headers={"X-Forwarded-For": flood_address})
        for n in range(BURST):
            flooder.create("charge", {"order_id": f"{label}-flood-{n}", "cents": 1})
        flooder.close()
        steady = McpHttp(url, headers={"X-Forwarded-For": steady_address})
        steady.create("charge", {"order_id": f"{label}-steady", "cents": 1})
        steady.close()
        start_worker(deployment, app)

        def drained() -> list[dict[str, Any]] | None:
            every = rows(deployment, label, "charge")
            return every if len(every) == BURST + 1 and all(row["status"] == "completed" for row in every) else None

        ordered = sorted(wait_until(drained, 120, "the worker to run every job"), key=lambda row: row["started_at"])
        rank = [f"{label}-steady" in str(row["arguments"]) for row in ordered].index(True) + 1
        assert rank <= 3, rank  # its own shard's turn, not behind the other client's burst
