"""Arguments that do not fit a task tool get the answer a plain SDK tool of the same signature gets.

A wrong type and a missing argument are the model's mistakes, for it to read and correct:
a `CallToolResult` with `isError` and pydantic's field-level reasons (which field, what was
wrong, what was expected), long values cut, on every era and path (a 2026-07-28 call with
the extension, one without it, and the 2025 eras' sessions). Nothing is created.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from mcp.server.mcpserver import MCPServer
from mcp.server.transport_security import TransportSecuritySettings
from starlette.testclient import TestClient

from celery_mcp_tasks import McpTasks, TaskContext
from celery_mcp_tasks.config import Settings
from celery_mcp_tasks.migrate import upgrade
from tests.support import EXT, PROTOCOL

BAD_ARGUMENTS = {
    "wrong type": {"steps": "abc"},
    "missing": {"label": "x"},
    "huge": {"steps": "9" * 200_000 + "x"},
}
PATHS = ("task", "synchronous", "2025-11-25", "2025-06-18")


@pytest.fixture(scope="module")
def ours(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TestClient, sa.Engine]]:
    settings = Settings(data_dir=Path(tmp_path_factory.mktemp("arguments")), sync_timeout_s=1)
    upgrade(settings.store_url)
    tasks = McpTasks("arguments", settings=settings, notifier=None)

    @tasks.mcp_task
    def crunch(steps: int, ctx: TaskContext, label: str = "run") -> str:
        return label * steps

    engine = sa.create_engine(settings.store_url)
    with TestClient(tasks.asgi_app(), base_url="http://localhost") as client:
        yield client, engine
    engine.dispose()


@pytest.fixture(scope="module")
def plain() -> Iterator[TestClient]:
    """The same signature as a plain SDK tool: what a task tool must answer like."""
    server = MCPServer("plain")

    @server.tool()
    def crunch(steps: int, label: str = "run") -> str:
        return label * steps

    security = TransportSecuritySettings(enable_dns_rebinding_protection=False)
    with TestClient(server.streamable_http_app(transport_security=security), base_url="http://localhost") as client:
        yield client


def rows(engine: sa.Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(sa.text("SELECT count(*) FROM mcp_tasks_task")).scalar_one())


def final_message(response: Any) -> dict[str, Any]:
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        messages = [json.loads(line[5:]) for line in response.text.splitlines() if line.startswith("data:")]
        return next(m for m in messages if "id" in m)
    message: dict[str, Any] = response.json()
    return message


def call(client: TestClient, path: str, arguments: dict[str, Any]) -> tuple[int, dict[str, Any], int]:
    """`tools/call crunch` on one path: (HTTP status, the final JSON-RPC message, the body's length)."""
    headers = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
    params: dict[str, Any] = {"name": "crunch", "arguments": arguments}
    if path in ("task", "synchronous"):
        capabilities = {"extensions": {EXT: {}}} if path == "task" else {}
        params["_meta"] = {
            "io.modelcontextprotocol/protocolVersion": PROTOCOL,
            "io.modelcontextprotocol/clientCapabilities": capabilities,
        }
        headers |= {"MCP-Protocol-Version": PROTOCOL, "Mcp-Method": "tools/call", "Mcp-Name": "crunch"}
    else:
        hello = {"protocolVersion": path, "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}
        opened = client.post(
            "/mcp", json={"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": hello}, headers=headers
        )
        headers |= {"Mcp-Session-Id": opened.headers["mcp-session-id"], "MCP-Protocol-Version": path}
        client.post("/mcp", json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=headers)
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params}
    response = client.post("/mcp", content=json.dumps(body), headers=headers)
    return response.status_code, final_message(response), len(response.content)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("case", list(BAD_ARGUMENTS))
def test_bad_arguments_answer_as_a_plain_tool_does_and_create_no_task(
    ours: tuple[TestClient, sa.Engine], plain: TestClient, path: str, case: str
) -> None:
    client, engine = ours
    before = rows(engine)
    status, message, size = call(client, path, BAD_ARGUMENTS[case])
    _, expected, _ = call(plain, path, BAD_ARGUMENTS[case])

    assert status == 200 and "error" not in message, message
    result = message["result"]
    assert result["isError"] is True
    assert result["content"] == expected["result"]["content"]
    assert rows(engine) == before
    assert size < 2_000, "a rejected value is never echoed whole"


@pytest.mark.parametrize(
    ("arguments", "reasons"),
    [
        ({"steps": "abc"}, ("steps", "Input should be a valid integer", "int_parsing")),
        ({}, ("steps", "Field required")),
        ({"steps": 2, "label": 7}, ("label", "Input should be a valid string")),
    ],
)
def test_the_reason_names_the_field_what_was_wrong_and_what_was_expected(
    ours: tuple[TestClient, sa.Engine], arguments: dict[str, Any], reasons: tuple[str, ...]
) -> None:
    client, _ = ours
    _, message, _ = call(client, "task", arguments)
    text = message["result"]["content"][0]["text"]
    assert text.startswith("Error executing tool crunch: ")
    for reason in reasons:
        assert reason in text


def test_good_arguments_still_make_a_task(ours: tuple[TestClient, sa.Engine]) -> None:
    client, engine = ours
    before = rows(engine)
    _, message, _ = call(client, "task", {"steps": 2})
    assert message["result"]["resultType"] == "task"
    assert rows(engine) == before + 1
