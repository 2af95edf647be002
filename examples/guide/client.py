"""The Python client examples of docs/clients.md, run by tests/test_docs_examples.py against examples.guide.tools.

python -m examples.guide.client http://127.0.0.1:8000/mcp    # with `celery-mcp-tasks dev examples.guide.tools`
"""

from __future__ import annotations

import sys

import anyio

# --8<-- [start:call]
import httpx2  # for the example with a token below
from mcp import Client
from mcp.client.session import ClientRequestContext  # for the questions example below
from mcp.client.streamable_http import streamable_http_client  # for the example with a token below
from mcp_types import ElicitRequestParams, ElicitResult, TextContent  # the first two: for the questions example

from celery_mcp_tasks.client import TasksClient


async def call(url: str) -> str:
    """A plain call_tool: it waits for the task and returns the tool's CallToolResult."""
    async with Client(url, extensions=[TasksClient()]) as client:
        result = await client.call_tool("crunch", {"steps": 3})
        first = result.content[0]
        assert isinstance(first, TextContent)  # a tool may answer images, audio, resources too
        return first.text  # "Crunched 3 steps."


# --8<-- [end:call]


# --8<-- [start:options]
patient = TasksClient(
    poll_floor_s=0.1,  # polling: never more often than this
    poll_ceiling_s=5.0,  # polling: back off while nothing changes, up to this
    timeout=600.0,  # longest a plain call_tool waits (default None); past it: tasks/cancel + TimeoutError
    cancel_timeout=5.0,  # how long a tasks/cancel on the way out may take
    listen=True,  # use subscriptions/listen when the server offers it
)
# --8<-- [end:options]


# --8<-- [start:questions]
async def say_yes(context: ClientRequestContext, params: ElicitRequestParams) -> ElicitResult:
    """The client's elicitation callback answers the job's questions (here: always yes)."""
    print("asked:", params.message)  # "Deploy web?"
    return ElicitResult(action="accept", content={"ok": True})


async def deploy(url: str) -> str:
    async with Client(url, extensions=[TasksClient()], elicitation_callback=say_yes) as client:
        result = await client.call_tool("deploy", {"service": "web"})
        first = result.content[0]
        assert isinstance(first, TextContent)
        return first.text  # "web: deployed"


# --8<-- [end:questions]


# --8<-- [start:handle]
async def start_then_follow(url: str) -> list[str]:
    """Start without waiting, keep the id, follow it later (here: at once) from a new connection."""
    tasks = TasksClient()
    async with Client(url, extensions=[tasks]) as client:
        handle = await tasks.start(client, "crunch", {"steps": 3})
        task_id = handle.id  # a bearer capability: store it like a secret
        assert task_id is not None  # None only when the tool answered at once, with no task
        await tasks.stop_following(client)  # leaving while it runs: end following before the connection

    seen: list[str] = []
    async with Client(url, extensions=[tasks]) as client:
        handle = await tasks.attach(client, task_id)
        async for state in handle.updates():  # the current state, then each change, ending after the last
            seen.append(f"{state.status}: {state.status_message}")
        result = await handle.result()
        seen.append(" ".join(item.text for item in result.content if isinstance(item, TextContent)))
    return seen


# --8<-- [end:handle]


# --8<-- [start:follow-questions]
async def follow_and_answer(url: str) -> list[str]:
    """Follow a task that asks: updates() only reports, so answer an input_required state yourself."""
    tasks = TasksClient()
    async with Client(url, extensions=[tasks], elicitation_callback=say_yes) as client:
        handle = await tasks.start(client, "deploy", {"service": "web"})
        seen: list[str] = []
        async for state in handle.updates():
            seen.append(state.status)
            if state.status == "input_required":
                await handle.respond(state)  # the elicitation callback answers; tasks/update sends it
        return seen  # e.g. ["working", "input_required", "completed"]: a state that lasts a moment may be passed over


# --8<-- [end:follow-questions]


# --8<-- [start:cancel]
async def cancel(url: str) -> str:
    """Cancel a running task through its handle; the job sees ctx.cancelled() within a second."""
    tasks = TasksClient()
    async with Client(url, extensions=[tasks]) as client:
        handle = await tasks.start(client, "scan", {"paths": ["a", "b", "c", "d", "e", "f"]})
        await handle.cancel()
        return handle.status  # "cancelled"


# --8<-- [end:cancel]


# --8<-- [start:token]
async def call_with_token(url: str, token: str) -> str:
    """The transport's HTTP client sends the token with every request: the call, `tasks/get`, listen."""
    http = httpx2.AsyncClient(
        headers={"Authorization": f"Bearer {token}"},  # or auth=OAuthClientProvider(...) (mcp.client.auth)
        timeout=httpx2.Timeout(30, read=300),  # the SDK's own defaults: a listen stream stays open
    )
    async with http, Client(streamable_http_client(url, http_client=http), extensions=[TasksClient()]) as client:
        result = await client.call_tool("crunch", {"steps": 2})
        first = result.content[0]
        assert isinstance(first, TextContent)
        return first.text  # "Crunched 2 steps."


# --8<-- [end:token]


async def main(url: str) -> None:
    print(await call(url))
    print(await deploy(url))
    print("\n".join(await start_then_follow(url)))
    print(await follow_and_answer(url))
    print(await cancel(url))
    print(await call_with_token(url, "not checked by the guide app"))


if __name__ == "__main__":
    anyio.run(main, sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:8000/mcp")
