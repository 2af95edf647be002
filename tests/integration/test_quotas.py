"""Idempotent creation and per-principal quotas over real HTTP, as a client meets them.

`tests.apps.quota_app` (bearer tokens are principals, so each test's callers are its own) served
by `celery-mcp-tasks serve` with a `celery worker`. A retry after a dropped connection goes
through a real TCP relay that forwards the call and cuts the connection in the middle of the
answer, after the server has created the task.
"""

from __future__ import annotations

import json
import socket
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from celery_mcp_tasks.cli import main
from celery_mcp_tasks.model import task_key
from celery_mcp_tasks.store.engine import normalize_url
from celery_mcp_tasks.store.rows import owner_tag
from tests.integration.test_protocol_eras import LegacySession
from tests.support import Backend, Deployment, McpHttp, free_port, wait_until

pytestmark = pytest.mark.integration

APP = "tests.apps.quota_app"
KEY = "io.github.celery-mcp-tasks/idempotencyKey"
SECRET = "quota-tests-" + uuid.uuid4().hex  # 44 bytes, shared by every process of the deployment
WITHOUT_EXT: dict[str, Any] = {"elicitation": {}}


@pytest.fixture(scope="module")
def deployment(backend: Backend, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    with Deployment(APP, backend, tmp_path_factory.mktemp(f"quotas-{backend.name}")) as deployment:
        secret = {"MCP_TASKS_IDEMPOTENCY_SECRET": SECRET}
        deployment.web("web", **secret)
        deployment.worker(env=secret)
        yield deployment


@pytest.fixture(scope="module")
def rated_url(deployment: Deployment) -> str:
    """A second web process of the same deployment, with a creation rate: 3 per 10 minutes per caller."""
    return deployment.web(
        "web-rated",
        MCP_TASKS_IDEMPOTENCY_SECRET=SECRET,
        MCP_TASKS_QUOTA_CREATIONS="3",
        MCP_TASKS_QUOTA_WINDOW_S="600",
    )


@pytest.fixture(scope="module")
def anonymous_url(backend: Backend, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The docs' example app (no authentication), counting anonymous callers per client address."""
    log_dir = tmp_path_factory.mktemp(f"anonymous-{backend.name}")
    with Deployment("examples.guide.many_callers", backend, log_dir) as deployment:
        yield deployment.web(
            "web-anonymous",
            MCP_TASKS_IDEMPOTENCY_SECRET=SECRET,
            MCP_TASKS_QUOTA_ANONYMOUS="per_client",
            MCP_TASKS_QUOTA_ACTIVE="1",
        )


def caller(url: str, **kwargs: Any) -> McpHttp:
    return McpHttp(url, headers={"Authorization": f"Bearer caller-{uuid.uuid4().hex[:12]}"}, **kwargs)


def rows_for(deployment: Deployment, tool: str, needle: str) -> list[dict[str, Any]]:
    """The rows of `tool` whose arguments mention `needle`."""
    engine = sa.create_engine(normalize_url(deployment.backend.store_url))
    try:
        with engine.connect() as conn:
            found = conn.execute(
                sa.text("SELECT key, status, dispatches, arguments FROM mcp_tasks_task WHERE tool = :tool"),
                {"tool": tool},
            )
            rows = [dict(row) for row in found.mappings()]
    finally:
        engine.dispose()
    return [row for row in rows if needle in json.dumps(row["arguments"])]


class CuttingRelay:
    """A TCP relay to `upstream` that cuts each connection in the middle of the server's answer (once it names a task)."""

    def __init__(self, upstream: str) -> None:
        parsed = httpx.URL(upstream)
        self.upstream = (parsed.host, parsed.port or 80)
        self.port = free_port()
        self.listener = socket.create_server(("127.0.0.1", self.port))
        self.cut = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._relay, args=(client,), daemon=True).start()

    def _relay(self, client: socket.socket) -> None:
        with client, socket.create_connection(self.upstream) as server:
            threading.Thread(target=self._pump, args=(client, server), daemon=True).start()
            answer = b""
            while b"taskId" not in answer:  # the answer is on its way: the task exists
                chunk = server.recv(65536)
                if not chunk:
                    break
                answer += chunk
            client.sendall(answer[:12])  # "HTTP/1.1 200": then the line goes dead
            self.cut += 1
            client.shutdown(socket.SHUT_RDWR)

    @staticmethod
    def _pump(source: socket.socket, target: socket.socket) -> None:
        try:
            while chunk := source.recv(65536):
                target.sendall(chunk)
        except OSError:
            return

    def close(self) -> None:
        self.listener.close()


# -- idempotent creation -----------------------------------------------------------------------------


def test_a_retry_after_the_connection_dropped_mid_answer_gets_the_same_task(deployment: Deployment) -> None:
    relay = CuttingRelay(deployment.url)
    token = f"Bearer caller-{uuid.uuid4().hex[:12]}"
    label = f"dropped-{uuid.uuid4().hex[:8]}"
    meta = {KEY: f"retry-{label}"}
    try:
        cut = McpHttp(relay.url("/mcp"), headers={"Authorization": token})
        with pytest.raises(httpx.TransportError):
            cut.call_tool("echo", {"label": label}, meta=meta)
        cut.close()
        assert relay.cut == 1
        (created,) = rows_for(deployment, "echo", label)  # the lost answer's task exists

        retry = McpHttp(deployment.url, headers={"Authorization": token})
        again = retry.call_tool("echo", {"label": label}, meta=meta)["result"]
        assert again["resultType"] == "task"
        done = retry.wait_for(again["taskId"])
        assert done["status"] == "completed" and label in done["result"]["content"][0]["text"]
        (row,) = rows_for(deployment, "echo", label)  # still one task, and one job sent
        assert row["key"] == created["key"] and row["dispatches"] == 1
        assert retry.call_tool("echo", {"label": label}, meta=meta)["result"]["taskId"] == again["taskId"]
        retry.close()
    finally:
        relay.close()


def test_another_caller_with_the_same_key_gets_a_task_of_its_own(deployment: Deployment) -> None:
    label = f"shared-key-{uuid.uuid4().hex[:8]}"
    first, second = caller(deployment.url), caller(deployment.url)
    a = first.call_tool("echo", {"label": label}, meta={KEY: label})["result"]["taskId"]
    b = second.call_tool("echo", {"label": label}, meta={KEY: label})["result"]["taskId"]
    assert a != b and len(rows_for(deployment, "echo", label)) == 2
    assert second.task("tasks/get", a)["error"]["code"] == -32602  # not found: the key opened nothing
    first.close()
    second.close()


def test_the_same_key_with_other_arguments_is_refused_naming_the_field(deployment: Deployment) -> None:
    client = caller(deployment.url)
    label = f"reused-{uuid.uuid4().hex[:8]}"
    client.call_tool("echo", {"label": label}, meta={KEY: label})
    reply = client.call_tool("echo", {"label": label + "-other"}, meta={KEY: label})
    assert reply["error"]["code"] == -32602 and KEY in reply["error"]["message"]
    assert rows_for(deployment, "echo", label + "-other") == []
    client.close()


@pytest.mark.parametrize("bad", [17, "", "k" * 256, {"key": "x"}, None])
def test_an_idempotency_key_that_is_not_a_short_string_is_invalid_params(deployment: Deployment, bad: Any) -> None:
    client = caller(deployment.url)
    label = f"bad-key-{uuid.uuid4().hex[:8]}"
    reply = client.call_tool("echo", {"label": label}, meta={KEY: bad})
    assert reply["error"]["code"] == -32602 and KEY in reply["error"]["message"]
    assert rows_for(deployment, "echo", label) == []
    client.close()


def test_a_tool_derives_the_key_from_its_arguments(deployment: Deployment) -> None:
    client = caller(deployment.url)
    order = f"order-{uuid.uuid4().hex[:8]}"
    first = client.call_tool("charge", {"order": order, "amount": 5})["result"]["taskId"]
    assert client.call_tool("charge", {"order": order, "amount": 5})["result"]["taskId"] == first
    refused = client.call_tool("charge", {"order": order, "amount": 6})
    assert refused["error"]["code"] == -32602 and "idempotency key" in refused["error"]["message"]
    assert client.wait_for(first)["status"] == "completed"
    assert len(rows_for(deployment, "charge", order)) == 1
    client.close()


def test_a_synchronous_retry_with_a_key_waits_for_the_same_job(deployment: Deployment) -> None:
    client = caller(deployment.url, capabilities=WITHOUT_EXT)
    label = f"sync-{uuid.uuid4().hex[:8]}"
    first = client.call_tool("echo", {"label": label}, meta={KEY: label})["result"]
    again = client.call_tool("echo", {"label": label}, meta={KEY: label})["result"]
    assert first == again and label in first["content"][0]["text"]
    assert len(rows_for(deployment, "echo", label)) == 1
    client.close()


# -- quotas -------------------------------------------------------------------------------------------


def test_a_tools_cap_on_unfinished_tasks_refuses_the_next_one_and_frees_when_one_ends(
    deployment: Deployment,
) -> None:
    client = caller(deployment.url)
    label = f"capped-{uuid.uuid4().hex[:8]}"
    first = client.create("asks", {"label": label})
    client.create("asks", {"label": label})
    client.wait_for(first, "input_required")
    reply = client.call_tool("asks", {"label": label})
    assert reply["error"] == {
        "code": -32029,
        "message": "Quota reached: at most 2 unfinished tasks of tool asks per caller;"
        " retry once one of them has finished",
        "data": {"limit": "active_tool", "allowed": 2, "retryAfterMs": None},
    }
    assert len(rows_for(deployment, "asks", label)) == 2
    other = caller(deployment.url)  # another caller is not affected
    other.create("asks", {"label": label})
    other.close()
    client.task("tasks/cancel", first)
    client.create("asks", {"label": label})
    client.close()


def test_the_refusal_is_the_same_on_the_synchronous_path_and_earlier_eras(deployment: Deployment) -> None:
    token = f"Bearer caller-{uuid.uuid4().hex[:12]}"
    client = McpHttp(deployment.url, headers={"Authorization": token})
    label = f"eras-{uuid.uuid4().hex[:8]}"
    client.create("asks", {"label": label})
    client.create("asks", {"label": label})
    sync = client.call_tool("asks", {"label": label}, capabilities=WITHOUT_EXT)
    assert sync["error"]["code"] == -32029 and sync["error"]["data"]["limit"] == "active_tool"
    for version in ("2025-06-18", "2025-11-25"):
        http = httpx.Client(timeout=60, headers={"Authorization": token})
        legacy = LegacySession(deployment.url, version, WITHOUT_EXT, http=http).open()
        reply = legacy.call_tool("asks", {"label": label})
        assert reply["error"]["code"] == -32029 and reply["error"]["data"]["limit"] == "active_tool", reply
        legacy.close()
    assert len(rows_for(deployment, "asks", label)) == 2
    client.close()


def test_a_creation_rate_refuses_with_when_to_retry_on_another_replica_too(
    deployment: Deployment, rated_url: str
) -> None:
    token = f"Bearer caller-{uuid.uuid4().hex[:12]}"
    label = f"rated-{uuid.uuid4().hex[:8]}"
    on_rated = McpHttp(rated_url, headers={"Authorization": token})
    on_plain = McpHttp(deployment.url, headers={"Authorization": token})
    on_plain.create("echo", {"label": label})  # counted by the store, whichever process created it
    on_rated.create("echo", {"label": label})
    on_rated.create("echo", {"label": label})
    reply = on_rated.call_tool("echo", {"label": label})
    error = reply["error"]
    assert error["code"] == -32029 and error["data"]["limit"] == "creations"
    assert error["data"]["allowed"] == 3 and error["data"]["windowMs"] == 600_000
    assert 0 < error["data"]["retryAfterMs"] <= 600_000
    assert error["message"].startswith("Rate limit reached: at most 3 new tasks per 600 s per caller; retry in ")
    assert token.split()[1] not in json.dumps(reply)  # the caller is never named
    assert len(rows_for(deployment, "echo", label)) == 3
    on_rated.close()
    on_plain.close()


def test_refusals_are_counted_by_tool_never_by_caller(deployment: Deployment) -> None:
    ops_port = free_port()
    url = deployment.web(
        "web-metrics",
        MCP_TASKS_IDEMPOTENCY_SECRET=SECRET,
        MCP_TASKS_METRICS="on",
        MCP_TASKS_OPS_PORT=str(ops_port),
        MCP_TASKS_QUOTA_ACTIVE="1",
    )
    client = caller(url)
    label = f"metered-{uuid.uuid4().hex[:8]}"
    client.create("asks", {"label": label})
    assert client.call_tool("asks", {"label": label})["error"]["code"] == -32029
    assert client.call_tool("echo", {"label": label})["error"]["data"]["limit"] == "active"

    def scraped() -> str | None:
        text = httpx.get(f"http://127.0.0.1:{ops_port}/metrics", timeout=10).text
        return text if 'mcp_tasks_refused_total{limit="active",tool="echo"} 1.0' in text else None

    text = wait_until(scraped, 20, "the refusal counter")
    assert 'mcp_tasks_refused_total{limit="active",tool="asks"} 1.0' in text
    assert "caller-" not in text
    client.close()


def test_an_operator_sees_each_callers_active_tasks_and_lists_one_caller_by_name(
    deployment: Deployment, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The console's overview counts active tasks per owner, by label (its subject never shown, the quota beside
    it), and `tasks ls --owner NAMESPACE --subject NAME` lists one caller's tasks by the name its token carries."""
    token = "quota-console-" + uuid.uuid4().hex
    console = deployment.console(token, MCP_TASKS_QUOTA_ACTIVE="5", MCP_TASKS_IDEMPOTENCY_SECRET=SECRET)
    subject = f"caller-{uuid.uuid4().hex[:12]}"
    client = McpHttp(deployment.url, headers={"Authorization": f"Bearer {subject}"})
    label = f"tenant-{uuid.uuid4().hex[:8]}"
    created = [client.create("asks", {"label": label}) for _ in range(2)]
    for task in created:
        client.wait_for(task, "input_required")
    caller(deployment.url).create("asks", {"label": label})  # another caller's: not theirs

    overview = httpx.get(f"{console}/api/overview", headers={"Authorization": f"Bearer {token}"}, timeout=10).json()
    theirs = f"sub: {owner_tag('sub::' + subject)}"  # no issuer in the tokens: the namespace is `sub:`
    listed = overview["by_owner"]  # the 20 busiest owners of a store other tests' callers share: theirs among
    last = listed[-1]  # them, or 20 with as many active tasks (ties go by the random tag)
    assert {"owner": theirs, "working": 0, "input_required": 2} in listed or (
        len(listed) == 20 and last["working"] + last["input_required"] >= 2
    ), listed
    assert overview["quota_active"] == 5 and overview["owners_active"] >= 2
    assert subject not in json.dumps(overview)

    monkeypatch.setenv("MCP_TASKS_CONSOLE_TOKEN", token)
    argv = ["tasks", "ls", "--url", console, "--owner", "sub:", "--subject", subject, "--json"]
    assert main(argv) == 0
    listed = json.loads(capsys.readouterr().out)["rows"]
    assert sorted(row["key"] for row in listed) == sorted(task_key(task) for task in created)
    assert {row["owner"] for row in listed} == {theirs}
    client.close()


def test_anonymous_callers_can_have_a_quota_per_client_address(anonymous_url: str) -> None:
    """uvicorn takes the client's address from a trusted proxy's X-Forwarded-For (here: the test, on loopback)."""
    first = McpHttp(anonymous_url, headers={"X-Forwarded-For": "192.0.2.10"})
    second = McpHttp(anonymous_url, headers={"X-Forwarded-For": "192.0.2.11"})
    label = f"anonymous-{uuid.uuid4().hex[:8]}"
    first.create("export", {"report": label})  # no worker: it stays unfinished
    refusal = first.call_tool("export", {"report": label})["error"]
    assert refusal["code"] == -32029 and refusal["data"]["limit"] == "active"
    second.create("export", {"report": label})  # another client: a quota of its own
    assert "192.0.2" not in json.dumps(refusal)
    first.close()
    second.close()


def test_the_same_key_with_other_arguments_is_refused_on_the_synchronous_path_and_earlier_eras(
    deployment: Deployment,
) -> None:
    token = f"Bearer caller-{uuid.uuid4().hex[:12]}"
    label = f"reused-sync-{uuid.uuid4().hex[:8]}"
    client = McpHttp(deployment.url, headers={"Authorization": token}, capabilities=WITHOUT_EXT)
    first = client.call_tool("echo", {"label": label}, meta={KEY: label})["result"]
    assert label in first["content"][0]["text"]
    reply = client.call_tool("echo", {"label": label + "-sync"}, meta={KEY: label})
    assert reply["error"]["code"] == -32602 and KEY in reply["error"]["message"], reply
    for version in ("2025-06-18", "2025-11-25"):
        http = httpx.Client(timeout=60, headers={"Authorization": token})
        legacy = LegacySession(deployment.url, version, WITHOUT_EXT, http=http).open()
        params = {"name": "echo", "arguments": {"label": label}, "_meta": {KEY: label}}
        again = legacy.request("tools/call", params)
        assert again["result"]["content"] == first["content"], again  # the same key and arguments: the same job
        params["arguments"] = {"label": f"{label}-{version}"}
        refused = legacy.request("tools/call", params)
        assert refused["error"]["code"] == -32602 and KEY in refused["error"]["message"], refused
        legacy.close()
    assert len(rows_for(deployment, "echo", label)) == 1  # none of the other arguments created a task
    client.close()


def test_a_retry_on_another_replica_gets_the_same_task(deployment: Deployment, rated_url: str) -> None:
    """Replicas share only the secret and the store: the retry derives the same id, its INSERT meets the first row."""
    token = f"Bearer caller-{uuid.uuid4().hex[:12]}"
    label = f"replicas-{uuid.uuid4().hex[:8]}"
    on_one = McpHttp(deployment.url, headers={"Authorization": token})
    on_other = McpHttp(rated_url, headers={"Authorization": token})
    first = on_one.call_tool("echo", {"label": label}, meta={KEY: label})["result"]["taskId"]
    assert on_other.call_tool("echo", {"label": label}, meta={KEY: label})["result"]["taskId"] == first
    refused = on_other.call_tool("echo", {"label": label + "-other"}, meta={KEY: label})
    assert refused["error"]["code"] == -32602 and KEY in refused["error"]["message"]
    assert on_other.wait_for(first)["status"] == "completed"
    (row,) = rows_for(deployment, "echo", label)
    assert row["dispatches"] == 1
    on_one.close()
    on_other.close()


def test_at_the_rate_limit_a_retry_of_a_counted_creation_is_answered_on_both_paths(rated_url: str) -> None:
    """The quota counts creations, not calls: a retry meets the row it already counted, with or without the extension."""
    token = f"Bearer caller-{uuid.uuid4().hex[:12]}"
    label = f"counted-{uuid.uuid4().hex[:8]}"
    client = McpHttp(rated_url, headers={"Authorization": token})
    first = client.call_tool("echo", {"label": label}, meta={KEY: label})["result"]["taskId"]
    client.create("echo", {"label": label + "-2"})
    client.create("echo", {"label": label + "-3"})
    assert client.call_tool("echo", {"label": label + "-4"})["error"]["data"]["limit"] == "creations"
    assert client.call_tool("echo", {"label": label}, meta={KEY: label})["result"]["taskId"] == first
    synchronous = client.call_tool("echo", {"label": label}, meta={KEY: label}, capabilities=WITHOUT_EXT)
    assert label in synchronous["result"]["content"][0]["text"]  # the same job's result, not a refusal
    client.close()
