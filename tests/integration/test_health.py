"""`/healthz` and `/readyz` from real `serve` processes, and a database that hangs under one.

The hang is real TCP: the web process reaches PostgreSQL through a forwarder of
the test's own that, on demand, accepts connections and passes no byte either way
(what a stalled server, a dead NAT entry or a saturated proxy looks like), or lets
new connections log in and then holds their first query forever (a socket that goes
silent after connecting, which no connect timeout bounds). Each `/readyz` must still
answer within 2 s, a probe every few hundred ms (and the janitor watch every
interval) must not leave a thread behind per probe, and SIGTERM must end the
process even with a probe stuck for good.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa

from celery_mcp_tasks.migrate import upgrade
from celery_mcp_tasks.ops.probes import PROBE_TIMEOUT_S
from tests.support import (
    POSTGRES_URL,
    Backend,
    Deployment,
    free_port,
    fresh_postgres_database,
    probe_client,
    wait_until,
)

pytestmark = pytest.mark.integration


class StallingForwarder:
    """A TCP forwarder to `target`; `stall()` holds every byte (old and new connections) until `flow()`;
    `stall_queries()` lets connections made from then on log in, and holds their first query."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.flowing = threading.Event()
        self.flowing.set()
        self.hold_queries = False
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def stall(self) -> None:
        self.flowing.clear()

    def flow(self) -> None:
        self.hold_queries = False
        self.flowing.set()

    def stall_queries(self) -> None:
        self.hold_queries = True

    def close(self) -> None:
        self.flowing.set()
        self.server.close()
        for sock in self.sockets:
            sock.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            self.sockets += [client, upstream]
            hold = self.hold_queries
            threading.Thread(target=self._pump, args=(client, upstream, hold), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, hold_queries: bool = False) -> None:
        try:
            while data := source.recv(65536):
                # A typed frontend message (Query, Parse) after the untyped startup packets: a statement.
                while not self.flowing.wait(0.05) or (hold_queries and self.hold_queries and data[:1] in (b"Q", b"P")):
                    pass
                sink.sendall(data)
        except OSError:
            return
        finally:
            for sock in (source, sink):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


@pytest.fixture
def through_forwarder(tmp_path: Path) -> Iterator[tuple[Deployment, StallingForwarder]]:
    if not POSTGRES_URL:
        pytest.skip("set MCP_TASKS_TEST_POSTGRES_URL to run")
    with fresh_postgres_database(POSTGRES_URL) as url:
        upgrade(url)
        parsed = sa.engine.make_url(url)
        forwarder = StallingForwarder((parsed.host or "127.0.0.1", parsed.port or 5432))
        proxied = parsed.set(port=forwarder.port).render_as_string(hide_password=False)
        backend = Backend("pg_stalling", {"MCP_TASKS_DATABASE_URL": proxied, "MCP_TASKS_DATA_DIR": str(tmp_path)})
        try:
            with Deployment("examples.quickstart.app", backend, tmp_path) as deployment:
                # The janitor watch reads the ledger every half second: through the hang, it must hold one thread.
                env, OPS[0] = ops_on()
                deployment.web(CELERY_BROKER_URL="filesystem://", MCP_TASKS_JANITOR_INTERVAL_S="0.5", **env)
                wait_until(lambda: _answers(OPS[0]), 20, "the operations port to listen")
                yield deployment, forwarder
        finally:
            forwarder.close()


OPS = [""]  # the operations base URL of the module's deployment


def ops_on() -> tuple[dict[str, str], str]:
    """The settings that turn the health plugin and the janitor watch on, their own port, and its base URL."""
    port = free_port()
    env = {"MCP_TASKS_HEALTH": "on", "MCP_TASKS_JANITOR_WATCH": "on", "MCP_TASKS_OPS_PORT": str(port)}
    return env, f"http://127.0.0.1:{port}"


def _answers(base: str) -> bool:
    try:
        return httpx.get(f"{base}/healthz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def threads_of(deployment: Deployment) -> int:
    pid = deployment.procs[0].popen.pid
    return len(list(Path(f"/proc/{pid}/task").iterdir()))


@pytest.fixture
def probe() -> Iterator[httpx.Client]:
    with probe_client() as client:
        yield client


def readyz(probe: httpx.Client, base: str) -> tuple[httpx.Response, float]:
    start = time.monotonic()
    response = probe.get(f"{base}/readyz")
    return response, time.monotonic() - start


@pytest.mark.postgres
def test_readyz_answers_within_two_seconds_while_the_database_hangs(
    through_forwarder: tuple[Deployment, StallingForwarder], probe: httpx.Client
) -> None:
    deployment, forwarder = through_forwarder
    base = OPS[0]
    response, _ = readyz(probe, base)
    assert response.status_code == 200, response.text
    # The ledger reads: "ok", or "warn" once three 0.5 s intervals passed without a sweep (no beat
    # runs here; a loaded machine can take that long between the plugin's set-up and this probe).
    assert response.json()["checks"]["janitor"]["status"] in ("ok", "warn")

    forwarder.stall()
    response, elapsed = readyz(probe, base)
    assert elapsed < 2, f"/readyz took {elapsed:.2f}s with the database hanging"
    assert response.status_code == 503
    checks = response.json()["checks"]
    assert checks["store"] == {"status": "fail", "detail": "timed out (no answer within 1.5s)"}
    assert checks["schema"]["status"] == "fail"
    assert checks["janitor"]["status"] == "fail"
    assert checks["broker"]["status"] == "ok", "the broker does not hang with the database"
    time.sleep(1)  # the janitor watch's read has started and hangs too
    threads = threads_of(deployment)
    for _ in range(8):
        response, elapsed = readyz(probe, base)
        assert response.status_code == 503 and elapsed < 2
        started = time.monotonic()
        assert probe.get(f"{base}/healthz").status_code == 200, "liveness never waits for the store"
        assert time.monotonic() - started < 0.5
    assert threads_of(deployment) <= threads + 1, "a hung check or watch must not pile up a thread per probe"

    forwarder.flow()
    wait_until(lambda: readyz(probe, base)[0].status_code == 200, 20, "/readyz to recover with the database")


@pytest.mark.postgres
@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_serve_process_with_a_probe_stuck_for_good_exits_promptly(
    through_forwarder: tuple[Deployment, StallingForwarder], stop: signal.Signals, probe: httpx.Client
) -> None:
    """Stuck for good: logged in, then the query never answered (no connect or statement timeout applies).
    Before, the probes ran in a ThreadPoolExecutor, whose threads the interpreter joins at exit: on SIGINT
    (Ctrl-C, or any exit through the interpreter's shutdown) `serve` waited forever. uvicorn ends a SIGTERM
    by re-raising it, which kills the process before that join; the daemon threads make both prompt."""
    deployment, forwarder = through_forwarder
    base = OPS[0]
    assert readyz(probe, base)[0].status_code == 200
    forwarder.stall_queries()
    response, elapsed = readyz(probe, base)
    assert response.status_code == 503 and elapsed < 2
    assert response.json()["checks"]["store"] == {"status": "fail", "detail": "timed out (no answer within 1.5s)"}
    time.sleep(PROBE_TIMEOUT_S + 1)  # past every timeout the probe has: it is stuck, not slow
    assert readyz(probe, base)[1] < 2
    web = deployment.procs[0]
    started = time.monotonic()
    web.popen.send_signal(stop)
    try:
        web.popen.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass
    finally:
        waited = time.monotonic() - started
        forwarder.flow()
    assert waited < 5, f"{stop.name} waited for a hung probe:\n{web.text()}"


@pytest.mark.postgres
@pytest.mark.redis
def test_readyz_on_a_postgres_and_redis_deployment_names_each_check(tmp_path: Path, probe: httpx.Client) -> None:
    from tests.support import REDIS_URL

    if not (POSTGRES_URL and REDIS_URL):
        pytest.skip("set MCP_TASKS_TEST_POSTGRES_URL and MCP_TASKS_TEST_REDIS_URL to run")
    with fresh_postgres_database(POSTGRES_URL) as url:
        backend = Backend("pg_redis", {"MCP_TASKS_DATABASE_URL": url, "CELERY_BROKER_URL": REDIS_URL})
        with Deployment("examples.quickstart.app", backend, tmp_path) as deployment:
            env, base = ops_on()
            deployment.web(**env)  # migrates the fresh database at start
            wait_until(lambda: _answers(base), 20, "the operations port to listen")
            assert httpx.get(deployment.url.removesuffix("/mcp") + "/readyz", timeout=5).status_code == 404
            # A fresh process's first probe pays for imports and first connections (~0.5 s of CPU, measured):
            # on a loaded machine it may answer "timed out"; a replica becomes ready at a later probe.
            response, elapsed = wait_until(
                lambda: (answer := readyz(probe, base))[0].status_code == 200 and answer, 20, "/readyz to say ready"
            )
    assert elapsed < 2
    body = response.json()
    assert body["status"] == "ok"
    assert {name: check["status"] for name, check in body["checks"].items()} == {
        "store": "ok",
        "schema": "ok",
        "broker": "ok",
        "janitor": "ok",
    }
    assert body["checks"]["broker"]["detail"].startswith("redis reachable (")
    assert body["checks"]["janitor"]["detail"] == "no sweep recorded yet (expected every 60s)"
