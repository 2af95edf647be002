"""Contract tests for every SDK internal this package uses (`celery_mcp_tasks.sdk_internals`): the server's and
the client's.

Each fails with the installed SDK's version in its message the day the internal moves.
"""

from __future__ import annotations

import importlib.metadata
import inspect
from typing import Any

import pytest
from mcp.client.session import ClientSession
from mcp.client.subscriptions import ListenRoute
from mcp.server.mcpserver import MCPServer
from mcp_types import (
    SubscriptionsListenRequestParams,
)

from celery_mcp_tasks import sdk_internals

SDK = importlib.metadata.version("mcp")
WHERE = f"mcp {SDK}: an SDK internal moved; update celery_mcp_tasks/sdk_internals.py"


def test_the_tool_manager_answers_by_name() -> None:
    server: MCPServer[Any] = MCPServer("contract")
    assert hasattr(server, "_tool_manager") and callable(getattr(server._tool_manager, "get_tool", None)), WHERE

    @server.tool()
    def present() -> str:
        return "here"

    assert sdk_internals.tool_registered(server, "present"), WHERE
    assert not sdk_internals.tool_registered(server, "absent"), WHERE


def test_the_listen_handler_can_be_replaced_on_the_lowlevel_server() -> None:
    server: MCPServer[Any] = MCPServer("contract")
    lowlevel = getattr(server, "_lowlevel_server", None)
    assert lowlevel is not None and callable(getattr(lowlevel, "get_request_handler", None)), WHERE
    assert lowlevel.get_request_handler(sdk_internals.LISTEN) is not None, f"{WHERE} (no stock listen handler)"

    async def ours(ctx: Any, params: Any) -> Any:
        return None

    assert sdk_internals.replace_listen_handler(server, SubscriptionsListenRequestParams, ours), WHERE
    assert lowlevel.get_request_handler(sdk_internals.LISTEN) is not None, WHERE
    assert not sdk_internals.replace_listen_handler(
        MCPServer("off", subscriptions=False), SubscriptionsListenRequestParams, ours
    ), WHERE


def test_the_http_app_has_a_lifespan_to_wrap() -> None:
    app = MCPServer("contract").streamable_http_app()
    original = app.router.lifespan_context
    assert callable(original), WHERE
    seen: list[Any] = []
    sdk_internals.wrap_lifespan(app, lambda inner: seen.append(inner) or inner)
    assert seen == [original] and app.router.lifespan_context is original, WHERE


def test_a_state_sealed_under_another_key_is_refused_as_an_unknown_key() -> None:
    import os

    import pytest
    from mcp.server.request_state import AESGCMRequestStateCodec, InvalidRequestState

    sealed = AESGCMRequestStateCodec([os.urandom(32)]).seal(b"state")
    with pytest.raises(InvalidRequestState) as foreign:
        AESGCMRequestStateCodec([os.urandom(32)]).unseal(sealed)
    assert sdk_internals.sealed_elsewhere(foreign.value), f"{WHERE} (refused as {foreign.value!r})"
    with pytest.raises(InvalidRequestState) as garbage:
        AESGCMRequestStateCodec([os.urandom(32)]).unseal("garbage")
    assert not sdk_internals.sealed_elsewhere(garbage.value), WHERE


def test_the_sdk_release_is_one_this_module_was_checked_against():
    assert SDK.rsplit(".", 1)[0] in sdk_internals.VERSIONS, WHERE


def test_the_session_internals_used_to_open_a_listen_stream_exist():
    source = inspect.getsource(ClientSession)
    for name in ("self._task_group", "self._dispatcher", "self._stamp"):
        assert name in source, f"mcp {SDK}: ClientSession no longer has {name}"
    for method in ("_register_listen_route", "_unregister_listen_route"):
        assert callable(getattr(ClientSession, method, None)), f"mcp {SDK}: ClientSession.{method} is gone"
    assert list(inspect.signature(ClientSession._register_listen_route).parameters) == ["self", "request_id"]


def test_the_listen_route_keeps_its_shape():
    route = ListenRoute()
    for name in ("acked", "honored", "error", "end"):
        assert hasattr(route, name), f"mcp {SDK}: ListenRoute.{name} is gone"
    for method in ("set_acked", "settle", "next_event", "consume"):
        assert callable(getattr(route, method, None)), f"mcp {SDK}: ListenRoute.{method} is gone"
    route.settle("local")
    assert route.end == "local" and route.acked.is_set()


def test_the_acknowledged_filter_keeps_the_task_ids_it_was_not_built_for():
    """`taskIds` is not a core field: the SDK's filter model must keep it (extra='allow')."""
    from mcp_types import SubscriptionFilter

    honored = SubscriptionFilter.model_validate({"taskIds": ["a", "b"]})
    stream = sdk_internals.TaskStream(ListenRoute(), honored)
    assert stream.task_ids == ["a", "b"]
    assert sdk_internals.TaskStream(ListenRoute(), SubscriptionFilter()).task_ids is None


def test_the_decoder_still_raises_for_a_non_ascii_base64_name() -> None:
    """When this fails the SDK answers None (malformed) itself: `decode_routing_name` and the serving guard can go."""
    from mcp.shared.inbound import decode_header_value

    with pytest.raises(ValueError, match="ASCII"):
        decode_header_value("=?base64?\u00e9?=")
    assert sdk_internals.decode_routing_name("=?base64?\u00e9?=") is None
    assert sdk_internals.decode_routing_name(" =?base64?dGFzaw==?=\t") == "task"
