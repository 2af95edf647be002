"""What "Testing your tools" (docs/testing.md) shows: a user's tests of examples.guide.tools with the pytest plugin.

tests/test_docs_examples.py imports these tests, so the suite runs them exactly as printed.
"""

# --8<-- [start:tests]
import pytest
from mcp.shared.exceptions import MCPError


@pytest.mark.anyio
async def test_crunch_reports_its_result(mcp_tasks_client):
    result = await mcp_tasks_client.call_tool("crunch", {"steps": 2})
    assert result.content[0].text == "Crunched 2 steps."


@pytest.mark.anyio
async def test_crunch_shows_its_progress(mcp_tasks_client, mcp_tasks_extension):
    handle = await mcp_tasks_extension.start(mcp_tasks_client, "crunch", {"steps": 2})
    messages = [state.status_message async for state in handle.updates()]
    assert handle.status == "completed"
    assert "Step 2 of 2" in messages


@pytest.mark.anyio
async def test_deploy_asks_first(mcp_tasks_client, mcp_tasks_answers):
    mcp_tasks_answers.when("Deploy", {"ok": True})  # accept a question whose message contains "Deploy"
    result = await mcp_tasks_client.call_tool("deploy", {"service": "web"})
    assert result.content[0].text == "web: deployed"
    assert mcp_tasks_answers.asked == ["Deploy web?"]


@pytest.mark.anyio
async def test_deploy_declined(mcp_tasks_client):
    result = await mcp_tasks_client.call_tool("deploy", {"service": "web"})  # unscripted: declined
    assert result.content[0].text == "web: not deployed"


@pytest.mark.anyio
async def test_scan_can_be_cancelled(mcp_tasks_client, mcp_tasks_extension):
    handle = await mcp_tasks_extension.start(mcp_tasks_client, "scan", {"paths": ["a"] * 20})
    async for state in handle.updates():  # cancel the running job, not a message still queued:
        if state.status_message != "Queued":  # its start says "Started", or its first report already replaced that
            break
    await handle.cancel()
    assert handle.status == "cancelled"


@pytest.mark.anyio
async def test_fetch_fails_once_its_retries_are_spent(mcp_tasks_client):
    with pytest.raises(MCPError, match="URLError"):  # a failed task: the error its job raised, by name
        await mcp_tasks_client.call_tool("fetch", {"url": "http://127.0.0.1:9/"})  # nothing listens there


@pytest.mark.anyio
async def test_forecast_without_a_city_is_a_tool_error(mcp_tasks_client):
    result = await mcp_tasks_client.call_tool("forecast", {"city": " "})
    assert result.is_error and result.content[0].text == "Error executing tool forecast: Name a city."


# --8<-- [end:tests]
