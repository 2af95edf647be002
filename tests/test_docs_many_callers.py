"""The "Many callers" page's examples (examples/guide/many_callers.py), served by the pytest plugin
with a creation rate and an idempotency secret, as the page tells a user to run them."""

from __future__ import annotations

import pytest
from mcp import Client

from celery_mcp_tasks.client import TasksClient
from examples.guide import many_callers

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def mcp_tasks_app() -> str:
    return "examples.guide.many_callers"


@pytest.fixture(scope="module")
def mcp_tasks_env() -> dict[str, str]:
    return {
        "MCP_TASKS_IDEMPOTENCY_SECRET": "docs-many-callers-secret-of-forty-bytes!",
        "MCP_TASKS_QUOTA_CREATIONS": "4",
        "MCP_TASKS_QUOTA_WINDOW_S": "3600",
    }


@pytest.mark.anyio
async def test_the_many_callers_examples(mcp_tasks_server: str) -> None:
    first = await many_callers.start_export(mcp_tasks_server, "request-1")
    assert first is not None
    assert await many_callers.start_export(mcp_tasks_server, "request-1") == first  # the same task: 1 creation

    extension = TasksClient()
    async with Client(mcp_tasks_server, extensions=[extension]) as client:
        charged = await extension.start(client, "charge", {"order_id": "A-17", "cents": 990})
        again = await extension.start(client, "charge", {"order_id": "A-17", "cents": 990})
        assert again.id == charged.id  # the key derived from order_id: 2 creations
        assert (await charged.result()).content[0].text == "charged 990 cents for A-17"
        # A retry once the task has completed: the creation answers with the task already final, and the client
        # reads its result (`tasks/get`), through the handle and through the SDK's own call alike.
        later = await extension.start(client, "charge", {"order_id": "A-17", "cents": 990})
        assert later.id == charged.id and (await later.result()).content[0].text == "charged 990 cents for A-17"
        plain = await client.call_tool("charge", {"order_id": "A-17", "cents": 990})
        assert plain.content[0].text == "charged 990 cents for A-17"

    assert await many_callers.export_when_allowed(mcp_tasks_server) == 0.0  # 3
    assert await many_callers.export_when_allowed(mcp_tasks_server) == 0.0  # 4: the rate is used up
    wait_s = await many_callers.export_when_allowed(mcp_tasks_server)
    assert wait_s is not None and 0 < wait_s <= 3600
