"""Task tools keep what a Celery user relies on, with a real worker on PostgreSQL + Redis: a base class of
their own (`base=`), a result backend for detached runs and none for MCP tasks' runs, `ctx.attempt` in a
detached retry, a `rate_limit` that holds a job in the worker past the stale timeout."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis
from celery import Celery

from tests.support import POSTGRES_URL, REDIS_URL, Backend, Deployment, McpHttp, celery_id_of, fresh_postgres_database
from tests.worker.conftest import FAST

pytestmark = [pytest.mark.integration, pytest.mark.postgres, pytest.mark.redis]


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    if not (POSTGRES_URL and REDIS_URL):
        pytest.skip("set MCP_TASKS_TEST_POSTGRES_URL and MCP_TASKS_TEST_REDIS_URL to run")
    with fresh_postgres_database(POSTGRES_URL) as url:
        backend = Backend(
            "pg_redis",
            {"MCP_TASKS_DATABASE_URL": url, "CELERY_BROKER_URL": REDIS_URL, "CELERY_RESULT_BACKEND": REDIS_URL},
        )
        with Deployment(
            "tests.apps.celery_options_app", backend, tmp_path_factory.mktemp("celery-options")
        ) as deployment:
            deployment.web(**FAST)
            deployment.worker(beat=True, env=FAST)  # stale timeout 3 s, janitor every second
            yield deployment


@pytest.fixture
def caller(deployment: Deployment) -> Iterator[Celery]:
    """A plain Celery client of the same broker and result backend, sending by name as `.delay()` does. Its
    `.get()` may not refuse as 'within a task': tests before it in this process may have run jobs eagerly."""
    app = Celery("caller", broker=REDIS_URL, backend=REDIS_URL)
    yield app
    app.close()


def test_a_detached_run_leaves_its_result_in_the_backend_and_an_mcp_tasks_run_none(
    deployment: Deployment, caller: Celery
) -> None:
    sent = caller.send_task("tests.apps.celery_options_app.double", kwargs={"x": 4}, queue=deployment.queue)
    assert sent.get(timeout=30, disable_sync_subtasks=False) == 8

    client = McpHttp(deployment.url)
    try:
        task_id = client.create("double", {"x": 5})
        done = client.wait_for(task_id, timeout=30)
        assert done["status"] == "completed", done
        message_id = celery_id_of(client, task_id)
    finally:
        client.close()
    backend = redis.Redis.from_url(str(REDIS_URL))
    try:
        assert not backend.exists(f"celery-task-meta-{message_id}")  # the outcome is the store's alone
    finally:
        backend.close()


def test_the_jobs_base_class_is_the_users(deployment: Deployment) -> None:
    from celery_mcp_tasks.worker.job import McpJob
    from tests.apps.celery_options_app import Audited, double

    assert isinstance(double, Audited) and isinstance(double, McpJob) and double.audited
    client = McpHttp(deployment.url)
    try:
        done = client.wait_for(client.create("double", {"x": 1}), timeout=30)
        assert done["status"] == "completed", done
    finally:
        client.close()
    worker = deployment.procs[-1]
    assert "audited run of tests.apps.celery_options_app.double" in worker.text()


def test_a_detached_retry_knows_its_attempt(deployment: Deployment, caller: Celery) -> None:
    sent = caller.send_task("tests.apps.celery_options_app.second_try", queue=deployment.queue)
    assert sent.get(timeout=30, disable_sync_subtasks=False) == 1


def test_a_job_waiting_for_its_rate_limit_in_the_worker_is_not_taken_for_lost(deployment: Deployment) -> None:
    """`rate_limit="6/m"`: the second run waits ~10 s in the worker, past the 3 s stale timeout. The worker
    holds its message and keeps its task alive: it runs once and completes, never re-sent as lost."""
    client = McpHttp(deployment.url)
    try:
        first, second = client.create("limited", {"i": 1}), client.create("limited", {"i": 2})
        assert client.wait_for(first, timeout=30)["status"] == "completed"
        done = client.wait_for(second, timeout=40)
        assert done["status"] == "completed", done
        assert "lost" not in (done.get("statusMessage") or "")
    finally:
        client.close()
    assert "superseded" not in deployment.procs[-1].text()  # no second copy was sent and skipped
