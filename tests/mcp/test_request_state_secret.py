"""MCP_TASKS_REQUEST_STATE_SECRET: web replicas sharing it answer each other's multi-round questions.

A question asked before a task exists carries a `requestState` the SDK seals; behind a proxy
without stickiness its answer may reach another replica. Two `McpTasks` apps stand in for two
replicas here (the same server name, as two processes of one deployment have), each served
in-process over HTTP: with one secret, round 2 is answered by the other app; with different
secrets (or none, a per-process key) it is refused with the SDK's -32602. A replica without a
shared key warns once when another replica's state reaches it, not at every start.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
from mcp.server.mcpserver import Context
from mcp.server.request_state import RequestStateSecurity
from mcp_types import ElicitRequest, ElicitRequestFormParams, InputRequiredResult
from starlette.testclient import TestClient

from celery_mcp_tasks.app import McpTasks
from celery_mcp_tasks.config import Settings
from celery_mcp_tasks.mcp.request_state import FOREIGN_STATE_WARNING, UNSHARED_NOTE
from celery_mcp_tasks.migrate import upgrade
from tests.support import PROTOCOL

SECRET = "a-replica-secret-of-more-than-thirty-two-bytes"
OTHER = "another-secret-also-longer-than-thirty-two-bytes"
NAME = "replicas"  # the audience a sealed state is bound to: one deployment, one server name
TOOL = "confirm"


def replica(tmp_path: Path, label: str, **settings: Any) -> McpTasks:
    """One web replica's app: a plain tool whose second round needs the state sealed in its first."""
    options = {key: settings.pop(key) for key in ("request_state_security",) if key in settings}
    tasks = McpTasks(NAME, settings=Settings(data_dir=tmp_path / label, **settings), notifier=None, **options)
    upgrade(tasks.settings.store_url)  # a replica serves a migrated store (its lifespan checks)

    @tasks.server.tool(name=TOOL)
    def confirm(ctx: Context) -> str | InputRequiredResult:
        answer = (ctx.input_responses or {}).get("ok")
        if ctx.request_state != "asked-by-a-replica" or answer is None:
            schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
            ask = ElicitRequest(params=ElicitRequestFormParams(message="Sure?", requested_schema=schema))
            return InputRequiredResult(input_requests={"ok": ask}, request_state="asked-by-a-replica")
        return f"confirmed={(answer.content or {}).get('ok')}"

    return tasks


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Any]:
    """`serve(label, **settings)`: an HTTP client of a freshly built replica, its lifespan running."""
    with ExitStack() as stack:

        def start(label: str, **settings: Any) -> TestClient:
            app = replica(tmp_path, label, **settings).asgi_app()
            return stack.enter_context(TestClient(app, base_url="http://127.0.0.1"))  # a local Host passes

        yield start


def call(client: TestClient, **params: Any) -> dict[str, Any]:
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {
            "name": TOOL,
            "arguments": {},
            **params,
            "_meta": {
                "io.modelcontextprotocol/protocolVersion": PROTOCOL,
                "io.modelcontextprotocol/clientCapabilities": {"elicitation": {}},
            },
        },
    }
    headers = {
        "Accept": "application/json, text/event-stream",
        "Content-Type": "application/json",
        "MCP-Protocol-Version": PROTOCOL,
        "Mcp-Method": "tools/call",
        "Mcp-Name": TOOL,
    }
    return client.post("/mcp", content=json.dumps(body), headers=headers).json()


def ask_then_answer(asks: TestClient, answers: TestClient) -> dict[str, Any]:
    """Round 1 on `asks`, round 2 (the answer and the sealed state echoed) on `answers`."""
    first = call(asks)["result"]
    assert first["resultType"] == "input_required" and first["requestState"] != "asked-by-a-replica", first
    reply = {"ok": {"action": "accept", "content": {"ok": True}}}
    return call(answers, inputResponses=reply, requestState=first["requestState"])


def test_replicas_sharing_the_secret_answer_each_others_questions(serve: Any) -> None:
    a, b = serve("a", request_state_secrets=(SECRET,)), serve("b", request_state_secrets=(SECRET,))
    for asks, answers in ((a, b), (b, a)):
        result = ask_then_answer(asks, answers)["result"]
        assert result["content"][0]["text"] == "confirmed=True", result


def test_a_replica_with_another_secret_or_none_refuses_the_state(serve: Any) -> None:
    a = serve("a", request_state_secrets=(SECRET,))
    for other in (serve("other", request_state_secrets=(OTHER,)), serve("ephemeral")):
        error = ask_then_answer(a, other)["error"]
        assert error["code"] == -32602 and error["message"] == "Invalid or expired requestState", error


def test_the_ring_unseals_with_every_secret_and_seals_with_the_first(serve: Any) -> None:
    """Rotation: a replica on `[new, old]` reads what `[old]` sealed, and `[old, new]` reads what it seals."""
    old = serve("old", request_state_secrets=(OTHER,))
    rotated = serve("rotated", request_state_secrets=(SECRET, OTHER))
    assert "result" in ask_then_answer(old, rotated)
    assert "result" in ask_then_answer(rotated, serve("rolling", request_state_secrets=(OTHER, SECRET)))
    assert "error" in ask_then_answer(rotated, old)  # sealed under SECRET, which `old` does not hold


def test_a_policy_the_user_passes_wins_over_the_setting(serve: Any) -> None:
    policy = RequestStateSecurity(keys=[OTHER])
    mine = serve("mine", request_state_secrets=(SECRET,), request_state_security=policy)
    assert "result" in ask_then_answer(mine, serve("other", request_state_secrets=(OTHER,)))
    assert "error" in ask_then_answer(mine, serve("setting", request_state_secrets=(SECRET,)))


def _lines(caplog: pytest.LogCaptureFixture, level: int) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == level and r.name == "celery_mcp_tasks"]


def test_a_single_replica_starts_without_a_warning_and_says_it_once_at_debug_level(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Most deployments are one web process: an unset secret is not worth a warning at every start."""
    remote = {"broker_url": "redis://127.0.0.1:6399/0", "database_url": f"sqlite:///{tmp_path / 'tasks.db'}"}
    with caplog.at_level(logging.DEBUG, logger="celery_mcp_tasks"):
        replica(tmp_path, "remote", **remote).asgi_app()
    assert _lines(caplog, logging.WARNING) == []
    assert _lines(caplog, logging.DEBUG) == [UNSHARED_NOTE]
    assert "\n" not in UNSHARED_NOTE and "MCP_TASKS_REQUEST_STATE_SECRET" in UNSHARED_NOTE
    for label, settings in (("shared", {"request_state_secrets": (SECRET,)}), ("embedded", {})):
        caplog.clear()
        with caplog.at_level(logging.DEBUG, logger="celery_mcp_tasks"):
            replica(tmp_path, label, **(remote if label == "shared" else {}), **settings).asgi_app()
        assert _lines(caplog, logging.DEBUG) == []


def test_a_replica_without_the_secret_warns_once_when_another_replicas_state_reaches_it(
    serve: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """The warning comes when it matters: a state this process cannot unseal, because another one sealed it."""
    a, unshared = serve("a", request_state_secrets=(SECRET,)), serve("unshared")
    with caplog.at_level(logging.WARNING, logger="celery_mcp_tasks"):
        assert "result" in ask_then_answer(unshared, unshared)  # its own state: nothing to say
        assert _lines(caplog, logging.WARNING) == []
        for _ in range(2):
            assert ask_then_answer(a, unshared)["error"]["code"] == -32602
    assert _lines(caplog, logging.WARNING) == [FOREIGN_STATE_WARNING]
    assert "MCP_TASKS_REQUEST_STATE_SECRET" in FOREIGN_STATE_WARNING and "\n" not in FOREIGN_STATE_WARNING
