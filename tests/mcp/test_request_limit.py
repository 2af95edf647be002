"""The request body limit is a setting, and a too-large request hears which one (issue 21, item 4).

The SDK enforces the limit (MCP_TASKS_MAX_REQUEST_BYTES, default its own 4 MiB) before
it parses anything; the 413 it answers carries a JSON-RPC error that names the limit and
the setting, which the SDK's client (so `TasksClient`) raises as it is instead of
`-32603 Server returned an error response`. A too-large body creates no task.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
import sqlalchemy as sa
from mcp import Client
from mcp.server.transport_security import DEFAULT_MAX_REQUEST_BODY_SIZE
from mcp.shared.exceptions import MCPError
from starlette.testclient import TestClient

from celery_mcp_tasks import McpTasks, TaskContext
from celery_mcp_tasks.client import TasksClient
from celery_mcp_tasks.config import DEFAULT_MAX_REQUEST_BYTES, ConfigError, Settings
from celery_mcp_tasks.migrate import upgrade
from tests.support import EXT, PROTOCOL, served_in_thread

HEADERS = {
    "Accept": "application/json, text/event-stream",
    "Content-Type": "application/json",
    "MCP-Protocol-Version": PROTOCOL,
    "Mcp-Method": "tools/call",
    "Mcp-Name": "ingest",
}


def _app(data: Path, **settings: Any) -> tuple[McpTasks, sa.Engine]:
    app_settings = Settings(data_dir=data, **settings)
    upgrade(app_settings.store_url)
    tasks = McpTasks("limits", settings=app_settings, notifier=None)

    @tasks.mcp_task
    def ingest(document: str, ctx: TaskContext) -> int:
        return len(document)

    return tasks, sa.create_engine(app_settings.store_url)


def rows(engine: sa.Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(sa.text("SELECT count(*) FROM mcp_tasks_task")).scalar_one())


def body(document_bytes: int) -> bytes:
    params = {
        "name": "ingest",
        "arguments": {"document": "x" * document_bytes},
        "_meta": {
            "io.modelcontextprotocol/protocolVersion": PROTOCOL,
            "io.modelcontextprotocol/clientCapabilities": {"extensions": {EXT: {}}},
        },
    }
    return json.dumps({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": params}).encode()


@pytest.fixture
def small(tmp_path: Path) -> Iterator[tuple[TestClient, sa.Engine]]:
    tasks, engine = _app(tmp_path, max_request_bytes=50_000)
    with TestClient(tasks.asgi_app(), base_url="http://localhost") as client:
        yield client, engine
    engine.dispose()


def test_the_default_limit_is_the_sdks_and_the_setting_is_read_and_checked() -> None:
    assert DEFAULT_MAX_REQUEST_BYTES == DEFAULT_MAX_REQUEST_BODY_SIZE == 4 * 1024 * 1024
    assert Settings.from_env({}).max_request_bytes == DEFAULT_MAX_REQUEST_BYTES
    assert Settings.from_env({"MCP_TASKS_MAX_REQUEST_BYTES": "20000000"}).max_request_bytes == 20_000_000
    with pytest.raises(ConfigError, match="MCP_TASKS_MAX_REQUEST_BYTES"):
        Settings.from_env({"MCP_TASKS_MAX_REQUEST_BYTES": "4MB"})


def test_a_body_over_the_limit_is_413_with_a_json_rpc_error_naming_the_setting_and_no_task(
    small: tuple[TestClient, sa.Engine],
) -> None:
    client, engine = small
    before = rows(engine)
    response = client.post("/mcp", content=body(60_000), headers=HEADERS)
    assert response.status_code == 413
    assert response.headers["content-type"] == "application/json"
    error = response.json()["error"]
    assert response.json()["id"] is None  # the body was never read: its id is unknown
    assert error["code"] == -32600
    assert "50000 bytes" in error["message"] and "MCP_TASKS_MAX_REQUEST_BYTES" in error["message"]
    assert error["data"] == {"maxRequestBytes": 50_000}
    assert rows(engine) == before


def test_a_streamed_body_without_a_length_is_cut_at_the_limit_too(small: tuple[TestClient, sa.Engine]) -> None:
    client, engine = small
    before = rows(engine)
    payload = body(60_000)
    chunks = (payload[i : i + 8192] for i in range(0, len(payload), 8192))
    response = client.post("/mcp", content=chunks, headers=HEADERS)
    assert response.status_code == 413
    assert "MCP_TASKS_MAX_REQUEST_BYTES" in response.json()["error"]["message"]
    assert rows(engine) == before


def test_a_body_under_the_limit_makes_its_task(small: tuple[TestClient, sa.Engine]) -> None:
    client, engine = small
    before = rows(engine)
    response = client.post("/mcp", content=body(40_000), headers=HEADERS)
    assert response.status_code == 200 and response.json()["result"]["resultType"] == "task"
    assert rows(engine) == before + 1


def test_the_default_limit_refuses_five_mib(tmp_path: Path) -> None:
    tasks, engine = _app(tmp_path)
    with TestClient(tasks.asgi_app(), base_url="http://localhost") as client:
        response = client.post("/mcp", content=body(5 * 1024 * 1024), headers=HEADERS)
    assert response.status_code == 413
    assert "4194304 bytes (4 MiB; set by MCP_TASKS_MAX_REQUEST_BYTES)" in response.json()["error"]["message"]
    assert rows(engine) == 0
    engine.dispose()


def test_the_sdk_client_and_tasks_client_show_the_limit(tmp_path: Path) -> None:
    tasks, engine = _app(tmp_path, max_request_bytes=50_000)
    try:
        with served_in_thread(tasks.asgi_app()) as base:

            async def start() -> MCPError:
                client_ext = TasksClient()
                async with Client(f"{base}/mcp", extensions=[client_ext]) as client:
                    with pytest.raises(MCPError) as raised:
                        await client_ext.start(client, "ingest", {"document": "x" * 60_000})
                    return raised.value

            error = anyio.run(start)
        assert "MCP_TASKS_MAX_REQUEST_BYTES" in error.error.message and "50000 bytes" in error.error.message
        assert rows(engine) == 0
    finally:
        engine.dispose()
