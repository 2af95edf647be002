"""`celery-mcp-tasks doctor APP` against real deployments: all OK when healthy, then the matching FAIL
and its fix as the worker, the broker and the schema are each broken for real.

The deployment is `serve` + a real `celery worker -B` (so the janitor sweeps for real) on a
PostgreSQL database and a `redis-server` of the test's own, which the test stops; the schema
case is a database of its own migrated to 0004 only. A broken install (Celery fails to import) is the
config row's FAIL, not a traceback.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from celery_mcp_tasks.migrate import upgrade
from celery_mcp_tasks.preflight import script_heads
from tests.support import (
    POSTGRES_URL,
    ROOT,
    Backend,
    free_port,
    fresh_postgres_database,
    own_redis_deployment,
    port_open,
    probe_client,
    process_env,
    spawn,
    wait_until,
)

(HEAD,) = script_heads()[0]  # the package's newest migration

pytestmark = pytest.mark.integration

APP = "examples.quickstart.app"
INTERVAL = "2"


def doctor(backend: Backend, *extra: str, **env: str) -> tuple[int, dict[str, Any], str]:
    """Run the command as a user would, with the deployment's environment; (exit status, JSON, plain table)."""
    argv = [sys.executable, "-m", "celery_mcp_tasks.cli", "doctor", APP, "--timeout", "2", *extra]
    environment = process_env(backend, **env)
    as_json = subprocess.run([*argv, "--json"], cwd=ROOT, env=environment, capture_output=True, text=True, timeout=90)
    table = subprocess.run(argv, cwd=ROOT, env=environment, capture_output=True, text=True, timeout=90)
    assert as_json.returncode == table.returncode, table.stdout + table.stderr
    assert not table.stderr.strip(), table.stderr
    return as_json.returncode, json.loads(as_json.stdout), table.stdout


def statuses(document: dict[str, Any]) -> dict[str, str]:
    return {check["name"]: check["status"] for check in document["checks"]}


def row(document: dict[str, Any], name: str) -> dict[str, str]:
    return next(check for check in document["checks"] if check["name"] == name)


@pytest.fixture
def probe() -> Iterator[httpx.Client]:
    with probe_client() as client:
        yield client


def readyz(probe: httpx.Client, base: str) -> tuple[int, dict[str, Any]]:
    start = time.monotonic()
    response = probe.get(base + "/readyz")
    assert time.monotonic() - start < 2
    return response.status_code, response.json()


@pytest.mark.postgres
def test_healthy_then_worker_stopped_then_broker_stopped(tmp_path: Path, probe: httpx.Client) -> None:
    ops_port = free_port()
    health = {"MCP_TASKS_HEALTH": "on", "MCP_TASKS_OPS_PORT": str(ops_port)}
    base = f"http://127.0.0.1:{ops_port}"
    with own_redis_deployment(APP, tmp_path, MCP_TASKS_JANITOR_INTERVAL_S=INTERVAL, **health) as (deployment, broker):
        wait_until(lambda: port_open(ops_port), 20, "the operations port to listen")
        env = deployment.env(MCP_TASKS_JANITOR_INTERVAL_S=INTERVAL)
        worker = deployment.worker(beat=True, env={"MCP_TASKS_JANITOR_INTERVAL_S": INTERVAL})
        wait_until(
            lambda: readyz(probe, base)[1]["checks"]["janitor"]["detail"].startswith("last sweep"),
            30,
            "the janitor's first recorded sweep",
            interval=0.5,
        )

        code, document, table = doctor(deployment.backend, **env)
        assert code == 0, table
        assert set(statuses(document).values()) == {"OK"}, table
        assert document["status"] == "ok"
        assert row(document, "workers")["detail"] == f"{deployment.queue!r}: 1 worker(s); every task tool registered"
        assert row(document, "push")["detail"].startswith("postgres: a hint published and received in ")
        assert table.splitlines()[0].split() == ["CHECK", "STATUS", "DETAIL"]
        assert readyz(probe, base)[0] == 200

        # The web side with fair queues, its worker without: jobs would go to shards nobody consumes.
        code, document, table = doctor(deployment.backend, **env, MCP_TASKS_FAIR_QUEUES="2")
        workers = row(document, "workers")
        assert code == 1 and workers["status"] == "FAIL", table
        assert workers["detail"] == (  # every queue nobody consumes, not only the first
            f"1 worker(s) answered, none consumes queues '{deployment.queue}.fair0' (tools write_report); "
            f"'{deployment.queue}.fair1' (tools write_report)"
        )
        assert workers["fix"].startswith("give the workers MCP_TASKS_FAIR_QUEUES=2, as here")

        worker.stop()
        code, document, table = doctor(deployment.backend, **env)
        assert code == 1
        workers = row(document, "workers")
        assert workers["status"] == "FAIL", table
        assert workers["detail"] == "no worker answered within 2s"
        assert workers["fix"] == f"start a worker with this app's settings: `celery -A {APP} worker`"
        assert f"fix: start a worker with this app's settings: `celery -A {APP} worker`" in table
        assert statuses(document)["broker"] == "OK"
        assert readyz(probe, base)[0] == 200, "readiness is the web process's: a missing worker does not fail it"

        # Fair workers given the shards alone: every tool is served, but beat sends the janitor to the default
        # queue, which nobody consumes now: nothing would ever sweep.
        shards = f"{deployment.queue}.fair0,{deployment.queue}.fair1"
        sharded = deployment.worker("worker-shards", queues=shards, env={"MCP_TASKS_FAIR_QUEUES": "2"})
        code, document, table = doctor(deployment.backend, **env, MCP_TASKS_FAIR_QUEUES="2")
        workers = row(document, "workers")
        assert code == 1 and workers["status"] == "FAIL", table
        assert workers["detail"] == (
            f"no worker consumes queue {deployment.queue!r}, where beat sends the janitor: nothing re-sends lost "
            "jobs, fails unanswered questions or removes expired tasks"
        )
        assert workers["fix"] == (
            f"add {deployment.queue!r} to a worker's -Q (`celery -A {APP} worker -Q {shards},{deployment.queue}`), "
            "or set MCP_TASKS_JANITOR=worker to sweep inside the workers"
        )
        sharded.stop()

        # The worker ran beat too: three intervals later the janitor is stale everywhere.
        wait_until(
            lambda: readyz(probe, base)[1]["checks"]["janitor"]["status"] == "warn",
            3 * int(INTERVAL) + 5,
            "/readyz to call the janitor stale",
            interval=0.5,
        )
        assert readyz(probe, base)[0] == 200, "a stale janitor is a warning, not an unready replica"
        code, document, table = doctor(deployment.backend, **env)
        janitor = row(document, "janitor")
        assert janitor["status"] == "FAIL" and janitor["detail"].startswith("stale: last sweep "), table
        assert janitor["fix"] == (
            f"run `celery -A {APP} beat`, or set MCP_TASKS_JANITOR=worker to sweep inside the workers"
        )

        broker.stop()
        code, document, table = doctor(deployment.backend, **env)
        assert code == 1
        found = row(document, "broker")
        assert found["status"] == "FAIL", table
        assert found["detail"].startswith("cannot reach the broker: ")
        assert found["fix"] == f"start the broker or fix CELERY_BROKER_URL (now {broker.url})"
        assert row(document, "workers") == {"name": "workers", "status": "SKIP", "detail": "needs broker", "fix": ""}
        assert statuses(document)["database"] == statuses(document)["schema"] == "OK"
        status, body = readyz(probe, base)
        assert status == 503 and body["checks"]["broker"]["status"] == "fail"
        assert body["checks"]["store"]["status"] == "ok"


@pytest.mark.postgres
def test_a_schema_behind_head_is_a_schema_fail_naming_the_upgrade(tmp_path: Path) -> None:
    if not POSTGRES_URL:
        pytest.skip("set MCP_TASKS_TEST_POSTGRES_URL to run")
    with fresh_postgres_database(POSTGRES_URL) as url:
        upgrade(url, "0004")
        backend = Backend("pg_behind", {"MCP_TASKS_DATABASE_URL": url, "MCP_TASKS_DATA_DIR": str(tmp_path)})
        code, document, table = doctor(backend)
    assert code == 1
    schema = row(document, "schema")
    assert schema["status"] == "FAIL", table
    assert schema["detail"] == f"the task store is at revision 0004, behind {HEAD}; run `celery-mcp-tasks db upgrade`"
    assert "celery-mcp-tasks db upgrade" in schema["fix"]
    assert statuses(document)["database"] == "OK"
    assert statuses(document)["janitor"] == "SKIP"
    assert "fix: run `celery-mcp-tasks db upgrade`" in table


def test_a_broken_install_is_a_config_fail_row_not_a_traceback(tmp_path: Path) -> None:
    """Celery itself fails to import (a broken install): the app's import fails inside doctor's config check."""
    (tmp_path / "celery").mkdir()
    (tmp_path / "celery" / "__init__.py").write_text('raise ImportError("celery is broken in this install")\n')
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    done = subprocess.run(
        [sys.executable, "-m", "celery_mcp_tasks.cli", "doctor", "examples.quickstart.app", "--json"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "Traceback" not in done.stderr, done.stderr
    rows = json.loads(done.stdout)["checks"]
    assert rows[0]["name"] == "config" and rows[0]["status"] == "FAIL"
    assert "celery is broken in this install" in rows[0]["detail"]
    assert done.returncode != 0


def test_workers_sharing_a_node_name_are_named_with_the_fix_not_a_celery_warning(tmp_path: Path) -> None:
    """Two `celery@host` on one broker hide each other's replies: whichever answered last decided the row
    (a FAIL saying to start a worker that runs). Now the row says why, with `-n`, and stderr stays clean."""
    with own_redis_deployment(APP, tmp_path) as (deployment, _broker):
        node = f"dup-{uuid.uuid4().hex[:6]}@%h"
        workers = []
        for name, queue in (("ours", deployment.queue), ("other", f"{deployment.queue}-other")):
            argv = [sys.executable, "-m", "celery", "-A", APP, "worker", "-P", "solo", "-n", node]
            argv += ["--without-mingle", "--without-gossip", "--loglevel", "INFO"]
            workers.append(spawn(name, argv, process_env(deployment.backend, MCP_TASKS_QUEUE=queue), tmp_path))
        try:
            wait_until(lambda: all("ready." in proc.text() for proc in workers), 60, "both workers to be ready")
            _, document, table = doctor(deployment.backend, **deployment.env())  # also asserts no stderr
        finally:
            for proc in workers:
                proc.stop()
    workers_row = row(document, "workers")  # whichever reply was kept: `doctor` asserts both runs agree
    assert workers_row["status"] == "WARN", table
    assert workers_row["detail"].startswith(
        "workers share a node name, so their replies hide each other and what they consume cannot be told"
    ), table
    assert workers_row["fix"] == f"give each worker a node name of its own: `celery -A {APP} worker -n NAME@%h`"
