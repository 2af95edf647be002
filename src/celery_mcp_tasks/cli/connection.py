"""The connection to the server: the SDK's `Client` over Streamable HTTP, and the task it starts or attaches to.

Whatever goes wrong on the way (refused token, server unreachable, an MCP error)
becomes one `CallError` line.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from mcp.shared.exceptions import MCPError

from celery_mcp_tasks.cli.outcome import CallError
from celery_mcp_tasks.cli.prompts import Prompter
from celery_mcp_tasks.client import TaskHandle, TaskNotFound, TasksClient

if TYPE_CHECKING:
    from mcp.client.client import Client

__all__ = ["CallOptions", "connect", "open_task"]


@dataclass(frozen=True)
class CallOptions:
    """What `celery-mcp-tasks call` was given: where to connect, what to start or attach to, how to show it."""

    url: str
    tool: str | None = None
    arguments: str | None = None  # the JSON text as typed
    resume: str | None = None  # a task id to attach to instead of calling a tool
    token: str | None = None  # bearer token (None: $MCP_TASKS_TOKEN)
    json_output: bool = False
    no_wait: bool = False
    timeout: float | None = None  # seconds to wait for the end; None: as long as it runs


@asynccontextmanager
async def connect(options: CallOptions, tasks: TasksClient, prompter: Prompter) -> AsyncIterator[Client]:
    """The SDK's `Client` over Streamable HTTP, with the bearer token (if any) on every request."""
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    token = options.token if options.token is not None else os.environ.get("MCP_TASKS_TOKEN")
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    refused: list[int] = []

    async def note_refusal(response: httpx2.Response) -> None:
        if response.status_code in (401, 403):
            refused.append(response.status_code)

    http = httpx2.AsyncClient(
        headers=headers,
        timeout=httpx2.Timeout(30, read=300),  # the SDK's own defaults: a response stream may stay open
        event_hooks={"response": [note_refusal]},
    )
    try:
        async with http:
            client = Client(
                streamable_http_client(options.url, http_client=http),
                extensions=[tasks],
                elicitation_callback=prompter.elicit,
                sampling_callback=prompter.sample,
                list_roots_callback=prompter.roots,
            )
            async with client:
                yield client
    except Exception as exc:  # noqa: BLE001 - an ExceptionGroup from the SDK's task groups, or one error: one line
        raise _one_line(exc, options, refused, bool(token)) from None


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in _leaves(inner)]
    return [exc]


def _one_line(exc: BaseException, options: CallOptions, refused: Sequence[int], has_token: bool) -> BaseException:
    """Whatever escaped the connection, as the one line a person needs (or itself, when it is not ours)."""
    import httpx2

    leaves = _leaves(exc)
    for leaf in leaves:
        if isinstance(leaf, CallError):
            return leaf
    if refused:
        if has_token:
            return CallError(f"the server refused the token (HTTP {refused[-1]})")
        return CallError(f"the server requires a token (HTTP {refused[-1]}): pass --token or set MCP_TASKS_TOKEN")
    for leaf in leaves:
        if isinstance(leaf, httpx2.TransportError | OSError):
            return CallError(f"cannot reach {options.url}: {type(leaf).__name__}")
        if isinstance(leaf, httpx2.HTTPError):
            return CallError(f"HTTP error talking to {options.url}: {type(leaf).__name__}")
        if isinstance(leaf, MCPError):
            return CallError(f"{options.url}: {leaf.message}")
    if isinstance(exc, BaseExceptionGroup) and len(leaves) == 1:
        return leaves[0]
    return exc


async def open_task(
    options: CallOptions, arguments: dict[str, Any], tasks: TasksClient, client: Client
) -> TaskHandle | None:
    try:
        if options.resume is not None:
            return await tasks.attach(client, options.resume)
        assert options.tool is not None
        return await tasks.start(client, options.tool, arguments)
    except TaskNotFound:
        raise CallError("no such task: it expired, or it belongs to another user") from None
    except MCPError as exc:
        raise CallError(exc.message) from None
