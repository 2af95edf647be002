"""The protocol era decides whether a task tool answers with a task (issue 8, item 4).

A task is returned only on a 2026-07-28 request that declared the extension. An
earlier-era session (the 2025 `initialize` handshake over Streamable HTTP) can
name the extension in its `initialize` capabilities - the SDK keeps it there -
but its `tools/call` result has no task shape: an optional task tool runs
synchronously and answers with a plain `CallToolResult`, a required one is
refused before anything is stored or sent. The synchronous path keeps a hidden
row to run the job; it must end terminal, never a job running for nobody.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from celery_mcp_tasks.store.engine import normalize_url
from tests.support import EXT, Deployment, McpHttp, wait_until

pytestmark = pytest.mark.integration

EARLIER_ERAS = ("2025-06-18", "2025-11-25")
WITH_EXT: dict[str, Any] = {"elicitation": {}, "extensions": {EXT: {}}}
WITHOUT_EXT: dict[str, Any] = {"elicitation": {}}


@dataclass
class LegacySession:
    """A raw 2025-era Streamable HTTP session: `initialize`, then `Mcp-Session-Id` on every request."""

    url: str
    version: str
    capabilities: dict[str, Any]
    session_id: str = ""
    negotiated: str = ""
    http: httpx.Client = field(default_factory=lambda: httpx.Client(timeout=60))
    _next_id: int = 0

    def open(self) -> LegacySession:
        reply = self.request(
            "initialize",
            {
                "protocolVersion": self.version,
                "capabilities": self.capabilities,
                "clientInfo": {"name": "era-test", "version": "0"},
            },
        )
        self.negotiated = reply["result"]["protocolVersion"]
        assert self.session_id, "the 2025 Streamable HTTP transport must hand out a session id"
        response = self.post({"jsonrpc": "2.0", "method": "notifications/initialized"})
        assert response.status_code == 202, response.text
        return self

    def close(self) -> None:
        self.http.close()

    def headers(self) -> dict[str, str]:
        sent = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
        if self.session_id:
            sent |= {"Mcp-Session-Id": self.session_id, "MCP-Protocol-Version": self.negotiated}
        return sent

    def post(self, body: dict[str, Any], http: httpx.Client | None = None) -> httpx.Response:
        response = (http or self.http).post(self.url, content=json.dumps(body), headers=self.headers())
        self.session_id = self.session_id or response.headers.get("mcp-session-id", "")
        return response

    def request(
        self, method: str, params: dict[str, Any], *, request_id: int | None = None, http: httpx.Client | None = None
    ) -> dict[str, Any]:
        if request_id is None:
            self._next_id += 1
            request_id = self._next_id
        response = self.post({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}, http)
        assert response.status_code == 200, response.text
        return _final_message(response)

    def call_tool(self, name: str, arguments: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        return self.request("tools/call", {"name": name, "arguments": arguments}, **kwargs)


def _final_message(response: httpx.Response) -> dict[str, Any]:
    if not response.headers.get("content-type", "").startswith("text/event-stream"):
        reply: dict[str, Any] = response.json()
        return reply
    for line in response.text.splitlines():
        if line.startswith("data:"):
            message: dict[str, Any] = json.loads(line[5:])
            if "id" in message:
                return message
    raise AssertionError(f"SSE response without a final message: {response.text!r}")


@pytest.fixture(
    params=[(v, declared) for v in EARLIER_ERAS for declared in (True, False)],
    ids=[f"{v}-{'ext' if d else 'no-ext'}" for v in EARLIER_ERAS for d in (True, False)],
)
def legacy(request: pytest.FixtureRequest, conformance: Deployment) -> Iterator[LegacySession]:
    version, declared = request.param
    session = LegacySession(conformance.url, version, WITH_EXT if declared else WITHOUT_EXT).open()
    yield session
    session.close()


def task_rows(deployment: Deployment) -> list[dict[str, Any]]:
    engine = sa.create_engine(normalize_url(deployment.backend.store_url))
    with engine.connect() as conn:
        found = conn.execute(sa.text("SELECT key, tool, status, status_message, arguments FROM mcp_tasks_task"))
        rows = [dict(row._mapping) for row in found]
    engine.dispose()
    for row in rows:  # JSON comes back as text on SQLite, decoded on PostgreSQL
        if isinstance(row["arguments"], str):
            row["arguments"] = json.loads(row["arguments"])
    return rows


def rows_labelled(deployment: Deployment, label: str) -> list[dict[str, Any]]:
    return [row for row in task_rows(deployment) if row["arguments"].get("label") == label]


def worker_log(deployment: Deployment) -> str:
    return "\n".join(proc.text() for proc in deployment.procs if proc.name.startswith("worker"))


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


# -- what the SDK does with an earlier-era `initialize` -------------------------------------


def test_the_sdk_keeps_a_declared_extension_in_an_earlier_era_initialize() -> None:
    """Why the era must decide: the capability alone is present on a 2025-11-25 session too."""
    from mcp_types import InitializeRequestParams

    params = InitializeRequestParams.model_validate(
        {"protocolVersion": "2025-11-25", "capabilities": WITH_EXT, "clientInfo": {"name": "x", "version": "0"}},
        by_name=False,
    )
    assert params.capabilities.extensions == {EXT: {}}


# -- earlier eras ---------------------------------------------------------------------------


def test_an_earlier_era_session_negotiates_its_own_version(legacy: LegacySession) -> None:
    assert legacy.negotiated == legacy.version


def test_an_optional_task_tool_on_an_earlier_era_answers_plainly_and_its_row_ends_completed(
    conformance: Deployment, legacy: LegacySession
) -> None:
    label = unique(legacy.version)
    reply = legacy.call_tool("slow_compute", {"seconds": 1, "label": label})
    result = reply["result"]
    assert "taskId" not in result and "status" not in result and result.get("resultType") in (None, "complete")
    assert result["content"] == [{"type": "text", "text": f"Computed {label} after 1 second(s)"}]
    assert result["isError"] is False
    # The synchronous path ran the job through a hidden row: the client never learnt its id,
    # and by the time the answer arrived it was terminal (no job left running for nobody).
    (row,) = rows_labelled(conformance, label)
    assert row["status"] == "completed"


def test_the_legacy_task_augmentation_param_still_gets_a_plain_answer(legacy: LegacySession) -> None:
    """A 2025-11-25 `params.task` asks for a core (legacy) task; this server offers none."""
    reply = legacy.request(
        "tools/call", {"name": "slow_compute", "arguments": {"seconds": 0, "label": "aug"}, "task": {"ttl": 60000}}
    )
    assert reply["result"]["content"][0]["text"] == "Computed aug after 0 second(s)"
    assert "taskId" not in reply["result"]


def test_a_required_task_tool_on_an_earlier_era_is_refused_and_nothing_is_created(
    conformance: Deployment, legacy: LegacySession
) -> None:
    before = {row["key"] for row in task_rows(conformance)}
    for tool, arguments in (("failing_job", {}), ("confirm_delete", {"filename": "kept.txt"})):
        error = legacy.call_tool(tool, arguments)["error"]
        assert error["code"] == -32021
        assert f"negotiated protocol {legacy.negotiated}" in error["message"], error["message"]
        assert tool in error["message"] and "2026-07-28" in error["message"]
        assert error["data"] == {"requiredCapabilities": {"extensions": {EXT: {}}}}
    assert {row["key"] for row in task_rows(conformance)} == before
    # A probe sent after the refusals has reached the worker and run: a message sent before it would have
    # been received first (one queue, first in, first out).
    probe = unique("probe")
    assert "result" in legacy.call_tool("slow_compute", {"seconds": 0, "label": probe})
    wait_until(lambda: [r for r in rows_labelled(conformance, probe) if r["status"] == "completed"], 30, "the probe")
    assert "failing_job[" not in worker_log(conformance) and "confirm_delete[" not in worker_log(conformance)
    assert "slow_compute[" in worker_log(conformance)


def test_the_tasks_methods_do_not_exist_on_an_earlier_era(legacy: LegacySession) -> None:
    for method in ("tasks/get", "tasks/update", "tasks/cancel"):
        error = legacy.request(method, {"taskId": "x", "inputResponses": {}})["error"]
        assert error["code"] == -32601, (method, error)


def test_cancelling_a_synchronous_call_cancels_its_hidden_task(conformance: Deployment) -> None:
    """`notifications/cancelled` ends the wait; the row is cancelled and the job told to stop."""
    session = LegacySession(conformance.url, "2025-11-25", WITH_EXT).open()
    label = unique("cancel")
    replies: list[dict[str, Any]] = []

    def call() -> None:  # on its own connection: the cancel goes out while this one waits
        with httpx.Client(timeout=60) as http:
            replies.append(
                session.call_tool("slow_compute", {"seconds": 30, "label": label}, request_id=900, http=http)
            )

    caller = threading.Thread(target=call)
    caller.start()
    wait_until(lambda: rows_labelled(conformance, label), 15, "the hidden row")
    session.post({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 900}})
    caller.join(15)
    assert replies and replies[0]["error"]["code"] == -32800  # the SDK's answer to a cancelled request
    (row,) = wait_until(
        lambda: [r for r in rows_labelled(conformance, label) if r["status"] != "working"], 5, "the hidden row to end"
    )
    assert row["status"] == "cancelled"  # what the job's `ctx.cancelled()` reads: it stops within 100 ms
    session.close()


# -- 2026-07-28 ---------------------------------------------------------------------------------


def test_a_2026_request_that_declares_the_extension_gets_a_task(conformance: Deployment) -> None:
    client = McpHttp(conformance.url)
    label = unique("modern")
    task_id = client.create("slow_compute", {"seconds": 0, "label": label})
    assert client.wait_for(task_id)["result"]["content"][0]["text"] == f"Computed {label} after 0 second(s)"
    client.close()


def test_a_2026_request_without_the_extension_gets_the_synchronous_result(conformance: Deployment) -> None:
    client = McpHttp(conformance.url)
    label = unique("modern-sync")
    result = client.call_tool("slow_compute", {"seconds": 0, "label": label}, capabilities=WITHOUT_EXT)["result"]
    assert result["resultType"] == "complete" and "taskId" not in result
    assert result["content"][0]["text"] == f"Computed {label} after 0 second(s)"
    assert [row["status"] for row in rows_labelled(conformance, label)] == ["completed"]
    refused = client.call_tool("failing_job", {}, capabilities=WITHOUT_EXT)["error"]
    assert refused["code"] == -32021 and "negotiated" not in refused["message"]  # the era is right; the opt-in is not
    client.close()


def test_a_2026_synchronous_caller_that_hangs_up_cancels_the_hidden_task(conformance: Deployment) -> None:
    """On 2026-07-28 a closed response stream cancels the request: the job must not run on for nobody."""
    client = McpHttp(conformance.url)
    client.http.timeout = httpx.Timeout(1.5)
    label = unique("hang-up")
    with pytest.raises(httpx.ReadTimeout):
        client.call_tool("slow_compute", {"seconds": 30, "label": label}, capabilities=WITHOUT_EXT)
    client.close()
    (row,) = wait_until(
        lambda: [r for r in rows_labelled(conformance, label) if r["status"] != "working"], 10, "the hidden row to end"
    )
    assert row["status"] == "cancelled"
