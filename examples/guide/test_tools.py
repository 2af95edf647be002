"""What "Testing your tools" (docs/testing.md) shows: a user's tests of examples.guide.tools with the pytest plugin.

tests/test_docs_examples.py imports these tests, so the suite runs them exactly as printed.
"""

# --8<-- [start:tests]
import pytest


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
    await handle.cancel()
    assert handle.status == "cancelled"


# --8<-- [end:tests]
