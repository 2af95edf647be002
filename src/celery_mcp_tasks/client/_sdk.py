"""Every private part of the SDK's client that the tasks client uses, in one place.

mcp 2.3's public `listen()` cannot name `taskIds`, so this opens the same stream with the Tasks filter, as the
SDK's own driver does (route registered before the request is written, acknowledgment awaited, the stream
ended by cancelling the request). tests/client/test_sdk_contract.py pins each attribute used here.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from itertools import count
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc
from mcp.shared.dispatcher import CallOptions
from mcp.shared.exceptions import MCPError
from mcp_types import INTERNAL_ERROR, SubscriptionFilter

if TYPE_CHECKING:
    from mcp.client.session import ClientSession

SDK_VERSIONS = ("2.3",)
"""The SDK releases whose internals this module was checked against (mcp>=2.3,<2.4)."""

_ids = count(1)
_END_TIMEOUT_S = 2.0  # ending a stream is local (abandon the request): it takes a few loop iterations


class ListenClosed(Exception):
    """The listen stream ended (gracefully or not); the caller re-opens or polls."""


class TaskStream:
    """One open listen stream following some tasks: what the server honoured, and how it ended."""

    def __init__(self, route: Any, honored: SubscriptionFilter) -> None:
        self._route = route
        self.honored = honored

    @property
    def task_ids(self) -> list[str] | None:
        """The `taskIds` the server agreed to follow (None: it does not follow tasks on listen)."""
        ids = (self.honored.model_extra or {}).get("taskIds")
        return list(ids) if isinstance(ids, list) else None

    @property
    def ended(self) -> bool:
        return self._route.end is not None

    async def wait_closed(self) -> None:
        """Return when the stream has ended, for whatever reason."""
        while self._route.end is None:
            outcome = await self._route.next_event()  # core events are not ours: drop them
            if isinstance(outcome, str):
                return
            self._route.consume(outcome)


def task_group(session: ClientSession) -> anyio.abc.TaskGroup:
    """The session's own task group: background work that lives exactly as long as the connection."""
    group = session._task_group  # pyright: ignore[reportPrivateUsage]
    if group is None:
        raise RuntimeError("the client session is not entered")
    return group


@asynccontextmanager
async def listen_tasks(session: ClientSession, task_ids: list[str], ack_timeout: float) -> AsyncIterator[TaskStream]:
    """`subscriptions/listen` with `{"taskIds": [...]}`; yields once acknowledged, ends the stream on exit.

    Raises `MCPError` when the server refuses the request, `ListenClosed` when the
    stream ends before its acknowledgment, `TimeoutError` past `ack_timeout`.
    """
    request_id = f"tasks-listen-{next(_ids)}"
    data: dict[str, Any] = {"method": "subscriptions/listen", "params": {"notifications": {"taskIds": task_ids}}}
    opts: CallOptions = {"request_id": request_id}
    session._stamp(data, opts)  # pyright: ignore[reportPrivateUsage]
    scope = anyio.CancelScope()
    route = session._register_listen_route(request_id)  # pyright: ignore[reportPrivateUsage]
    dispatcher = session._dispatcher  # pyright: ignore[reportPrivateUsage]

    driven = anyio.Event()

    async def drive() -> None:
        try:
            with scope:
                try:
                    await dispatcher.send_raw_request(data["method"], data["params"], opts)
                except MCPError as error:
                    route.settle("lost", error=error)
                    return
                except ValueError as error:  # an id collision: fail this stream only
                    route.settle("lost", error=MCPError(INTERNAL_ERROR, str(error)))
                    return
                route.set_acked(SubscriptionFilter())
                route.settle("graceful")
        finally:
            driven.set()

    try:
        task_group(session).start_soon(drive)
        with anyio.fail_after(ack_timeout):
            await route.acked.wait()
        if route.honored is None:
            if route.error is not None:
                raise route.error
            raise ListenClosed("the listen stream ended before it was acknowledged")
        yield TaskStream(route, route.honored)
    finally:
        route.settle("local")
        scope.cancel()
        # Wait until the request is abandoned, so the transport aborts the stream's POST before the session
        # can close under it (the SDK logs a traceback for a notification on a POST left open then).
        # Shielded: the stream ends the same way when its owner is cancelled.
        with anyio.CancelScope(shield=True), anyio.move_on_after(_END_TIMEOUT_S):
            await driven.wait()
        session._unregister_listen_route(request_id)  # pyright: ignore[reportPrivateUsage]
