"""`/metrics` on the web app: this process's counts plus the sweep record, and an answer even when the store is not.

Real apps on a real SQLite store, a PostgreSQL URL nobody answers, and one that accepts
connections and never speaks (a database that hangs).
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
import sqlalchemy as sa
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families
from starlette.testclient import TestClient

from celery_mcp_tasks import McpTasks
from celery_mcp_tasks.app import internals
from celery_mcp_tasks.config import Settings
from celery_mcp_tasks.migrate import upgrade
from celery_mcp_tasks.ops.metrics import Scrape
from celery_mcp_tasks.store.base import StoreUnavailable
from celery_mcp_tasks.store.sql import SqlStore
from tests.support import POSTGRES_URL, fresh_postgres_database, silent_server, wait_until


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def store_errors(operation: str) -> float:
    return REGISTRY.get_sample_value("mcp_tasks_store_errors_total", {"operation": operation}) or 0.0


def ledger_errors() -> float:
    return REGISTRY.get_sample_value("mcp_tasks_scrape_errors_total", {"source": "ledger"}) or 0.0


def app_on(url: str | None, tmp_path: Path, **settings: object) -> McpTasks:
    values: dict[str, object] = {
        "data_dir": tmp_path,
        "database_url": url,
        "notify": "off",
        "janitor_interval_s": 30.0,
        "metrics": True,  # the Prometheus plugin, as MCP_TASKS_METRICS=on turns it on
    }
    values.update(settings)
    tasks = McpTasks("metrics-test", settings=Settings(**values))  # type: ignore[arg-type]

    @tasks.mcp_task(shared=False)  # each test's app has its own `report`; none leaks into later apps
    def report() -> str:
        return "ok"

    return tasks


def test_the_route_serves_this_process_counts_and_the_last_sweep(tmp_path: Path) -> None:
    tasks = app_on(None, tmp_path)
    upgrade(tasks.settings.store_url)
    internals(tasks).service().create(owner=None, tool="report", arguments={})  # sent to the embedded broker
    internals(tasks).service().create(owner=None, tool="not-a-tool", arguments={})  # no such job: the send fails
    internals(tasks).sweep()

    with TestClient(tasks.asgi_app()) as client:
        assert client.get("/metrics").status_code == 404  # never on the MCP app
    response = TestClient(tasks.ops_app()).get("/metrics")

    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    seen = samples(response.text)
    assert seen[("mcp_tasks_created_total", (("tool", "report"),))] >= 1
    assert seen[("mcp_tasks_created_total", (("tool", "other"),))] >= 1
    assert seen[("mcp_tasks_ledger_up", ())] == 1
    assert seen[("mcp_tasks_janitor_interval_seconds", ())] == 30
    assert seen[("mcp_tasks_enqueue_failures_total", (("tool", "other"),))] >= 1
    assert seen[("mcp_tasks_in_status", (("status", "working"),))] == 1
    assert seen[("mcp_tasks_in_status", (("status", "failed"),))] == 1
    assert seen[("mcp_tasks_in_status", (("status", "completed"),))] == 0
    assert abs(seen[("mcp_tasks_janitor_last_sweep_timestamp_seconds", ())] - time.time()) < 60
    assert ("mcp_tasks_janitor_sweeps_total", ()) in seen
    assert ("mcp_tasks_listen_streams", ()) in seen


def test_with_metrics_off_there_is_no_route(tmp_path: Path) -> None:
    tasks = app_on(None, tmp_path, metrics=False)

    assert not internals(tasks).plugins
    assert TestClient(tasks.ops_app()).get("/metrics").status_code == 404


def test_a_scrape_while_the_database_refuses_answers_and_counts_the_failure(tmp_path: Path) -> None:
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    tasks = app_on(f"postgresql://postgres@127.0.0.1:{port}/nowhere", tmp_path)
    before = (ledger_errors(), store_errors("connect"))

    response = anyio.run(Scrape(internals(tasks).service, tasks.settings.janitor_interval_s).respond)

    assert response.status_code == 200
    seen = samples(bytes(response.body).decode())
    assert seen[("mcp_tasks_ledger_up", ())] == 0
    assert ("mcp_tasks_in_status", (("status", "working"),)) not in seen
    assert seen[("mcp_tasks_janitor_interval_seconds", ())] == 30  # configuration still shows
    assert ledger_errors() >= before[0] + 1
    # The refused connection is counted when its read ends: on a loaded machine that can be after the
    # scrape gave up waiting for it (0.5 s) and answered; the read still ends, and is counted then.
    wait_until(lambda: store_errors("connect") >= before[1] + 1, 30, "the refused connection to be counted")


@pytest.fixture
def hanging_database() -> Iterator[int]:
    """A port that accepts connections and never answers: a database that hangs."""
    with silent_server() as port:
        yield port


def test_a_scrape_while_the_database_hangs_answers_within_its_deadline(tmp_path: Path, hanging_database: int) -> None:
    tasks = app_on(f"postgresql://postgres@127.0.0.1:{hanging_database}/hangs", tmp_path)
    scrape = Scrape(internals(tasks).service, tasks.settings.janitor_interval_s, timeout_s=0.5)
    before = ledger_errors()

    started = time.monotonic()
    first = anyio.run(scrape.respond)
    second = anyio.run(scrape.respond)  # the first read still hangs: no second thread joins it
    took = time.monotonic() - started

    assert (first.status_code, second.status_code) == (200, 200)
    assert took < 2.0
    assert samples(bytes(second.body).decode())[("mcp_tasks_ledger_up", ())] == 0
    assert ledger_errors() == before + 2


def test_store_errors_are_counted_by_operation_once_each(tmp_path: Path) -> None:
    tasks = app_on(f"sqlite:///{tmp_path / 'unmigrated.db'}", tmp_path)
    store = internals(tasks).service().store
    before = store_errors("select")

    with pytest.raises(StoreUnavailable):
        store.get("k")

    assert store_errors("select") == before + 1


def _errors_elsewhere_on_the_same_database(url: str, tmp_path: Path) -> None:
    tasks = app_on(url, tmp_path)
    internals(tasks).service()  # this process's store: the one whose errors count
    own_engine = sa.create_engine(url)  # the application's own engine on the same database
    other_store = SqlStore.from_url(url)  # a store this app did not build (a script, a test helper)
    before = (store_errors("select"), store_errors("other"))
    try:
        missing = sa.exc.ProgrammingError if url.startswith("postgresql") else sa.exc.OperationalError
        with pytest.raises(missing), own_engine.connect() as conn:
            conn.execute(sa.text("SELECT * FROM the_application_s_table_that_is_not_there"))
        with pytest.raises(StoreUnavailable):
            other_store.get("k")
        assert (store_errors("select"), store_errors("other")) == before

        with pytest.raises(StoreUnavailable):
            internals(tasks).service().store.versions(["k"])  # the store's own failure still counts
        assert store_errors("select") == before[0] + 1
    finally:
        own_engine.dispose()
        other_store.dispose()
        internals(tasks).service().store.dispose()


def test_errors_of_other_engines_on_the_store_s_database_are_not_the_store_s(tmp_path: Path) -> None:
    _errors_elsewhere_on_the_same_database(f"sqlite:///{tmp_path / 'unmigrated.db'}", tmp_path)


@pytest.mark.postgres
def test_on_postgresql_too_only_the_store_s_engine_counts(tmp_path: Path) -> None:
    if not POSTGRES_URL:
        pytest.skip("set MCP_TASKS_TEST_POSTGRES_URL to run")
    with fresh_postgres_database(POSTGRES_URL) as url:  # empty: every query of the store fails
        _errors_elsewhere_on_the_same_database(url, tmp_path)


@pytest.mark.postgres
def test_a_task_its_ttl_removed_unfinished_is_scraped_as_finished_expired(tmp_path: Path) -> None:
    """Real PostgreSQL: created = finished + in flight still holds once the janitor evicts a task that never ended."""
    if not POSTGRES_URL:
        pytest.skip("set MCP_TASKS_TEST_POSTGRES_URL to run")
    with fresh_postgres_database(POSTGRES_URL) as url:
        upgrade(url)
        tasks = app_on(url, tmp_path)
        service = internals(tasks).service()
        try:
            service.create(owner=None, tool="report", arguments={}, ttl_ms=500)  # queued, no worker: never ends
            service.create(owner=None, tool="report", arguments={})  # in flight, within its TTL
            done = service.create(owner=None, tool="report", arguments={}, ttl_ms=500)[0]
            service.cancel(done, None)
            before = _scraped(tasks)
            time.sleep(0.6)
            assert internals(tasks).sweep().removed == 2
            after = _scraped(tasks)
        finally:
            service.store.dispose()

    def delta(name: str, **labels: str) -> float:
        key = (name, tuple(sorted(labels.items())))
        return after.get(key, 0.0) - before.get(key, 0.0)

    assert delta("mcp_tasks_finished_total", tool="report", status="expired") == 1
    assert delta("mcp_tasks_finished_total", tool="report", status="cancelled") == 0  # counted once, at the cancel
    in_flight = after[("mcp_tasks_in_status", (("status", "working"),))]
    created = sum(v for (name, _), v in after.items() if name == "mcp_tasks_created_total")
    finished = sum(v for (name, _), v in after.items() if name == "mcp_tasks_finished_total")
    assert in_flight == 1
    assert delta("mcp_tasks_created_total", tool="report") == 0  # both scrapes follow every creation
    assert created >= finished + in_flight  # other tests of this process counted in the same registry


def _scraped(tasks: McpTasks) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return samples(TestClient(tasks.ops_app()).get("/metrics").text)


def test_a_scrape_reads_the_ledger_while_the_application_holds_every_worker_thread(tmp_path: Path) -> None:
    """`ops_app()` mounted in the application's own app shares the event loop's thread pool with its sync routes.
    A read that waited there for a thread past the deadline never ran, and every later scrape said "a previous
    read has not returned" until the process restarted."""
    tasks = app_on(None, tmp_path)
    upgrade(tasks.settings.store_url)
    internals(tasks).sweep()
    scrape = Scrape(internals(tasks).service, tasks.settings.janitor_interval_s, timeout_s=0.5)
    release = threading.Event()
    views = []

    async def main() -> None:
        anyio.to_thread.current_default_thread_limiter().total_tokens = 1
        async with anyio.create_task_group() as group:
            group.start_soon(anyio.to_thread.run_sync, release.wait)  # the application's work holds the one thread
            await anyio.sleep(0.05)
            views.append(await scrape.ledger())
            release.set()
        views.append(await scrape.ledger())

    anyio.run(main)

    assert [view.ok for view in views] == [True, True]
    assert views[0].record is not None
