"""The lean listen entry (`mcp/listen_entry.py`) against the SDK's own, over real HTTP.

Two web processes of one app on one store and broker: `lean` (the default) and
`sdk` (MCP_TASKS_LISTEN_ENTRY=sdk). A valid 2026-07-28 listen must get the same
wire from both (ack, task notifications, pings, the final result); every request
the lean entry must not take must get exactly the SDK's answer. Both webs trace
to stdout, which tells who served a listen: the SDK's entry spans it, the lean
one does not.
"""

from __future__ import annotations

import copy
import json
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration.test_protocol_eras import LegacySession
from tests.mcp.listen_client import SUBSCRIPTION_ID, ListenStream
from tests.support import EXT, PROTOCOL, Backend, Deployment, McpHttp, Proc, wait_until

pytestmark = pytest.mark.integration

APP = "tests.apps.push_app"
TRACED = {"MCP_TASKS_TRACING": "console", "OTEL_BSP_SCHEDULE_DELAY": "100"}
SDK_ENTRY = {"MCP_TASKS_LISTEN_ENTRY": "sdk"}
ALICE = {"Authorization": "Bearer alice"}


@dataclass
class Pair:
    dep: Deployment
    lean: str
    sdk: str
    root: Path

    def proc(self, name: str) -> Proc:
        return next(proc for proc in self.dep.procs if proc.name == name)


@pytest.fixture(scope="module")
def pair(backend: Backend, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    root = tmp_path_factory.mktemp(f"listen-entry-{backend.name}")
    dep = Deployment(APP, backend, root)
    try:
        lean = dep.web("lean", **TRACED)
        sdk = dep.web("sdk", **TRACED, **SDK_ENTRY)
        dep.worker(concurrency=2)
        yield Pair(dep, lean, sdk, root)
    except BaseException:
        print(dep.logs())
        raise
    finally:
        dep.stop()


# -- raw exchanges -------------------------------------------------------------------------


def listen_body(
    request_id: Any = 9, capabilities: dict[str, Any] | None = None, **notifications: Any
) -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "id": request_id,
        "method": "subscriptions/listen",
        "params": {
            "notifications": notifications or {"toolsListChanged": True},
            "_meta": {
                "io.modelcontextprotocol/protocolVersion": PROTOCOL,
                "io.modelcontextprotocol/clientCapabilities": {"extensions": {EXT: {}}}
                if capabilities is None
                else capabilities,
            },
        },
    }


def listen_headers(**changes: str | None) -> list[tuple[str, str]]:
    headers = {
        "Accept": "application/json, text/event-stream",
        "Content-Type": "application/json",
        "MCP-Protocol-Version": PROTOCOL,
        "Mcp-Method": "subscriptions/listen",
        **ALICE,
    }
    for name, value in changes.items():
        name = name.replace("_", "-")
        headers = {k: v for k, v in headers.items() if k.lower() != name.lower()}
        if value is not None:
            headers[name] = value
    return list(headers.items())


def answer(url: str, body: Any, headers: list[tuple[str, str]]) -> dict[str, Any]:
    """Status, headers and body (or the first SSE message) of one POST, with the web's port taken out."""
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    with (
        httpx.Client(timeout=httpx.Timeout(10, read=20)) as client,
        client.stream("POST", url, content=content, headers=headers) as response,
    ):
        kept = {k: v for k, v in response.headers.items() if k not in ("date", "mcp-session-id")}
        got: dict[str, Any] = {"status": response.status_code, "headers": kept}
        if kept.get("content-type", "").startswith("text/event-stream"):
            got["first"] = next(json.loads(line[5:]) for line in response.iter_lines() if line.startswith("data:"))
        else:
            raw = response.read()
            got["body"] = json.loads(raw) if kept.get("content-type") == "application/json" else raw.decode()
    port = httpx.URL(url).port
    return json.loads(json.dumps(got).replace(f"127.0.0.1:{port}", "127.0.0.1:PORT"))  # type: ignore[no-any-return]


def listen_spans(proc: Proc) -> list[str]:
    """The request ids of the `subscriptions/listen` spans this web process exported (console tracing)."""
    ids = []
    for line in proc.text().splitlines():
        if '"subscriptions/listen"' not in line or not line.startswith("{"):
            continue
        attributes = json.loads(line).get("attributes", {})
        if attributes.get("mcp.method.name") == "subscriptions/listen":
            ids.append(attributes.get("jsonrpc.request.id"))
    return ids


def streams_gauge(url: str) -> float:
    text = httpx.get(url.replace("/mcp", "/metrics"), timeout=10).text
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith("mcp_tasks_listen_streams"))


# -- a valid listen: the same stream from both entries ---------------------------------------


def test_a_valid_listen_is_served_by_the_lean_entry_with_the_sdks_wire(pair: Pair) -> None:
    first = {
        name: answer(url, listen_body("same-wire"), listen_headers())
        for name, url in (("lean", pair.lean), ("sdk", pair.sdk))
    }
    assert first["lean"] == first["sdk"]
    assert first["lean"]["status"] == 200
    assert first["lean"]["first"]["method"] == "notifications/subscriptions/acknowledged"
    # Who served it: the SDK's entry spans a listen (at the stream's end), the lean entry does not.
    wait_until(lambda: "same-wire" in listen_spans(pair.proc("sdk")), 30, "the sdk entry's listen span")
    time.sleep(0.5)
    assert "same-wire" not in listen_spans(pair.proc("lean"))


def test_task_notifications_core_events_and_pings_match_the_sdk_entry(pair: Pair) -> None:
    gates = pair.root / "gates-flow"
    gates.mkdir()
    alice = McpHttp(pair.lean, headers=ALICE)
    sdk_alice = McpHttp(pair.sdk, headers=ALICE)
    streams: list[ListenStream] = []
    try:
        task_id = alice.create("gated_steps", {"gate_dir": str(gates)})
        wait_until(lambda: alice.get(task_id).get("statusMessage") == "at gate 1", 90, "the job at gate 1", 0.1)
        notifications = {"taskIds": [task_id, "unknown"], "toolsListChanged": True}
        lean, sdk = (ListenStream(url, notifications, token="alice", request_id=31) for url in (pair.lean, pair.sdk))
        streams += [lean, sdk]
        ack = lean.ack()
        assert ack == sdk.ack()
        assert ack["notifications"] == {"taskIds": [task_id], "toolsListChanged": True}

        for client in (alice, sdk_alice):  # the SDK's bus is per process: each web announces to its own streams
            assert "error" not in client.call_tool("announce", {"uri": "push://entry"})
        tools = lean.next()
        assert tools == sdk.next() and tools is not None
        assert tools["method"] == "notifications/tools/list_changed"

        for gate, message in (("1", "step 1"), ("2", "step 2")):
            (gates / gate).touch()
            sent = lean.task()
            assert sent == sdk.task()
            assert sent["taskId"] == task_id and sent["statusMessage"] == message
            assert sent["_meta"][SUBSCRIPTION_ID] == 31
        alice.task("tasks/cancel", task_id)
        cancelled = lean.task()
        assert cancelled == sdk.task() and cancelled["status"] == "cancelled"

        wait_until(lambda: lean.comments and sdk.comments, 60, "a keep-alive ping on both streams", 0.1)
        assert lean.comments[0] == sdk.comments[0] == ": ping"
        assert lean.messages.empty() and sdk.messages.empty()
    finally:
        for stream in streams:
            stream.close()
        alice.close()
        sdk_alice.close()


# -- what the lean entry must not take: exactly the SDK's answers --------------------------

_BASE = listen_body(21)


def _with(path: list[str], value: Any) -> dict[str, Any]:
    body = copy.deepcopy(_BASE)
    node: Any = body
    for key in path[:-1]:
        node = node[key]
    if value is _DROP:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return body


_DROP = object()
_META = ["params", "_meta"]

REFUSED: dict[str, tuple[Any, dict[str, str | None]]] = {
    "not-json": (b'{"jsonrpc": "2.0", "id": 21,', {}),
    "a-batch": ([_BASE], {}),
    "a-notification": (_with(["id"], _DROP), {}),
    "a-null-id": (_with(["id"], None), {}),
    "no-envelope": (_with(_META, _DROP), {}),
    "invalid-params": (_with(["params", "notifications"], {"toolsListChanged": "yes please"}), {}),
    "malformed-task-ids": (_with(["params", "notifications"], {"taskIds": "one"}), {}),
    "task-ids-without-the-extension": (listen_body(21, capabilities={}, taskIds=["x"]), {}),
    "version-header-mismatch": (_BASE, {"MCP-Protocol-Version": "2099-01-01"}),
    "unsupported-version": (
        _with([*_META, "io.modelcontextprotocol/protocolVersion"], "2099-01-01"),
        {"MCP-Protocol-Version": "2099-01-01"},
    ),
    "envelope-version-mismatch": (_with([*_META, "io.modelcontextprotocol/protocolVersion"], "2025-11-25"), {}),
    "method-header-mismatch": (_with(["method"], "tools/list"), {}),
    "no-method-header": (_BASE, {"Mcp-Method": None}),
    "sse-not-accepted": (_BASE, {"Accept": "application/json"}),
    "json-not-accepted": (_BASE, {"Accept": "text/event-stream"}),
    "wrong-content-type": (_BASE, {"Content-Type": "text/plain"}),
    "foreign-host": (_BASE, {"Host": "evil.example"}),
    "foreign-origin": (_BASE, {"Origin": "http://evil.example"}),
    "no-auth": (_BASE, {"Authorization": None}),
    "invalid-token": (_BASE, {"Authorization": "Bearer eve"}),
    "earlier-era-version-header": (_BASE, {"MCP-Protocol-Version": "2025-06-18"}),
    "unknown-session": (_BASE, {"MCP-Protocol-Version": "2025-11-25", "Mcp-Session-Id": "no-such-session"}),
    "body-too-large": (_with([*_META, "pad"], "x" * (4 * 1024 * 1024 + 1)), {}),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_what_the_lean_entry_must_not_take_gets_exactly_the_sdks_answer(pair: Pair, case: str) -> None:
    body, changes = REFUSED[case]
    lean, sdk = (answer(url, body, listen_headers(**changes)) for url in (pair.lean, pair.sdk))
    assert lean == sdk
    assert "first" not in lean, lean  # refused (or, a notification, acknowledged) before any stream opened


def test_a_handler_refusal_before_the_stream_opens_is_the_lean_entrys_own_answer_and_the_sdks(pair: Pair) -> None:
    """Valid on the wire, refused by our handler: the lean entry serves it (no SDK span) with the SDK's answer."""
    for request_id, body in (
        ("refused-ids", listen_body("refused-ids", taskIds="one")),
        ("refused-ext", listen_body("refused-ext", capabilities={}, taskIds=["x"])),
    ):
        lean, sdk = (answer(url, body, listen_headers()) for url in (pair.lean, pair.sdk))
        assert lean == sdk and lean["status"] == 400 and lean["body"]["id"] == request_id, lean
        wait_until(lambda r=request_id: r in listen_spans(pair.proc("sdk")), 30, "the sdk entry's span")
    time.sleep(0.5)
    assert not {"refused-ids", "refused-ext"} & set(listen_spans(pair.proc("lean")))


def test_a_doubled_routing_header_gets_the_sdks_answer(pair: Pair) -> None:
    headers = [*listen_headers(), ("Mcp-Method", "subscriptions/listen")]
    lean, sdk = (answer(url, _BASE, headers) for url in (pair.lean, pair.sdk))
    assert lean == sdk and lean["status"] == 400, lean


def test_a_listen_on_an_earlier_era_session_gets_the_sdks_answer(pair: Pair) -> None:
    answers = []
    for url in (pair.lean, pair.sdk):
        session = LegacySession(
            url, "2025-06-18", {"extensions": {EXT: {}}}, http=httpx.Client(timeout=30, headers=ALICE)
        )
        try:
            session.open()
            body = {"jsonrpc": "2.0", "id": 5, "method": "subscriptions/listen", "params": {"notifications": {}}}
            answers.append(
                answer(url, body, [*session.headers().items(), *ALICE.items(), ("Mcp-Method", "subscriptions/listen")])
            )
        finally:
            session.close()
    assert answers[0] == answers[1]


def test_a_valid_listen_too_large_for_the_lean_entry_is_served_by_the_sdks(pair: Pair) -> None:
    big = _with([*_META, "pad"], "x" * (300 * 1024)) | {"id": "big-body"}
    lean, sdk = (answer(url, big, listen_headers()) for url in (pair.lean, pair.sdk))
    assert lean == sdk and lean["first"]["method"] == "notifications/subscriptions/acknowledged"
    wait_until(lambda: "big-body" in listen_spans(pair.proc("lean")), 30, "the SDK entry's span on the lean web")


# -- the stream's end ----------------------------------------------------------------------


def test_a_client_disconnect_ends_the_lean_stream_and_frees_it(pair: Pair) -> None:
    wait_until(lambda: streams_gauge(pair.lean) == 0, 30, "no stream open on the lean web")
    streams = [
        ListenStream(pair.lean, {"toolsListChanged": True, "taskIds": []}, token="alice", request_id=n)
        for n in range(3)
    ]
    try:
        for stream in streams:
            stream.ack()
        assert streams_gauge(pair.lean) == 3
    finally:
        for stream in streams:
            stream.close()
    wait_until(lambda: streams_gauge(pair.lean) == 0, 15, "every disconnected stream freed")


def test_server_shutdown_ends_open_lean_streams_with_the_sdks_listen_result_promptly(pair: Pair) -> None:
    urls = {"lean-exit": pair.dep.web("lean-exit"), "sdk-exit": pair.dep.web("sdk-exit", **SDK_ENTRY)}
    streams = {
        name: [
            ListenStream(url, {"toolsListChanged": True, "taskIds": []}, token="alice", request_id=n) for n in (41, 42)
        ]
        for name, url in urls.items()
    }
    try:
        for opened in streams.values():
            for stream in opened:
                stream.ack()
        began = time.monotonic()
        for name in urls:
            pair.proc(name).popen.send_signal(signal.SIGTERM)
        finals: dict[str, list[Any]] = {}
        for name, opened in streams.items():
            finals[name] = [stream.next(timeout=15) for stream in opened]
            for stream in opened:
                assert stream.next(timeout=10) is None  # and then the stream ends
            # uvicorn re-raises the signal it handled once it has shut down cleanly
            assert pair.proc(name).popen.wait(timeout=30) in (0, -signal.SIGTERM)
        assert time.monotonic() - began < 10, "the lean streams held the shutdown up"
        assert finals["lean-exit"] == finals["sdk-exit"]
        for final, request_id in zip(finals["lean-exit"], (41, 42), strict=True):
            assert final is not None and final["id"] == request_id, final
            assert final["result"]["resultType"] == "complete"
            assert final["result"]["_meta"][SUBSCRIPTION_ID] == request_id
        for name in urls:
            assert "timeout graceful shutdown exceeded" not in pair.proc(name).text()
    finally:
        for opened in streams.values():
            for stream in opened:
                stream.close()
