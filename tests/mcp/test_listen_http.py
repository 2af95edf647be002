"""`subscriptions/listen` over real HTTP: validation before the stream, core events kept, clean exit."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.mcp.listen_client import SUBSCRIPTION_ID, ListenStream
from tests.support import EXT, Backend, Deployment, McpHttp, free_port, wait_until

pytestmark = pytest.mark.integration

APP = "tests.apps.push_app"


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    root = tmp_path_factory.mktemp("listen-http")
    with Deployment(APP, Backend("embedded", {"MCP_TASKS_DATA_DIR": str(root / "data")}), root) as dep:
        yield dep


@pytest.fixture(scope="module")
def metrics_port() -> int:
    """The web process's operations port: the Prometheus plugin's /metrics counts its open streams."""
    return free_port()


@pytest.fixture(scope="module")
def url(deployment: Deployment, metrics_port: int) -> str:
    return deployment.web("web", MCP_TASKS_METRICS="on", MCP_TASKS_OPS_PORT=str(metrics_port))


def _refused(url: str, notifications: dict[str, object], **kwargs: object) -> dict[str, object]:
    stream = ListenStream(url, notifications, token="alice", **kwargs)  # type: ignore[arg-type]
    try:
        assert stream.status == 400, stream.status
        assert stream.error_body is not None and stream.error_body["id"] == stream.request_id
        return stream.error_body["error"]  # type: ignore[return-value]
    finally:
        stream.close()


def test_task_ids_without_the_extension_on_the_request_are_refused_before_the_stream(url: str) -> None:
    error = _refused(url, {"taskIds": ["x"]}, capabilities={})
    assert error["code"] == -32021
    assert error["data"] == {"requiredCapabilities": {"extensions": {EXT: {}}}}


@pytest.mark.parametrize(
    "task_ids", ["one-id", [1, 2], {"a": 1}, ["x"] * 1001 + ["y"]], ids=["string", "numbers", "object", "too-many"]
)
def test_malformed_task_ids_are_invalid_params(url: str, task_ids: object) -> None:
    if isinstance(task_ids, list) and len(task_ids) > 1000:
        task_ids = [f"id-{n}" for n in range(1001)]
    assert _refused(url, {"taskIds": task_ids})["code"] == -32602


def test_core_subscriptions_still_work_beside_task_ids(url: str) -> None:
    stream = ListenStream(
        url,
        {
            "toolsListChanged": True,
            "resourceSubscriptions": ["push://a"],
            "promptsListChanged": False,
            "taskIds": ["unknown"],
        },
        token="alice",
    )
    try:
        assert stream.ack()["notifications"] == {
            "toolsListChanged": True,
            "resourceSubscriptions": ["push://a"],
            "taskIds": [],
        }
        client = McpHttp(url, headers={"Authorization": "Bearer alice"})
        assert "error" not in client.call_tool("announce", {"uri": "push://a"})
        client.close()
        tools = stream.next()
        updated = stream.next()
        assert tools is not None and tools["method"] == "notifications/tools/list_changed"
        assert tools["params"]["_meta"] == {SUBSCRIPTION_ID: stream.request_id}
        assert updated is not None and updated["method"] == "notifications/resources/updated"
        assert updated["params"]["uri"] == "push://a"
    finally:
        stream.close()


def test_a_core_listen_needs_no_extension(url: str) -> None:
    stream = ListenStream(url, {"promptsListChanged": True}, token="alice", capabilities={})
    try:
        assert stream.ack()["notifications"] == {"promptsListChanged": True}
    finally:
        stream.close()


def test_the_stream_sends_keep_alive_comments(url: str) -> None:
    """The transport pings after 15 s of silence once the stream is open (the ack opens it at once)."""
    stream = ListenStream(url, {"toolsListChanged": True}, token="alice")
    try:
        stream.ack()
        wait_until(lambda: stream.comments, 60, "a keep-alive comment", 0.1)
        assert stream.messages.empty()
    finally:
        stream.close()


def test_a_stream_ends_with_its_result_when_the_callers_token_expires(url: str) -> None:
    """A listen stream never outlives its credentials: a request with that token would get a 401 from then on."""
    stream = ListenStream(url, {"toolsListChanged": True}, token=f"alice@{int(time.time()) + 3}", request_id=7)
    lasting = ListenStream(url, {"toolsListChanged": True}, token="alice", request_id=8)
    try:
        stream.ack(), lasting.ack()
        final = stream.next(timeout=30)
        assert final is not None and final["id"] == 7 and final["result"]["resultType"] == "complete", final
        assert stream.next(timeout=10) is None  # and then the stream ends
        client = McpHttp(url, headers={"Authorization": "Bearer alice"})
        assert "error" not in client.call_tool("announce", {"uri": "push://a"})
        client.close()
        tools = lasting.next()  # a stream whose token does not expire stays open
        assert tools is not None and tools["method"] == "notifications/tools/list_changed"
    finally:
        stream.close()
        lasting.close()


def _open_streams(metrics_port: int) -> float:
    response = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10)
    response.raise_for_status()  # a 404 must not read as "no stream open"
    return sum(
        float(line.split()[-1]) for line in response.text.splitlines() if line.startswith("mcp_tasks_listen_streams")
    )


def test_a_client_disconnect_ends_the_stream_and_frees_it(url: str, metrics_port: int) -> None:
    wait_until(lambda: _open_streams(metrics_port) == 0, 30, "no stream open")
    streams = [
        ListenStream(url, {"toolsListChanged": True, "taskIds": []}, token="alice", request_id=n) for n in range(3)
    ]
    try:
        for stream in streams:
            stream.ack()
        assert _open_streams(metrics_port) == 3
    finally:
        for stream in streams:
            stream.close()
    wait_until(lambda: _open_streams(metrics_port) == 0, 15, "every disconnected stream freed")


def test_sigterm_ends_open_streams_with_their_result_and_the_server_exits(tmp_path: Path) -> None:
    dep = Deployment(APP, Backend("embedded", {"MCP_TASKS_DATA_DIR": str(tmp_path / "data")}), tmp_path)
    streams: list[ListenStream] = []
    try:
        url = dep.web("web")
        streams = [
            ListenStream(url, {"toolsListChanged": True, "taskIds": []}, token="alice", request_id=n) for n in (41, 42)
        ]
        for stream in streams:
            stream.ack()
        web = dep.procs[0]
        web.popen.send_signal(signal.SIGTERM)
        # uvicorn re-raises the signal it handled once it has shut down cleanly
        assert web.popen.wait(timeout=30) in (0, -signal.SIGTERM)
        for stream in streams:
            final = stream.next(timeout=10)
            assert final is not None and final["id"] == stream.request_id, final
            assert final["result"]["resultType"] == "complete"
            assert final["result"]["_meta"][SUBSCRIPTION_ID] == stream.request_id
            assert stream.next(timeout=10) is None  # and then the stream ends
        assert "timeout graceful shutdown exceeded" not in web.text()
    finally:
        for stream in streams:
            stream.close()
        dep.stop()


def test_a_callers_streams_beyond_its_quota_are_refused_over_http(deployment: Deployment) -> None:
    """`MCP_TASKS_QUOTA_STREAMS=1`: alice's second listen is answered with -32029 (naming no one) instead of an
    ack; mallory's opens; alice's closed stream frees her slot."""
    url = deployment.web("capped", MCP_TASKS_QUOTA_STREAMS="1")
    first = ListenStream(url, {"toolsListChanged": True}, token="alice", request_id=1)
    try:
        first.ack()
        second = ListenStream(url, {"toolsListChanged": True}, token="alice", request_id=4)
        try:  # answered with the refusal alone (a JSON response, no stream): no ack, no notification
            answer = second.error_body
            assert (second.status, second.next()) == (200, None) and answer is not None, second.status
            assert answer["id"] == 4 and "result" not in answer, answer
            error = answer["error"]
            assert error["code"] == -32029 and "alice" not in str(error)
            assert error["data"] == {"limit": "streams", "allowed": 1, "retryAfterMs": None}
        finally:
            second.close()
        others = ListenStream(url, {"toolsListChanged": True}, token="mallory", request_id=2)
        try:
            others.ack()
        finally:
            others.close()
    finally:
        first.close()
    again = wait_until(lambda: _opened(url), 15, "alice's slot freed by her closed stream")
    again.close()


def _opened(url: str) -> ListenStream | None:
    stream = ListenStream(url, {"toolsListChanged": True}, token="alice", request_id=3)
    first = stream.next()
    if first is not None and first.get("method") == "notifications/subscriptions/acknowledged":
        return stream
    stream.close()
    return None
