"""URL-mode elicitation (`elicit_url`): built with an id, asked only of clients that take it, answered without
content. The refusal at `tools/call` goes through the real HTTP app; nothing is created for a client that
cannot answer."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import sqlalchemy as sa
from mcp_types import ClientCapabilities, ElicitationCapability, FormElicitationCapability, UrlElicitationCapability
from starlette.testclient import TestClient

from celery_mcp_tasks import InvalidInputRequest, McpTasks, TaskContext, elicit, elicit_url
from celery_mcp_tasks.config import Settings
from celery_mcp_tasks.mcp.sync import can_answer
from celery_mcp_tasks.migrate import upgrade
from celery_mcp_tasks.protocol import answer_problem, render_task
from celery_mcp_tasks.service import TaskService
from celery_mcp_tasks.store.sql import SqlStore
from tests.support import EXT, PROTOCOL

CAPABILITIES_KEY = "io.modelcontextprotocol/clientCapabilities"
VERSION_KEY = "io.modelcontextprotocol/protocolVersion"
ACCEPT = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


def test_the_builder_makes_a_url_request_with_a_fresh_id_each_time() -> None:
    first, second = (elicit_url("Sign in to ACME", "https://acme.example/oauth?state=1") for _ in range(2))
    assert first["method"] == "elicitation/create"
    params = first["params"]
    assert {k: v for k, v in params.items() if k != "elicitationId"} == {
        "mode": "url",
        "message": "Sign in to ACME",
        "url": "https://acme.example/oauth?state=1",
    }
    assert len(params["elicitationId"]) >= 16 and params["elicitationId"] != second["params"]["elicitationId"]
    assert elicit_url("m", "http://x.example", elicitation_id="mine")["params"]["elicitationId"] == "mine"
    with pytest.raises(InvalidInputRequest, match="must not be empty"):
        elicit_url("m", "http://x.example", elicitation_id="")


@pytest.mark.parametrize(
    "url", ["not a url", "/relative/path", "javascript:alert(1)", "file:///etc/passwd", "https://"]
)
def test_the_builder_refuses_anything_but_an_absolute_http_url(url: str) -> None:
    with pytest.raises(InvalidInputRequest, match="absolute http or https URL"):
        elicit_url("m", url)


def test_a_url_answer_carries_no_content_and_a_forms_still_does() -> None:
    url = elicit_url("Pay", "https://pay.example/checkout")
    assert answer_problem(url, {"action": "accept"}) is None
    assert answer_problem(url, {"action": "decline"}) is None
    problem = answer_problem(url, {"action": "accept", "content": {"card": "4111"}})
    assert problem is not None and problem.startswith("content: ") and "4111" not in problem
    form = elicit("Go?", {"ok": bool})
    assert answer_problem(form, {"action": "accept", "content": {"ok": True}}) is None


def _ctx(capabilities: ClientCapabilities) -> Any:
    return SimpleNamespace(session=SimpleNamespace(client_capabilities=capabilities))


def test_a_synchronous_call_asks_a_url_only_of_a_client_that_takes_urls() -> None:
    """A client declaring `elicitation: {}` takes forms only (the spec): its synchronous call is never sent a URL."""
    url, form = elicit_url("Sign in", "https://acme.example/"), elicit("Go?", {"ok": bool})
    forms_only = _ctx(ClientCapabilities(elicitation=ElicitationCapability()))
    with_urls = _ctx(ClientCapabilities(elicitation=ElicitationCapability(url=UrlElicitationCapability())))
    assert can_answer(forms_only, {"go": form}) and not can_answer(forms_only, {"in": url})
    assert can_answer(with_urls, {"in": url})
    assert not can_answer(_ctx(ClientCapabilities()), {"in": url})


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TestClient, sa.Engine]]:
    settings = Settings(data_dir=Path(tmp_path_factory.mktemp("url")))
    upgrade(settings.store_url)
    tasks = McpTasks("url-elicitation", settings=settings, notifier=None)

    @tasks.mcp_task(needs=("elicitation.url",))
    def connect(ctx: TaskContext) -> str:
        """Asks the user to sign in at the provider first."""
        if "signed_in" not in ctx.input_responses:
            ctx.require_input({"signed_in": elicit_url("Sign in to ACME", "https://acme.example/oauth")})
        return "connected"

    engine = sa.create_engine(settings.store_url)
    with TestClient(tasks.asgi_app(), base_url="http://127.0.0.1") as client:
        yield client, engine
    engine.dispose()


def _call(client: TestClient, capabilities: dict[str, Any]) -> tuple[int, Any]:
    meta = {VERSION_KEY: PROTOCOL, CAPABILITIES_KEY: capabilities}
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "connect", "_meta": meta}}
    headers = ACCEPT | {"MCP-Protocol-Version": PROTOCOL, "Mcp-Method": "tools/call", "Mcp-Name": "connect"}
    response = client.post("/mcp", content=json.dumps(body), headers=headers)
    return response.status_code, response.json()


def _rows(engine: sa.Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(sa.text("SELECT count(*) FROM mcp_tasks_task")).scalar_one())


def test_a_tool_needing_urls_refuses_a_client_that_takes_forms_only_and_creates_nothing(
    world: tuple[TestClient, sa.Engine],
) -> None:
    client, engine = world
    status, answer = _call(client, {"elicitation": {}, "extensions": {EXT: {}}})
    assert status == 400 and answer["error"]["code"] == -32021, answer
    assert answer["error"]["data"] == {"requiredCapabilities": {"elicitation": {"url": {}}}}
    assert "elicitation.url" in answer["error"]["message"]
    assert _rows(engine) == 0
    status, answer = _call(client, {"elicitation": {"form": {}, "url": {}}, "extensions": {EXT: {}}})
    assert status == 200 and answer["result"]["resultType"] == "task", answer
    assert _rows(engine) == 1


def test_a_client_declaring_urls_alone_is_not_sent_forms() -> None:
    """`elicitation: {"url": {}}` takes URLs only, as `{}` takes forms only: each is asked only what it takes."""
    url, form = elicit_url("Sign in", "https://acme.example/"), elicit("Go?", {"ok": bool})
    urls_only = _ctx(ClientCapabilities(elicitation=ElicitationCapability(url=UrlElicitationCapability())))
    both = _ctx(
        ClientCapabilities(
            elicitation=ElicitationCapability(form=FormElicitationCapability(), url=UrlElicitationCapability())
        )
    )
    assert can_answer(urls_only, {"in": url}) and not can_answer(urls_only, {"go": form})
    assert can_answer(both, {"in": url}) and can_answer(both, {"go": form})


def test_an_empty_content_is_no_content() -> None:
    """A client library that sends `content: {}` with its URL answer is not refused: only data is."""
    url = elicit_url("Pay", "https://pay.example/checkout")
    assert answer_problem(url, {"action": "accept", "content": {}}) is None
    assert answer_problem(url, {"action": "accept", "content": None}) is None


def test_a_task_carries_a_url_question_without_its_id_and_a_form_as_asked(tmp_path: Path) -> None:
    """2026-07-28 has no `elicitationId` (the SDK's model notes it was removed): `tasks/get` and `notifications/tasks`
    carried the stored one; the row keeps it for a 2025-11-25 synchronous call's `elicitation/create`."""
    url_of_store = f"sqlite:///{tmp_path / 'tasks.db'}"
    upgrade(url_of_store)
    store = SqlStore.from_url(url_of_store)
    service = TaskService(store)
    url, form = elicit_url("Pay", "https://pay.example/checkout"), elicit("Go?", {"ok": bool})
    task_id, record = service.create(owner=None, tool="t", arguments={}, dispatch=False)
    asking = service.require_input(record.key, {"pay": url, "go": form}, "Waiting")
    sent = render_task(task_id, asking)["inputRequests"]
    assert sent["pay"]["params"] == {"mode": "url", "message": "Pay", "url": "https://pay.example/checkout"}
    assert sent["go"] == form
    assert "elicitationId" in asking.input_requests["pay"]["params"]  # kept where it is stored
    store.dispose()
