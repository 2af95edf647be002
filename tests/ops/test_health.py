"""`/healthz` and `/readyz` in process: each check's verdict on a real store and broker, and the runner's
deadline, with real threads that really hang.

The same endpoints served by real `serve` processes, with a database that hangs:
tests/integration/test_health.py.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import socket
import threading
import time
from pathlib import Path
from typing import Any

import anyio
import pytest
import sqlalchemy as sa
from starlette.testclient import TestClient

from celery_mcp_tasks import McpTasks
from celery_mcp_tasks.app import internals
from celery_mcp_tasks.config import Settings
from celery_mcp_tasks.migrate import upgrade
from celery_mcp_tasks.ops.health import CheckRunner, Health
from celery_mcp_tasks.ops.probes import PROBE_TIMEOUT_S, Finding, ProbeEngine, janitor_probe
from celery_mcp_tasks.preflight import script_heads
from celery_mcp_tasks.store.schema import VERSION_TABLE, sweeps
from celery_mcp_tasks.store.sweeps import JANITOR, SweepLedger
from tests.support import free_port, table_locked

(HEAD,) = script_heads()[0]  # the package's newest migration


def app_on(settings: Settings) -> McpTasks:
    tasks = McpTasks(f"health-{time.monotonic_ns()}", settings=settings, plugins=[Health()])

    @tasks.mcp_task(shared=False)  # a new app per test: not one more Celery-wide task of that name
    def noop() -> str:
        return "ok"

    return tasks


@pytest.fixture
def embedded(tmp_path: Path) -> McpTasks:
    return app_on(Settings(data_dir=tmp_path, janitor_interval_s=5.0))


def readyz(tasks: McpTasks) -> tuple[int, dict[str, Any], float]:
    client = TestClient(tasks.ops_app())
    start = time.monotonic()
    response = client.get("/readyz")
    return response.status_code, response.json(), time.monotonic() - start


def test_healthz_answers_without_touching_the_store(embedded: McpTasks) -> None:
    response = TestClient(embedded.ops_app()).get("/healthz")
    assert response.status_code == 200 and response.json() == {"status": "ok"}
    mcp = TestClient(embedded.asgi_app())  # no `with`: the lifespan (push) is not what is tested
    assert mcp.get("/healthz").status_code == 404 and mcp.get("/readyz").status_code == 404
    assert not (embedded.settings.resolved_data_dir / "tasks.db").exists()


def test_readyz_names_every_check_and_fails_on_a_store_never_created(embedded: McpTasks) -> None:
    code, body, _ = readyz(embedded)
    assert code == 503 and body["status"] == "fail"
    assert list(body["checks"]) == ["store", "schema", "broker", "janitor"]
    assert body["checks"]["store"] == {
        "status": "fail",
        "detail": "the task store does not exist yet; run `celery-mcp-tasks db upgrade`",
    }
    assert body["checks"]["broker"]["status"] == "ok"
    assert not (embedded.settings.resolved_data_dir / "tasks.db").exists(), "a probe must not create the store"


def test_readyz_is_200_on_a_migrated_store_and_the_janitor_has_three_intervals_for_its_first_sweep(
    embedded: McpTasks,
) -> None:
    upgrade(embedded.settings.store_url)
    code, body, _ = readyz(embedded)
    assert code == 200, body
    assert {name: check["status"] for name, check in body["checks"].items()} == dict.fromkeys(
        ["store", "schema", "broker", "janitor"], "ok"
    )
    assert body["checks"]["schema"]["detail"] == f"at head {HEAD}"
    assert body["checks"]["janitor"]["detail"] == "no sweep recorded yet (expected every 5s)"
    internals(embedded).sweep()
    _, body, _ = readyz(embedded)
    assert body["checks"]["janitor"] == {"status": "ok", "detail": "last sweep 0s ago (expected every 5s)"}


def test_a_stale_janitor_is_a_warning_that_keeps_the_replica_ready(embedded: McpTasks) -> None:
    upgrade(embedded.settings.store_url)
    engine = internals(embedded).service().store.engine
    SweepLedger(engine).record(JANITOR, duration_ms=3, report={}, statuses={})
    with engine.begin() as conn:  # as if that sweep began 16 s ago (on the database's clock)
        conn.execute(sa.update(sweeps).values(swept_at=sweeps.c.swept_at - 16_000))
    code, body, _ = readyz(embedded)
    assert code == 200 and body["status"] == "ok"
    assert body["checks"]["janitor"] == {"status": "warn", "detail": "stale: last sweep 16s ago, expected every 5s"}


def test_the_janitor_check_is_skipped_when_sweeps_are_off(tmp_path: Path) -> None:
    tasks = app_on(Settings(data_dir=tmp_path, janitor_interval_s=None))
    upgrade(tasks.settings.store_url)
    code, body, _ = readyz(tasks)
    assert code == 200
    assert body["checks"]["janitor"]["status"] == "skipped"


def test_a_schema_behind_head_fails_readiness_with_the_upgrade_command(embedded: McpTasks) -> None:
    upgrade(embedded.settings.store_url, "0004")
    code, body, _ = readyz(embedded)
    assert code == 503
    assert body["checks"]["store"]["status"] == "ok"
    assert body["checks"]["schema"] == {
        "status": "fail",
        "detail": f"the task store is at revision 0004, behind {HEAD}; run `celery-mcp-tasks db upgrade`",
    }


def test_a_schema_a_newer_release_migrated_is_a_warning_that_keeps_the_replica_ready(embedded: McpTasks) -> None:
    """Mid-upgrade: the new release's `db upgrade` ran while this (older) replica still serves."""
    upgrade(embedded.settings.store_url)
    engine = sa.create_engine(embedded.settings.store_url)
    with engine.begin() as conn:
        conn.execute(sa.text(f"UPDATE {VERSION_TABLE} SET version_num = '0099'"))
    engine.dispose()
    code, body, _ = readyz(embedded)
    assert code == 200, body
    assert body["checks"]["schema"]["status"] == "warn"
    assert "revision 0099, which this release of celery-mcp-tasks does not know" in body["checks"]["schema"]["detail"]


def test_a_broker_that_refuses_connections_fails_readiness_quickly(tmp_path: Path) -> None:
    port = free_port()  # nothing listens there: a real refused connection
    tasks = app_on(
        Settings(database_url=f"sqlite:///{tmp_path / 'tasks.db'}", broker_url=f"redis://127.0.0.1:{port}/0")
    )
    upgrade(tasks.settings.store_url)
    code, body, elapsed = readyz(tasks)
    assert code == 503 and elapsed < 2
    broker = body["checks"]["broker"]
    assert broker["status"] == "fail" and broker["detail"].startswith("cannot reach the broker: ")
    assert "Connection refused" in broker["detail"]


def test_the_embedded_broker_makes_its_folders_when_probed(embedded: McpTasks) -> None:
    """Constructing the app makes no folder; connecting (as the probe does) makes them."""
    upgrade(embedded.settings.store_url)
    assert not embedded.settings.broker_folder.exists()
    code, body, _ = readyz(embedded)
    assert code == 200 and body["checks"]["broker"]["detail"] == "embedded filesystem broker: folders present"
    assert (embedded.settings.broker_folder / "control").is_dir()


def test_an_embedded_broker_folder_that_cannot_be_made_fails_readiness(embedded: McpTasks) -> None:
    upgrade(embedded.settings.store_url)
    embedded.settings.broker_folder.mkdir(parents=True)
    (embedded.settings.broker_folder / "control").write_text("a file where the folder should be")
    code, body, _ = readyz(embedded)
    assert code == 503
    detail = body["checks"]["broker"]["detail"]
    assert detail.startswith("cannot reach the broker: cannot make the broker's folder "), detail


@pytest.mark.postgres
def test_the_janitor_probe_has_the_statement_timeout_every_probe_has(postgres_url: str) -> None:
    """Before, it read the ledger outside `probe.read`: a lock on the sweep table held it as long as the lock."""
    upgrade(postgres_url)
    with table_locked(postgres_url, "mcp_tasks_sweep"):
        started = time.monotonic()
        finding = janitor_probe(ProbeEngine(postgres_url), Settings(janitor_interval_s=5.0))
        elapsed = time.monotonic() - started
    assert finding.status == "fail" and finding.detail.startswith("cannot read the sweep ledger: "), finding
    assert "statement timeout" in finding.detail
    assert elapsed < PROBE_TIMEOUT_S + 2


@pytest.mark.postgres
def test_a_probe_connection_drops_a_silent_peer_within_seconds(postgres_url: str) -> None:
    """libpq's keepalives and `tcp_user_timeout` on the probe's own socket (a partition, a dead NAT entry)."""
    probe = ProbeEngine(postgres_url)

    def options(conn: sa.Connection) -> tuple[int, int, int]:
        fd = conn.connection.dbapi_connection.pgconn.socket  # type: ignore[union-attr]
        sock = socket.socket(fileno=os.dup(fd))
        try:
            return (
                sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE),
                sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE),
                sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT),
            )
        finally:
            sock.close()

    assert probe.read(options) == (1, PROBE_TIMEOUT_S, PROBE_TIMEOUT_S * 1000)


# -- the runner ----------------------------------------------------------------------------


class Hanging:
    """A check that blocks until released, counting how often it was started."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.started = 0

    def __call__(self) -> Finding:
        self.started += 1
        self.release.wait(30)
        return Finding("ok", "answered at last")


def test_a_hung_check_times_out_at_the_deadline_and_is_never_started_twice() -> None:
    hanging = Hanging()
    runner = CheckRunner({"slow": hanging, "quick": lambda: Finding("ok", "fine")}, deadline_s=0.3)
    try:
        for _ in range(5):
            start = time.monotonic()
            findings = anyio.run(runner.run)
            assert time.monotonic() - start < 0.6
            assert findings["slow"] == Finding("fail", "timed out (no answer within 0.3s)")
            assert findings["quick"] == Finding("ok", "fine")
        assert hanging.started == 1, "a check still running must be waited on, not started again"
        assert runner.in_flight == 1
    finally:
        hanging.release.set()
    time.sleep(0.1)
    assert anyio.run(runner.run)["slow"] == Finding("ok", "answered at last")
    assert hanging.started == 2 and runner.in_flight == 0


def test_a_check_stuck_past_its_deadline_answers_at_once_without_waiting_it_again() -> None:
    """While the database hangs, every probe after the first answers "timed out" without a second wait."""
    hanging = Hanging()
    runner = CheckRunner({"slow": hanging, "quick": lambda: Finding("ok", "fine")}, deadline_s=1.0)
    try:
        start = time.monotonic()
        anyio.run(runner.run)
        assert time.monotonic() - start >= 1.0, "a fresh run is waited on until its deadline"
        for _ in range(5):
            start = time.monotonic()
            findings = anyio.run(runner.run)
            assert time.monotonic() - start < 0.5, "the stuck run's deadline has passed: nothing left to wait for"
            assert findings == {
                "slow": Finding("fail", "timed out (no answer within 1s)"),
                "quick": Finding("ok", "fine"),
            }
        assert hanging.started == 1
    finally:
        hanging.release.set()


def test_concurrent_requests_share_one_run_of_each_check() -> None:
    hanging = Hanging()
    runner = CheckRunner({"slow": hanging}, deadline_s=0.5)

    async def three_at_once() -> list[dict[str, Finding]]:
        results: list[dict[str, Finding]] = []

        async def one() -> None:
            results.append(await runner.run())

        async with anyio.create_task_group() as tg:
            for _ in range(3):
                tg.start_soon(one)
            await anyio.sleep(0.1)
            hanging.release.set()
        return results

    results = anyio.run(three_at_once)
    assert [r["slow"] for r in results] == [Finding("ok", "answered at last")] * 3
    assert hanging.started == 1


def test_checks_run_in_daemon_threads_that_never_hold_the_exit() -> None:
    """A pool's worker threads are joined at interpreter exit: after SIGTERM a hung probe kept `serve` alive."""
    seen: list[bool] = []

    def check() -> Finding:
        seen.append(threading.current_thread().daemon)
        return Finding("ok", "fine")

    anyio.run(CheckRunner({"one": check, "two": check}).run)
    assert seen == [True, True]


def test_a_check_that_raises_is_a_failed_check() -> None:
    def broken() -> Finding:
        raise RuntimeError("probe exploded\nsecond line")

    findings = anyio.run(CheckRunner({"broken": broken}).run)
    assert findings["broken"] == Finding("fail", "probe exploded")


def test_a_check_that_raises_while_waited_on_logs_nothing_at_error(caplog: pytest.LogCaptureFixture) -> None:
    """The run is a failed finding, not an exception left in a future nobody reads (asyncio would log
    "Future exception was never retrieved" with the probe's traceback)."""

    def broken_later() -> Finding:
        time.sleep(0.05)  # still running when the request starts waiting on it
        raise RuntimeError("probe exploded")

    async def answered() -> dict[str, Finding]:
        findings = await CheckRunner({"broken": broken_later}).run()
        await asyncio.sleep(0)
        gc.collect()  # the waited-on copy of the future is gone: asyncio says what it held, if anything
        await asyncio.sleep(0)
        return findings

    with caplog.at_level(logging.ERROR, logger="asyncio"):
        findings = asyncio.run(answered())
    assert findings["broken"] == Finding("fail", "probe exploded")
    assert not [r for r in caplog.records if r.name == "asyncio"], caplog.text
