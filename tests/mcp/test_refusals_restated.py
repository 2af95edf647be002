"""Refusals made before the SDK reads a request, said as JSON-RPC errors naming what to change.

The SDK's client shows a plain-text refusal only as `-32603 Server returned an error response`: a Host or an
Origin its DNS-rebinding protection refuses (421, 403) and a mounted app whose lifespan never ran (the SDK's
500, "Task group is not initialized") are now errors a person can act on (found in an audit behind haproxy).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Mount, Route
from starlette.testclient import TestClient

from celery_mcp_tasks import McpTasks, TaskContext
from celery_mcp_tasks.config import Settings
from celery_mcp_tasks.mcp.serving import NO_LIFESPAN, PlainRefusals
from celery_mcp_tasks.migrate import upgrade
from tests.support import PROTOCOL, served_in_thread

INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {"protocolVersion": PROTOCOL, "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}},
}
HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


@pytest.fixture
def tasks(tmp_path: Path) -> McpTasks:
    settings = Settings(data_dir=tmp_path)
    upgrade(settings.store_url)
    tasks = McpTasks("refusals", settings=settings, notifier=None)

    @tasks.mcp_task
    def noop(ctx: TaskContext) -> str:
        return "ok"

    return tasks


def test_a_host_or_origin_the_server_does_not_answer_for_names_the_setting(tasks: McpTasks) -> None:
    with TestClient(tasks.asgi_app(), base_url="http://agents.example.com") as stranger:
        refused = stranger.post("/mcp", json=INITIALIZE, headers=HEADERS)
        assert refused.status_code == 421 and refused.headers["content-type"] == "application/json"
        assert refused.json()["error"]["code"] == -32600
        assert "add that host name to MCP_TASKS_ALLOWED_HOSTS" in refused.json()["error"]["message"]
    with TestClient(tasks.asgi_app(), base_url="http://localhost") as local:
        foreign = local.post("/mcp", json=INITIALIZE, headers={**HEADERS, "Origin": "https://evil.example.com"})
        assert foreign.status_code == 403
        assert "from this Origin" in foreign.json()["error"]["message"]
        assert "MCP_TASKS_ALLOWED_HOSTS" in foreign.json()["error"]["message"]
        assert local.post("/mcp", json=INITIALIZE, headers=HEADERS).status_code == 200


def test_another_403_goes_on_as_it_was() -> None:
    """A 403 the SDK's authentication makes (a missing scope) is not a DNS-rebinding refusal: left alone."""

    async def scope_refused(_request: object) -> PlainTextResponse:
        return PlainTextResponse("insufficient_scope", status_code=403)

    app = PlainRefusals(Starlette(routes=[Route("/mcp", scope_refused, methods=["POST"])]), limit=1000)
    answer = TestClient(app).post("/mcp", content=b"{}")
    assert (answer.status_code, answer.text) == (403, "insufficient_scope")


def test_a_refusal_the_app_sent_no_body_for_goes_out_as_it_was() -> None:
    """A start held to read its body is sent on when no body follows (nothing swallowed); a restated one once."""
    sent: list[dict[str, object]] = []

    async def send(message: dict[str, object]) -> None:
        sent.append(message)

    async def receive() -> dict[str, object]:
        return {"type": "http.disconnect"}

    async def start_only(scope: object, receive: object, send: Any) -> None:
        await send({"type": "http.response.start", "status": 421, "headers": []})

    async def refused(scope: object, receive: object, send: Any) -> None:
        await send({"type": "http.response.start", "status": 421, "headers": []})
        await send({"type": "http.response.body", "body": b"Invalid Host header"})

    scope = {"type": "http", "method": "POST", "path": "/mcp", "headers": []}
    anyio.run(PlainRefusals(start_only, limit=1000), scope, receive, send)
    assert sent == [{"type": "http.response.start", "status": 421, "headers": []}]
    sent.clear()
    anyio.run(PlainRefusals(refused, limit=1000), scope, receive, send)
    assert [m["type"] for m in sent] == ["http.response.start", "http.response.body"]
    assert b"MCP_TASKS_ALLOWED_HOSTS" in sent[1]["body"]  # type: ignore[operator]


def test_mounted_without_its_lifespan_every_request_says_what_to_pass_logged_once(
    tasks: McpTasks, caplog: pytest.LogCaptureFixture
) -> None:
    forgotten = Starlette(routes=[Mount("/api", app=tasks.asgi_app())])  # no lifespan=tasks.lifespan
    with TestClient(forgotten, base_url="http://localhost") as client, caplog.at_level(logging.ERROR):
        for _ in range(3):
            refused = client.post("/api/mcp", json=INITIALIZE, headers=HEADERS)
            assert refused.status_code == 503 and refused.json()["error"]["message"] == NO_LIFESPAN
        assert client.get("/api/elsewhere").status_code == 404  # the endpoint only: other paths as they were
    assert [r.getMessage() for r in caplog.records if "lifespan=tasks.lifespan" in r.getMessage()] == [
        f"celery-mcp-tasks: {NO_LIFESPAN}"
    ]
    remembered = Starlette(routes=[Mount("/api", app=tasks.asgi_app())], lifespan=tasks.lifespan)
    with TestClient(remembered, base_url="http://localhost") as client:
        assert client.post("/api/mcp", json=INITIALIZE, headers=HEADERS).status_code == 200


@pytest.fixture
def served_on_another_address(tasks: McpTasks) -> Iterator[str]:
    """The app served on 127.0.0.2: a Host its local-names-only protection refuses."""
    with served_in_thread(tasks.asgi_app(), host="127.0.0.2") as base:
        yield f"{base}/mcp"


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in _leaves(inner)]
    return [exc]


def test_the_sdk_client_shows_the_setting_not_a_server_error(served_on_another_address: str) -> None:
    async def connect() -> Exception:
        try:
            async with Client(served_on_another_address):
                pass
        except Exception as exc:  # noqa: BLE001 - the SDK's task groups wrap it
            return exc
        raise AssertionError("the server answered a Host it does not answer for")

    errors = [leaf for leaf in _leaves(anyio.run(connect)) if isinstance(leaf, MCPError)]
    assert errors and "add that host name to MCP_TASKS_ALLOWED_HOSTS" in errors[0].error.message, errors
