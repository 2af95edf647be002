"""A janitor that cannot silently stop, with real processes on PostgreSQL + Redis.

- Web + worker without beat: the web process warns, once, within three intervals.
- MCP_TASKS_JANITOR=worker with three real `celery worker` processes (prefork): the
  ledger's sweep count grows by about one per interval between them, not three; the
  claims and sweeps happen in pool processes, never in a worker's main process (whose
  fork would copy a lock held by a sweep's metrics); the web process, watching the
  same ledger, stays quiet.
- A queue that stays more than an interval behind (one worker, jobs arriving faster than it runs
  them): sweeps still run as their turn comes, one per interval.
- An `input_required` task nobody answers within MCP_TASKS_INPUT_TIMEOUT_S is failed
  by a sweep, and `tasks/get` says why.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from celery_mcp_tasks.migrate import upgrade
from celery_mcp_tasks.store.sql import SqlStore
from celery_mcp_tasks.store.sweeps import SweepLedger
from tests.support import POSTGRES_URL, REDIS_URL, Backend, Deployment, McpHttp, fresh_postgres_database, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.postgres, pytest.mark.redis]

APP = "tests.apps.runtime_app"
INTERVAL_S = 1.0
INPUT_TIMEOUT_S = 2.0
STALE_WARNING = "the janitor is not sweeping"
WORKERS = 3


def own_backend() -> Iterator[Backend]:
    """A database of its own: one deployment's sweeps must not reach another's ledger."""
    if not (POSTGRES_URL and REDIS_URL):
        pytest.skip("set MCP_TASKS_TEST_POSTGRES_URL and MCP_TASKS_TEST_REDIS_URL to run")
    with fresh_postgres_database(POSTGRES_URL) as url:
        upgrade(url)
        yield Backend("pg_redis", {"MCP_TASKS_DATABASE_URL": url, "CELERY_BROKER_URL": REDIS_URL})


def ledger_on(backend: Backend) -> Iterator[SweepLedger]:
    store = SqlStore.from_url(backend.store_url)
    yield store.ledger()
    store.dispose()


@pytest.fixture
def backend() -> Iterator[Backend]:
    yield from own_backend()


@pytest.fixture
def ledger(backend: Backend) -> Iterator[SweepLedger]:
    yield from ledger_on(backend)


def test_without_beat_the_web_process_warns_within_three_intervals(
    backend: Backend, ledger: SweepLedger, tmp_path_factory: pytest.TempPathFactory
) -> None:
    with Deployment(APP, backend, tmp_path_factory.mktemp("no-beat")) as deployment:
        deployment.worker(env={"MCP_TASKS_JANITOR_INTERVAL_S": f"{INTERVAL_S:g}"})  # no beat anywhere
        before = ledger.last()
        deployment.web(MCP_TASKS_JANITOR_INTERVAL_S=f"{INTERVAL_S:g}", MCP_TASKS_JANITOR_WATCH="on")
        started = time.monotonic()
        web = deployment.procs[-1]
        wait_until(lambda: STALE_WARNING in web.text(), 3 * INTERVAL_S + 3, "the web process's stale warning")
        waited = time.monotonic() - started
        time.sleep(3 * INTERVAL_S)  # still stale: no second warning
        text = web.text()
    assert waited <= 3 * INTERVAL_S + 3
    assert text.count(STALE_WARNING) == 1, text
    assert "`celery -A APP beat`" in text and "MCP_TASKS_JANITOR=worker" in text
    assert ledger.last() == before  # nothing swept


def test_sweeps_go_on_while_the_queue_stays_more_than_an_interval_behind(
    backend: Backend, ledger: SweepLedger, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Jobs arrive faster than one worker runs them, so every sweep message waits behind more than an
    interval of jobs. Each still sweeps when its turn comes (one that expired after an interval never did,
    and nothing was swept until the queue drained). One sweep per interval: the three workers' test above."""
    env = {"MCP_TASKS_JANITOR": "worker", "MCP_TASKS_JANITOR_INTERVAL_S": f"{INTERVAL_S:g}"}
    with Deployment(APP, backend, tmp_path_factory.mktemp("backlog")) as deployment:
        deployment.worker(concurrency=1, env=env)
        deployment.web(**env)
        client = McpHttp(deployment.url)
        try:
            wait_until(lambda: (r := ledger.last()) is not None and r.sweeps > 0, 20, "a first in-worker sweep")
            # 0.8 s of work every 0.5 s: the queue falls 0.6 s further behind each second, 4.8 s in the end.
            ids = []
            for _ in range(16):
                ids.append(client.create("work", {"seconds": 0.8}))
                time.sleep(0.5)
            behind = ledger.last()
            # Until the last job but one is done, the queue has not drained: no message sent from now on is
            # reached, and every one reached was sent while the queue was over an interval behind.
            client.wait_for(ids[-2], "completed", timeout=60)
            during = ledger.last()
            client.wait_for(ids[-1], "completed", timeout=60)
        finally:
            client.close()
    assert behind is not None and during is not None
    # Ideally the messages sent 4-7 s in sweep at ~6.4, 8.0, 9.6 and 11.2 s; a loaded machine creates the
    # jobs more slowly and the queue falls less far behind, but still more than an interval. An expiring
    # message never swept in this window.
    assert during.sweeps - behind.sweeps >= 1, "no sweep while the queue was more than an interval behind"


@pytest.fixture(scope="module")
def in_worker_backend() -> Iterator[Backend]:
    yield from own_backend()


@pytest.fixture
def in_worker_ledger(in_worker_backend: Backend) -> Iterator[SweepLedger]:
    yield from ledger_on(in_worker_backend)


@pytest.fixture(scope="module")
def in_worker(in_worker_backend: Backend, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    """Three workers sweeping among themselves, then a web process (so it starts with sweeps already running)."""
    env = {
        "MCP_TASKS_JANITOR": "worker",
        "MCP_TASKS_JANITOR_INTERVAL_S": f"{INTERVAL_S:g}",
        "MCP_TASKS_INPUT_TIMEOUT_S": f"{INPUT_TIMEOUT_S:g}",
    }
    with Deployment(APP, in_worker_backend, tmp_path_factory.mktemp("in-worker")) as deployment:
        with ThreadPoolExecutor(WORKERS) as pool:
            list(pool.map(lambda n: deployment.worker(f"worker-{n}", concurrency=1, env=env), range(WORKERS)))
        deployment.web(**env)
        yield deployment


def test_three_in_worker_janitors_sweep_once_per_interval_between_them(
    in_worker: Deployment, in_worker_ledger: SweepLedger
) -> None:
    ledger = in_worker_ledger
    wait_until(lambda: (r := ledger.last()) is not None and r.sweeps > 0, 10, "a first in-worker sweep")
    first = ledger.last()
    assert first is not None
    start = time.monotonic()
    time.sleep(5 * INTERVAL_S)
    last = ledger.last()
    assert last is not None and last.swept_at is not None and first.swept_at is not None
    elapsed = time.monotonic() - start
    grown = last.sweeps - first.sweeps
    assert round(elapsed) - 1 <= grown <= round(elapsed) + 1, (grown, elapsed)  # ~5, never ~15
    assert (last.swept_at - first.swept_at) / grown >= 0.9 * INTERVAL_S * 1000  # never two in one interval
    assert last.claimed_by is not None and "@" in last.claimed_by
    node, pid = last.claimed_by.rsplit(":", 1)
    main_pids = {proc.popen.pid for proc in in_worker.procs if proc.name.startswith("worker")}
    assert int(pid) not in main_pids, "the sweep was claimed in a worker's main process, not in its pool"
    assert node.startswith("worker-"), node  # the worker's node name, as `-n` gave it
    assert set(last.statuses) == {"working", "input_required", "completed", "failed", "cancelled"}
    assert "in-worker janitor: claiming a sweep every 1s" in in_worker.first_worker().text()
    assert "could not send this interval's sweep" not in in_worker.logs()
    assert "Error in timer" not in in_worker.logs()
    web = next(proc for proc in in_worker.procs if proc.name == "web")
    assert STALE_WARNING not in web.text()


def test_a_question_nobody_answers_fails_after_the_input_timeout(in_worker: Deployment) -> None:
    client = McpHttp(in_worker.url)
    try:
        task_id = client.create("two_rounds")
        asked = client.wait_for(task_id, "input_required")
        asked_at = time.monotonic()
        failed = client.wait_for(task_id, "failed", timeout=INPUT_TIMEOUT_S + 10 * INTERVAL_S)
        waited = time.monotonic() - asked_at
    finally:
        client.close()
    assert asked["statusMessage"] == "Waiting for a name"
    assert failed["statusMessage"] == "No answer to the input request within 2s"
    assert waited >= INPUT_TIMEOUT_S - 0.5
    assert task_id not in in_worker.logs()
