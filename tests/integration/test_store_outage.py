"""The task store goes down under a running web process: every method answers -32603 "The task store
is unavailable", on every protocol era, with nothing of the database's text on the wire, and the
server logs one line per failed request naming the method (never a task id, never a traceback).

The outage is real: the PostgreSQL database stops accepting connections and its sessions are
terminated (`ALLOW_CONNECTIONS false` + `pg_terminate_backend`), as a failover or a maintenance
window would. Before, a 2026 client got the SDK's "Internal server error" and the log a traceback
per request; an earlier-era session got the exception's own text (SQL included) as the message.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from celery_mcp_tasks.model import task_key
from celery_mcp_tasks.store.sql import SqlStore
from tests.integration.test_protocol_eras import WITHOUT_EXT, LegacySession
from tests.support import POSTGRES_URL, Backend, Deployment, McpHttp, fresh_postgres_database, wait_until

pytestmark = pytest.mark.integration

UNAVAILABLE = {"code": -32603, "message": "The task store is unavailable"}
LEAKS = ("SELECT", "INSERT", "UPDATE", "mcp_tasks_task", "psycopg", "sqlalchemy", "accepting connections")


class Outage:
    def __init__(self, url: str) -> None:
        self.name = sa.engine.make_url(url).database
        admin_url = sa.engine.make_url(url).set(database="postgres", drivername="postgresql+psycopg")
        self.admin = sa.create_engine(admin_url, isolation_level="AUTOCOMMIT")

    def begin(self) -> None:
        with self.admin.connect() as conn:
            conn.execute(sa.text(f'ALTER DATABASE "{self.name}" ALLOW_CONNECTIONS false'))
            conn.execute(
                sa.text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = :name"),
                {"name": self.name},
            )

    def end(self) -> None:
        with self.admin.connect() as conn:
            conn.execute(sa.text(f'ALTER DATABASE "{self.name}" ALLOW_CONNECTIONS true'))


@pytest.fixture
def down(tmp_path: Path) -> Iterator[tuple[Deployment, Outage]]:
    if not POSTGRES_URL:
        pytest.skip("set MCP_TASKS_TEST_POSTGRES_URL to run")
    with fresh_postgres_database(POSTGRES_URL) as url:
        outage = Outage(url)
        backend = Backend(
            "pg_filesystem", {"MCP_TASKS_DATABASE_URL": url, "CELERY_BROKER_URL": f"filesystem://{tmp_path / 'broker'}"}
        )
        try:
            with Deployment("tests.apps.runtime_app", backend, tmp_path) as deployment:
                deployment.web(MCP_TASKS_NOTIFY="poll")
                yield deployment, outage
        finally:
            outage.end()
            outage.admin.dispose()


def _assert_unavailable(reply: dict[str, Any], what: str) -> None:
    assert reply.get("error") == UNAVAILABLE, (what, reply)
    text = json.dumps(reply)
    assert not [leak for leak in LEAKS if leak in text], (what, text)


def test_a_store_outage_answers_a_fixed_internal_error_on_every_method_and_era(
    down: tuple[Deployment, Outage],
) -> None:
    deployment, outage = down
    client = McpHttp(deployment.url)
    plain = McpHttp(deployment.url, capabilities={"elicitation": {}})  # no extension: the synchronous path
    legacy = LegacySession(deployment.url, "2025-11-25", WITHOUT_EXT).open()
    try:
        task_id = client.create("work", {"seconds": 30})
        outage.begin()
        _assert_unavailable(client.call_tool("work", {"seconds": 1}), "tools/call")
        _assert_unavailable(plain.call_tool("work", {"seconds": 1}), "tools/call, synchronously")
        _assert_unavailable(client.task("tasks/get", task_id), "tasks/get")
        _assert_unavailable(client.task("tasks/update", task_id, inputResponses={}), "tasks/update")
        _assert_unavailable(client.task("tasks/cancel", task_id), "tasks/cancel")
        _assert_unavailable(
            client.rpc("subscriptions/listen", {"notifications": {"taskIds": [task_id]}}), "subscriptions/listen"
        )
        _assert_unavailable(legacy.call_tool("work", {"seconds": 1}), "tools/call, 2025-11-25")
        outage.end()
        assert client.get(task_id)["status"] == "working"  # back once the database is: nothing was lost
    finally:
        outage.end()
        legacy.close()
        plain.close()
        client.close()
    log = deployment.procs[0].text()
    for method in ("tools/call", "tasks/get", "tasks/update", "tasks/cancel", "subscriptions/listen"):
        assert f"{method}: the task store is unavailable (" in log, log
    assert log.count("the task store is unavailable (") == 7, log
    assert "Traceback" not in log and task_id not in log


def test_a_synchronous_call_and_its_job_outlive_a_short_store_outage(
    down: tuple[Deployment, Outage], tmp_path: Path
) -> None:
    """The store is gone for 2.5 s while a synchronous call waits for its running job: the call's re-reads and the
    job's cancel checks that fail are tried again (the call's bound is far from spent), and the caller gets the
    result. Before, the first failed re-read answered -32603 and the job ran on for nobody."""
    deployment, outage = down
    deployment.worker()
    plain = McpHttp(deployment.url, capabilities={"elicitation": {}})  # no extension: the synchronous path
    marker = tmp_path / "started"
    answers: list[dict[str, Any]] = []
    caller = threading.Thread(
        target=lambda: answers.append(plain.call_tool("work", {"seconds": 6, "marker": str(marker)}))
    )
    try:
        caller.start()
        wait_until(marker.exists, 30, "the job to start")
        outage.begin()
        time.sleep(2.5)  # the outage: every read of the call's and the job's in it fails
        outage.end()
        caller.join(60)
        assert answers and answers[0].get("result", {}).get("content"), answers
        assert answers[0]["result"]["content"][0]["text"] == "worked 6s on attempt 1"
    finally:
        outage.end()
        caller.join(5)
        plain.close()
    log = deployment.procs[0].text()  # once a call and once an outage, not at each re-read and poll (24 lines)
    assert log.count("tools/call: the task store is unavailable (") == 1, log
    assert log.count("task change poll failed (StoreUnavailable)") == 1 and "poll reads the store again" in log, log


def test_a_job_that_ends_during_a_store_outage_records_its_outcome_once_the_store_is_back(
    down: tuple[Deployment, Outage], tmp_path: Path
) -> None:
    """A failover of a few seconds as the job ends: the worker tries the outcome again until the store answers,
    and the task completes from that run. Before, the outcome was dropped (with a traceback per job in the
    worker's log) and the task stayed `working` until the janitor ran the job again, minutes later."""
    deployment, outage = down
    worker = deployment.worker()
    client = McpHttp(deployment.url)
    marker = tmp_path / "started"
    try:
        task_id = client.create("work", {"seconds": 1.5, "marker": str(marker)})
        wait_until(lambda: "working" in (client.get(task_id).get("statusMessage") or ""), 30, "the job's report")
        outage.begin()
        wait_until(lambda: "trying again for up to 30 s" in worker.text(), 20, "the outcome to meet the outage")
        outage.end()
        done = wait_until(lambda: (t := client.get(task_id))["status"] != "working" and t, 20, "the outcome")
        assert done["status"] == "completed", done
        result = client.task("tasks/get", task_id)["result"]
        assert result["result"]["content"][0]["text"] == "worked 1.5s on attempt 1"
    finally:
        outage.end()
        client.close()
    log = worker.text()
    assert "Traceback" not in log and task_id not in log
    store = SqlStore.from_url(deployment.backend.store_url)
    try:  # from that run: the job was sent once (a janitor's re-send would be dispatch 2)
        record = store.get(task_key(task_id))
        assert record is not None and (record.dispatches, record.resends) == (1, 0)
    finally:
        store.dispose()
