"""Every place this package reaches past the SDK's public API, in one module (pinned: mcp 2.3.x).

Each names the private thing it uses and the public hook that would remove the need;
`tests/test_sdk_internals.py` fails, naming the SDK version, as soon as one of them moves.
The server adapter (`mcp/`) uses 1-5, the client (`client/`) 6; neither imports the other. (What the
server relies on of uvicorn, the web server the SDK's app runs on, is in `uvicorn_internals`.)

1. `tool_registered`: `MCPServer._tool_manager` (`list_tools()` is async). A public
   `MCPServer.get_tool(name)` or a strict-duplicates option on `add_tool` would remove it.
2. `replace_listen_handler`: `MCPServer._lowlevel_server`, to swap the stock `subscriptions/listen`
   handler (it drops `taskIds`) for ours. A public `MCPServer(listen_handler=...)`, or an `Extension`
   allowed to claim a core method, would remove it.
3. `wrap_lifespan`: reassigns the `router.lifespan_context` that `streamable_http_app()` built, to run
   our listener beside the SDK's session manager. A `lifespan=` parameter there would remove it.
4. `sealed_elsewhere`: the message ("unknown key") of the SDK's `InvalidRequestState` for a state sealed
   under a key this codec does not hold, to tell another replica's state from a forged or expired one.
   A distinct exception type (or a `reason` attribute) would remove it.
5. `decode_routing_name`: not a private part but a fault of the public `decode_header_value`, which raises
   for a base64 `Mcp-Name` (or `Mcp-Param-*`) holding a non-ASCII character where it should answer None
   (malformed). `celery_mcp_tasks.mcp.serving.MalformedRoutingName` refuses such a request before the SDK
   reads it. A fix in the SDK would remove both.
6. `listen_tasks`: `ClientSession._stamp`, `_register_listen_route`, `_dispatcher`, `_task_group` and
   `_unregister_listen_route`, because mcp 2.3's public `listen()` cannot name `taskIds`: it opens the same
   stream with the Tasks filter as the SDK's own driver does (route registered before the request is
   written, acknowledgment awaited, the stream ended by cancelling the request). A `listen(filter=...)`
   taking extension fields would remove it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from itertools import count
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc
from mcp.shared.dispatcher import CallOptions
from mcp.shared.exceptions import MCPError
from mcp.shared.inbound import decode_header_value
from mcp_types import INTERNAL_ERROR, SubscriptionFilter

if TYPE_CHECKING:
    from mcp.client.session import ClientSession
    from mcp.server.mcpserver import MCPServer

VERSIONS = ("2.3",)
"""The SDK releases whose internals this module was checked against (mcp>=2.3,<2.4)."""

LISTEN = "subscriptions/listen"

Lifespan = Callable[[Any], AbstractAsyncContextManager[Any]]


def tool_registered(server: MCPServer[Any], name: str) -> bool:
    """Whether `server` already has a tool called `name` (any kind)."""
    return server._tool_manager.get_tool(name) is not None


def replace_listen_handler(server: MCPServer[Any], params_type: type, handler: Any) -> bool:
    """Serve `subscriptions/listen` with `handler`; False when the server does not serve listen at all."""
    lowlevel = server._lowlevel_server
    if lowlevel.get_request_handler(LISTEN) is None:
        return False  # built with subscriptions=False: leave listen unserved
    lowlevel.add_request_handler(LISTEN, params_type, handler)
    return True


def decode_routing_name(raw: str) -> str | None:
    """An `Mcp-Name` header's value as the SDK decodes it (its `=?base64?...?=` form included); None when it is
    malformed, as the SDK documents. mcp 2.3's `decode_header_value` raises `ValueError` instead for a base64
    form holding a non-ASCII character (so a `tools/call` carrying one got a 500): fixed there, this goes."""
    try:
        return decode_header_value(raw.strip(" \t"))
    except ValueError:
        return None


def sealed_elsewhere(error: Exception) -> bool:
    """Whether the SDK's codec refused a request state because another key sealed it."""
    return str(error) == "unknown key"


def wrap_lifespan(app: Any, wrap: Callable[[Lifespan], Lifespan]) -> None:
    """Replace the Starlette app's lifespan with `wrap(current lifespan)`."""
    app.router.lifespan_context = wrap(app.router.lifespan_context)


# -- the client (6) ---------------------------------------------------------------------------

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
