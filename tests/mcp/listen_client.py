"""A `subscriptions/listen` client for tests: one SSE stream read by a thread into a queue."""

from __future__ import annotations

import json
import queue
import socket
import threading
from typing import Any

import httpx

from tests.support import EXT, PROTOCOL

SUBSCRIPTION_ID = "io.modelcontextprotocol/subscriptionId"


class ListenStream:
    """Opens the stream at once; `next()` returns the JSON-RPC messages in order, `comments` the SSE comments."""

    def __init__(
        self,
        url: str,
        notifications: dict[str, Any],
        *,
        request_id: int | str = 9,
        token: str | None = None,
        capabilities: dict[str, Any] | None = None,
    ) -> None:
        self.request_id = request_id
        self.messages: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self.comments: list[str] = []
        self.status: int | None = None
        self.error_body: dict[str, Any] | None = None
        self._opened = threading.Event()
        self._response: httpx.Response | None = None
        headers = {
            "Accept": "application/json, text/event-stream",
            "MCP-Protocol-Version": PROTOCOL,
            "Mcp-Method": "subscriptions/listen",
            "Content-Type": "application/json",
        }
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        caps = {"extensions": {EXT: {}}} if capabilities is None else capabilities
        body = {
            "jsonrpc": "2.0",
            "id": request_id,
            "method": "subscriptions/listen",
            "params": {
                "notifications": notifications,
                "_meta": {
                    "io.modelcontextprotocol/protocolVersion": PROTOCOL,
                    "io.modelcontextprotocol/clientCapabilities": caps,
                },
            },
        }
        self._client = httpx.Client(timeout=httpx.Timeout(10, read=None))
        self._thread = threading.Thread(target=self._read, args=(url, headers, body), daemon=True)
        self._thread.start()
        if not self._opened.wait(30):
            raise TimeoutError("listen stream did not open")

    def _read(self, url: str, headers: dict[str, str], body: dict[str, Any]) -> None:
        try:
            with self._client.stream("POST", url, content=json.dumps(body), headers=headers) as response:
                self._response = response
                self.status = response.status_code
                if not response.headers.get("content-type", "").startswith("text/event-stream"):
                    self.error_body = json.loads(response.read() or b"null")
                    self._opened.set()
                    return
                self._opened.set()
                for line in response.iter_lines():
                    if line.startswith("data:"):
                        self.messages.put(json.loads(line[5:]))
                    elif line.startswith(":"):
                        self.comments.append(line)
        except (httpx.HTTPError, RuntimeError):
            pass
        finally:
            self._opened.set()
            self.messages.put(None)  # end of stream

    def next(self, timeout: float = 60) -> dict[str, Any] | None:
        """The next message, or None once the stream has ended."""
        return self.messages.get(timeout=timeout)

    def ack(self) -> dict[str, Any]:
        message = self.next()
        assert message is not None, "stream ended before its acknowledgment"
        assert message["method"] == "notifications/subscriptions/acknowledged", message
        return message["params"]

    def task(self, timeout: float = 60) -> dict[str, Any]:
        """The next message, which must be a `notifications/tasks`; returns its params."""
        message = self.next(timeout)
        assert message is not None, "stream ended"
        assert message.get("method") == "notifications/tasks", message
        return message["params"]

    def close(self) -> None:
        """End the stream from this side at once: the reader, blocked on the socket, sees it closed.

        Closing the client alone does not wake a thread blocked reading (it waited out the join).
        """
        response = self._response
        stream = response.extensions.get("network_stream") if response is not None else None
        sock = stream.get_extra_info("socket") if stream is not None else None
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # already closed by the server
        self._client.close()
        self._thread.join(10)
