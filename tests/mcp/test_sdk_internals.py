"""Contract tests for every SDK internal this package uses (`celery_mcp_tasks.mcp.sdk_internals`).

Each fails with the installed SDK's version in its message the day the internal moves.
"""

from __future__ import annotations

import importlib.metadata
import inspect
import json
from typing import Any

import pytest
import uvicorn
from mcp.server import streamable_http_manager
from mcp.server._otel import OpenTelemetryMiddleware
from mcp.server.connection import Connection
from mcp.server.mcpserver import MCPServer
from mcp.server.request_state import RequestStateBoundary
from mcp.server.runner import ServerRunner
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import RequestBodyLimitMiddleware, TransportSecuritySettings
from mcp.shared.exceptions import MCPError
from mcp.shared.inbound import ERROR_CODE_HTTP_STATUS, InboundModernRoute
from mcp_types import (
    ErrorData,
    JSONRPCError,
    JSONRPCNotification,
    SubscriptionsListenRequestParams,
    SubscriptionsListenResult,
)
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS
from pydantic import ValidationError
from starlette.requests import Request

from celery_mcp_tasks.mcp import listen_entry, sdk_internals

SDK = importlib.metadata.version("mcp")
WHERE = f"mcp {SDK}: an SDK internal moved; update celery_mcp_tasks/mcp/sdk_internals.py"


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


def test_uvicorn_installs_the_exit_handler_that_on_server_exit_chains_onto() -> None:
    server = uvicorn.Server(uvicorn.Config(app=None))
    assert callable(getattr(server, "handle_exit", None)), f"uvicorn {uvicorn.__version__}: handle_exit moved"
    assert callable(getattr(server, "capture_signals", None)), f"uvicorn {uvicorn.__version__}: capture_signals moved"


# -- the lean listen entry (sdk_internals items 5+, mcp/listen_entry.py) -------------------

LISTEN_BODY: dict[str, Any] = {
    "jsonrpc": "2.0",
    "id": 7,
    "method": sdk_internals.LISTEN,
    "params": {
        "notifications": {"toolsListChanged": True},
        "_meta": {
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {"extensions": {"io.modelcontextprotocol/tasks": {}}},
        },
    },
}


def _request(**headers: str) -> Request:
    raw = [(name.replace("_", "-").lower().encode(), value.encode()) for name, value in headers.items()]
    return Request({"type": "http", "method": "POST", "path": "/mcp", "headers": raw, "query_string": b""})


def _listen_headers(**extra: str) -> dict[str, str]:
    return {
        "accept": "application/json, text/event-stream",
        "content_type": "application/json",
        "mcp_protocol_version": "2026-07-28",
        "mcp_method": sdk_internals.LISTEN,
        **extra,
    }


def test_the_session_managers_http_entry_sits_inside_its_body_limit_and_can_be_wrapped() -> None:
    server: MCPServer[Any] = MCPServer("contract")
    assert not sdk_internals.wrap_modern_entry(server, lambda app, security: app), f"{WHERE} (a manager before the app)"
    server.streamable_http_app()
    manager = getattr(server._lowlevel_server, "_session_manager", None)
    assert isinstance(manager, StreamableHTTPSessionManager), WHERE
    assert isinstance(manager.asgi_app, RequestBodyLimitMiddleware), WHERE
    entry = manager.asgi_app.app
    assert entry == manager._handle_request, f"{WHERE} (the body limit no longer wraps `_handle_request`)"
    seen: list[Any] = []

    def wrap(app: Any, security: Any) -> Any:
        seen.append((app, security))
        return app

    assert sdk_internals.wrap_modern_entry(server, wrap), WHERE
    assert seen == [(entry, manager.security_settings)], WHERE
    assert isinstance(manager.security_settings, TransportSecuritySettings | None), WHERE


def test_the_modern_entry_is_what_the_manager_routes_every_non_handshake_version_to() -> None:
    """The lean entry decides "modern" as the manager does: any version header not in the handshake list."""
    assert streamable_http_manager.HANDSHAKE_PROTOCOL_VERSIONS is HANDSHAKE_PROTOCOL_VERSIONS, WHERE
    assert callable(getattr(streamable_http_manager, "handle_modern_request", None)), WHERE
    assert sdk_internals.modern_version("2026-07-28"), WHERE
    assert sdk_internals.modern_version("2099-01-01"), WHERE  # unknown: the modern ladder rejects it
    for version in ("2025-06-18", "2025-11-25"):
        assert not sdk_internals.modern_version(version), WHERE
    source = inspect.getsource(StreamableHTTPSessionManager._handle_request)
    assert "not in HANDSHAKE_PROTOCOL_VERSIONS" in source and "handle_modern_request" in source, WHERE


def test_the_default_server_middleware_is_exactly_the_pair_the_lean_entry_may_skip() -> None:
    server: MCPServer[Any] = MCPServer("contract")
    kinds = [type(m) for m in server._lowlevel_server.middleware]
    assert kinds == [OpenTelemetryMiddleware, RequestStateBoundary], f"{WHERE} (default middleware {kinds})"
    assert sdk_internals.plain_server_middleware(server), WHERE

    async def custom(ctx: Any, call_next: Any) -> Any:
        return await call_next(ctx)

    server._lowlevel_server.middleware.append(custom)
    assert not sdk_internals.plain_server_middleware(server), WHERE


def test_accept_headers_are_read_by_the_sdks_own_check() -> None:
    assert sdk_internals.accepts(_request(accept="application/json, text/event-stream")) == (True, True), WHERE
    assert sdk_internals.accepts(_request(accept="application/json")) == (True, False), WHERE
    assert sdk_internals.accepts(_request(accept="text/event-stream")) == (False, True), WHERE


def test_the_modern_ladder_routes_a_valid_listen_and_rejects_what_the_sdk_rejects() -> None:
    verdict = sdk_internals.modern_route(LISTEN_BODY, _request(**_listen_headers()))
    assert isinstance(verdict, InboundModernRoute), WHERE
    assert verdict.protocol_version == "2026-07-28", WHERE
    assert verdict.client_capabilities == {"extensions": {"io.modelcontextprotocol/tasks": {}}}, WHERE
    assert sdk_internals.modern_route(LISTEN_BODY, _request(**_listen_headers(mcp_method="tools/list"))) is None
    assert (
        sdk_internals.modern_route(LISTEN_BODY, _request(**_listen_headers(mcp_protocol_version="2099-01-01"))) is None
    )
    doubled = _request(**_listen_headers())
    doubled.scope["headers"].append((b"mcp-method", sdk_internals.LISTEN.encode()))
    assert sdk_internals.modern_route(LISTEN_BODY, Request(doubled.scope)) is None, f"{WHERE} (duplicated header)"


def test_listen_params_are_validated_per_version_as_the_kernel_does() -> None:
    sdk_internals.validate_listen("2026-07-28", LISTEN_BODY["params"])
    with pytest.raises(ValidationError):
        sdk_internals.validate_listen(
            "2026-07-28", {**LISTEN_BODY["params"], "notifications": {"toolsListChanged": "x"}}
        )
    with pytest.raises(KeyError):  # the kernel's "method not found at this version"
        sdk_internals.validate_listen("2025-06-18", LISTEN_BODY["params"])
    kernel = inspect.getsource(ServerRunner._on_request)
    assert "validate_client_request" in kernel and "by_name=False" in kernel, WHERE


def test_handler_errors_map_to_the_wire_as_the_modern_entry_maps_them() -> None:
    refused = MCPError(-32021, "missing capability", {"requiredCapabilities": {}})
    assert sdk_internals.error_data(refused) == refused.error, WHERE
    hidden = sdk_internals.error_data(RuntimeError("internal detail"))
    assert hidden.code == -32603 and "internal detail" not in hidden.message, WHERE


def test_the_listen_result_is_shaped_by_the_runner_with_the_server_info_stamp() -> None:
    server: MCPServer[Any] = MCPServer("contract")
    assert callable(getattr(ServerRunner, "_serialize", None)), WHERE
    assert callable(getattr(Connection, "from_envelope", None)), WHERE
    meta = {"io.modelcontextprotocol/subscriptionId": 7}
    shaped = sdk_internals.listen_result(server, "2026-07-28", None, SubscriptionsListenResult(_meta=meta))
    assert shaped["resultType"] == "complete", WHERE
    assert shaped["_meta"]["io.modelcontextprotocol/subscriptionId"] == 7, WHERE
    assert shaped["_meta"]["io.modelcontextprotocol/serverInfo"] == server._lowlevel_server.server_info_stamp, WHERE


async def _asgi_answer(app: Any) -> tuple[int, dict[str, Any]]:
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app({"type": "http", "method": "POST", "headers": []}, receive, send)
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return sent[0]["status"], json.loads(body)


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_an_early_error_is_written_as_the_modern_entry_writes_it(anyio_backend: str) -> None:
    from mcp.server import _streamable_http_modern as modern

    for code in (-32602, -32601, -32603):
        error = JSONRPCError(jsonrpc="2.0", id=7, error=ErrorData(code=code, message="no"))
        ours = await _asgi_answer(lambda s, r, w, e=error: sdk_internals.write_json(e, s, r, w))
        theirs = await _asgi_answer(lambda s, r, w, e=error: modern._write(e, s, r, w))
        assert ours == theirs, f"{WHERE} (error {code}: {ours} != {theirs})"
        assert ours[0] == ERROR_CODE_HTTP_STATUS.get(code, 200), WHERE


def test_the_sse_framing_the_lean_entry_copies_is_still_the_sdks() -> None:
    from mcp.server import _streamable_http_modern as modern

    assert modern._SSE_PING_INTERVAL == listen_entry.PING_INTERVAL_S, WHERE
    assert modern._SSE_HEADERS == listen_entry._SSE_HEADERS, WHERE
    message = JSONRPCNotification(jsonrpc="2.0", method="notifications/tasks", params={"taskId": "t", "n": [1]})
    assert listen_entry._event(message) == modern._sse_event(message), WHERE
    assert 'b": ping\\r\\n\\r\\n"' in inspect.getsource(modern.handle_modern_request), WHERE
    assert streamable_http_manager.DEFAULT_MAX_REQUEST_BODY_SIZE >= listen_entry.MAX_BODY, WHERE
