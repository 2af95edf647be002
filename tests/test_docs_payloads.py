"""The "Payload limits and encryption" page's example (examples/guide/payloads.py), served by the pytest
plugin, called with the official SDK client: its tool runs, and arguments over its own limit get exactly
the refusal the page prints."""

from __future__ import annotations

import json
import re

import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError

from tests.support import ROOT

pytestmark = pytest.mark.integration

PAGE = ROOT / "docs" / "payloads.md"


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def mcp_tasks_app() -> str:
    return "examples.guide.payloads"


def the_pages_refusal() -> dict[str, object]:
    """The JSON error the page shows a client that sends too much."""
    (block,) = re.findall(r"A client that sends too\smuch reads.*?```json\n(.*?)```", PAGE.read_text(), re.DOTALL)
    refusal: dict[str, object] = json.loads(block)
    return refusal


@pytest.mark.anyio
async def test_the_payloads_example_runs_and_refuses_as_the_page_says(mcp_tasks_server: str) -> None:
    async with Client(mcp_tasks_server) as client:
        done = await client.call_tool("summarize", {"text": "tides " * 100})
        assert done.content[0].text == ("tides " * 100)[:200]  # type: ignore[union-attr]
        with pytest.raises(MCPError) as refused:
            await client.call_tool("summarize", {"text": "a" * 70_001})  # {"text":"a…"}: 70012 bytes
    assert {"code": refused.value.error.code, "message": refused.value.error.message} == the_pages_refusal()
