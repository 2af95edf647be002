"""Two web replicas behind a real round-robin proxy, per broker: what must work on any replica.

Debian's haproxy (http mode, `balance roundrobin`, sticky only for an earlier era's `Mcp-Session-Id`, a generated config on free
ports, `X-Served-By` naming the replica that answered) in front of two `celery-mcp-tasks serve`
processes of the conformance app sharing MCP_TASKS_REQUEST_STATE_SECRET, with a `celery worker`,
on PostgreSQL: once with Celery on Redis (push by PostgreSQL NOTIFY), once on RabbitMQ with
push forced onto the kombu fanout there. The full conformance suite through the same set-up
runs in CI as its own step (.ci/conformance_replicas); this is the fast proof.
"""

from __future__ import annotations

import csv
import io
import os
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from celery_mcp_tasks.migrate import upgrade
from tests.integration.test_protocol_eras import LegacySession
from tests.mcp.listen_client import SUBSCRIPTION_ID, ListenStream
from tests.support import (
    POSTGRES_URL,
    REDIS_URL,
    Backend,
    Deployment,
    McpHttp,
    Proc,
    free_port,
    fresh_postgres_database,
    port_open,
    spawn,
    start_web,
    start_worker,
    tool,
    wait_until,
)

pytestmark = pytest.mark.integration

APP = "examples.conformance.app"
HAPROXY = os.environ.get("HAPROXY", "/usr/sbin/haproxy")
RABBITMQ_URL = os.environ.get("MCP_TASKS_TEST_RABBITMQ_URL")
SECRET = "replicas-" + uuid.uuid4().hex  # 41 bytes: every replica of the deployment holds it
ACCEPT = {"action": "accept", "content": {"confirm": True}}
NAME = {"name": "Alice"}

HAPROXY_CONFIG = """\
global
    maxconn 256
defaults
    mode http
    timeout connect 5s
    timeout client 60s
    timeout server 60s
frontend mcp
    bind 127.0.0.1:{proxy}
    default_backend replicas
backend replicas
    balance roundrobin
    # An earlier protocol era's session lives in one replica: its requests go where its initialize went.
    stick-table type string len 64 size 100k expire 1h
    stick store-response res.hdr(mcp-session-id)
    stick match req.hdr(mcp-session-id)
    http-response set-header X-Served-By %[srv_name]
    server a 127.0.0.1:{a}
    server b 127.0.0.1:{b}
frontend stats
    bind 127.0.0.1:{stats}
    stats enable
    stats uri /stats
"""


@dataclass
class Replicas:
    a: str  # replica a's own endpoint (not through the proxy)
    b: str
    proxy: str
    stats: str
    deployment: Deployment
    streams: list[ListenStream] = field(default_factory=list)

    def listen(self, url: str, notifications: dict[str, Any], **options: Any) -> ListenStream:
        """A listen stream, closed once the web processes have ended it (a reader blocked in a
        stream that stays open cannot be interrupted sooner)."""
        stream = ListenStream(url, notifications, **options)
        self.streams.append(stream)
        return stream

    def served(self, counts_before: dict[str, int]) -> dict[str, int]:
        """Requests each replica answered (haproxy's own counters) since `counts_before`."""
        now = self.counters()
        return {name: now[name] - counts_before.get(name, 0) for name in now}

    def counters(self) -> dict[str, int]:
        rows = csv.DictReader(io.StringIO(httpx.get(f"{self.stats};csv", timeout=5).text.lstrip("# ")))
        return {row["svname"]: int(row["req_tot"] or 0) for row in rows if row["svname"] in ("a", "b")}


def _broker(name: str) -> tuple[str, str]:
    """(broker URL, MCP_TASKS_NOTIFY) of a topology; skips when its services are not configured."""
    if not POSTGRES_URL:
        pytest.skip("set MCP_TASKS_TEST_POSTGRES_URL to run")
    if name == "redis":
        if not REDIS_URL:
            pytest.skip("set MCP_TASKS_TEST_REDIS_URL to run")
        return REDIS_URL, "auto"  # PostgreSQL NOTIFY
    if not RABBITMQ_URL:
        pytest.skip("set MCP_TASKS_TEST_RABBITMQ_URL to run")
    return RABBITMQ_URL, "broker"  # the kombu fanout, on RabbitMQ


def _haproxy(log_dir: Path, a: str, b: str) -> tuple[Proc, str, str]:
    haproxy = tool("haproxy", "Debian: apt-get install haproxy", path=HAPROXY)
    proxy, stats = free_port(), free_port()
    config = log_dir / "haproxy.cfg"
    ports = {"a": httpx.URL(a).port, "b": httpx.URL(b).port}
    config.write_text(HAPROXY_CONFIG.format(proxy=proxy, stats=stats, **ports))
    proc = spawn("haproxy", [haproxy, "-db", "-f", str(config)], dict(os.environ), log_dir)
    wait_until(lambda: (port_open(proxy) and port_open(stats)) or proc.popen.poll() is not None, 20, "haproxy")
    if proc.popen.poll() is not None:
        raise RuntimeError(f"haproxy exited:\n{proc.text()}")
    return proc, f"http://127.0.0.1:{proxy}/mcp", f"http://127.0.0.1:{stats}/stats"


@pytest.fixture(
    scope="module",
    params=[
        pytest.param("redis", marks=[pytest.mark.postgres, pytest.mark.redis]),
        pytest.param("rabbitmq", marks=pytest.mark.postgres),
    ],
)
def replicas(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Replicas]:
    broker_url, notify = _broker(request.param)
    log_dir = tmp_path_factory.mktemp(f"replicas-{request.param}")
    assert POSTGRES_URL is not None
    with fresh_postgres_database(POSTGRES_URL) as url:
        upgrade(url)  # before any process: a worker refuses a store behind head
        env = {
            "MCP_TASKS_DATABASE_URL": url,
            "CELERY_BROKER_URL": broker_url,
            "MCP_TASKS_NOTIFY": notify,
            "MCP_TASKS_REQUEST_STATE_SECRET": SECRET,
            "MCP_TASKS_WORKER_METRICS_PORT": "off",
        }
        deployment = Deployment(APP, Backend(f"replicas-{request.param}", env), log_dir)
        streams: list[ListenStream] = []
        try:
            with ThreadPoolExecutor(3) as pool:  # the three start at once: ~5 s instead of ~12
                webs = [
                    pool.submit(start_web, APP, deployment.backend, log_dir, name, **deployment.env()) for name in "ab"
                ]
                worker = pool.submit(start_worker, APP, deployment.backend, log_dir, "worker", **deployment.env())
                (web_a, a), (web_b, b) = (future.result() for future in webs)
                deployment.procs += [web_a, web_b, worker.result()]
            proxy, proxy_url, stats = _haproxy(log_dir, a, b)
            deployment.procs.append(proxy)
            yield Replicas(a, b, proxy_url, stats, deployment, streams)
        except BaseException:
            print(deployment.logs())
            raise
        finally:
            deployment.stop()
            for stream in streams:  # ended by their web process by now: nothing left to wait for
                stream.close()


@dataclass
class Proxied:
    """A client of the proxy, and which replica answered each of its requests (`X-Served-By`)."""

    http: McpHttp
    served: list[str]

    def call(self, tool: str, **params: Any) -> dict[str, Any]:
        """tools/call with `params` (a later MRTR round's `inputResponses`, `requestState`) beside the name."""
        reply = self.http.rpc("tools/call", {"name": tool, "arguments": {}, **params}, name=tool)
        assert "result" in reply, reply
        return reply["result"]


@pytest.fixture
def proxied(replicas: Replicas) -> Iterator[Proxied]:
    client = Proxied(McpHttp(replicas.proxy), [])
    client.http.http.event_hooks["response"] = [lambda r: client.served.append(r.headers.get("x-served-by", "?"))]
    yield client
    client.http.close()


def test_the_proxy_sends_each_request_to_the_next_replica(replicas: Replicas, proxied: Proxied) -> None:
    before = replicas.counters()
    for _ in range(6):
        assert "tools" in proxied.http.rpc("tools/list")["result"]
    assert proxied.served in (["a", "b"] * 3, ["b", "a"] * 3), proxied.served
    assert replicas.served(before) == {"a": 3, "b": 3}  # haproxy's own counters agree


def test_an_earlier_era_session_stays_on_the_replica_that_holds_it(replicas: Replicas) -> None:
    """A 2025-era client keeps its session (`Mcp-Session-Id`) in the replica its `initialize` reached: the
    proxy's stick table sends every later request there (round robin sent every other one to the replica
    that answers `Session not found`), while requests without a session still take turns."""
    session = LegacySession(replicas.proxy, "2025-11-25", {}).open()
    served: list[str] = []
    session.http.event_hooks["response"] = [lambda r: served.append(r.headers.get("x-served-by", "?"))]
    try:
        for n in range(4):
            reply = session.call_tool("greet", {"name": f"era-{n}"})
            assert reply["result"]["content"][0]["text"] == f"Hello, era-{n}!", reply
    finally:
        session.close()
    assert len(served) == 4 and len(set(served)) == 1, served


def test_a_question_sealed_by_one_replica_is_answered_on_the_other(proxied: Proxied) -> None:
    """The SDK seals round 1's requestState; round 2 lands on the other replica, which unseals it."""
    tool = "test_input_required_result_request_state"
    first = proxied.call(tool)
    assert first["resultType"] == "input_required", first
    answer = {"confirm": {"action": "accept", "content": {"ok": True}}}
    second = proxied.call(tool, inputResponses=answer, requestState=first["requestState"])
    assert proxied.served[0] != proxied.served[1], proxied.served
    assert second["content"][0]["text"] == "state-ok: confirmed=True", second


def test_a_question_before_a_task_exists_then_its_task_cross_replicas(proxied: Proxied) -> None:
    """MRTR round 1 on one replica, round 2 (which creates the task) on the other, then polled on both."""
    first = proxied.call("test_tool_with_task")
    assert first["resultType"] == "input_required", first
    (key,) = first["inputRequests"]
    state = {"requestState": first["requestState"]} if "requestState" in first else {}
    created = proxied.call("test_tool_with_task", inputResponses={key: {"action": "accept", "content": NAME}}, **state)
    assert created["resultType"] == "task", created
    done = proxied.http.wait_for(created["taskId"])
    assert proxied.http.get(created["taskId"])["status"] == "completed"  # read twice at least: once on each replica
    assert proxied.served[0] != proxied.served[1] and {"a", "b"} <= set(proxied.served[2:]), proxied.served
    assert done["status"] == "completed" and "Alice" in done["result"]["content"][0]["text"], done


def test_a_stream_on_one_replica_hears_every_change_made_through_the_other(replicas: Replicas) -> None:
    """Listen on replica a; the task is created and answered through replica b and run by the worker."""
    through_b = McpHttp(replicas.b)
    try:
        task_id = through_b.create("confirm_delete", {"filename": "replicas.txt"})
        through_b.wait_for(task_id, "input_required")
        stream = replicas.listen(replicas.a, {"taskIds": [task_id]})
        assert stream.ack()["notifications"] == {"taskIds": [task_id]}
        reply = through_b.task("tasks/update", task_id, inputResponses={"confirm": ACCEPT})
        assert reply["result"]["resultType"] == "complete", reply
        seen = [stream.task(timeout=30)]  # the answer (written by web b), then the job's run and end (the worker)
        while seen[-1]["status"] != "completed":
            seen.append(stream.task(timeout=30))
        assert {note["taskId"] for note in seen} == {task_id}
        assert all(note["_meta"][SUBSCRIPTION_ID] == stream.request_id for note in seen)
        assert seen[-1]["result"]["content"][0]["text"] == "Deleted replicas.txt", seen[-1]
    finally:
        through_b.close()


def test_a_tool_list_change_on_one_replica_reaches_streams_on_the_other(replicas: Replicas) -> None:
    """The fixture's subscription bus (examples/conformance/replica_bus.py) carries core events too."""
    stream = replicas.listen(replicas.a, {"toolsListChanged": True}, capabilities={})
    through_b = McpHttp(replicas.b, capabilities={})
    try:
        stream.ack()
        assert "result" in through_b.call_tool("test_trigger_tool_change")
        message = stream.next(timeout=10)
        assert message is not None and message["method"] == "notifications/tools/list_changed", message
    finally:
        through_b.close()
