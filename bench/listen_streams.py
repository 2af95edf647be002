"""`bench/bench_task.py --streams N`: N open listen streams on one web process.

N `subscriptions/listen` streams, all following one task, on one web process; a
progress write (as a worker makes it) must reach every one. Measured: the process's
RSS idle, with the streams open and after the change, and the time from the write
until the last stream heard it. The streams are raw asyncio connections (one thread
per stream would not scale to 10 000 here), read through a small chunked-transfer and
SSE decoder.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from tests.support import EXT, PROTOCOL

# -- streams ---------------------------------------------------------------------------------


def vm_rss_mb(pid: int) -> float:
    """VmRSS of `pid` from /proc, in MB."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


class SseStream:
    """One raw `subscriptions/listen` stream: the request written by hand, the answer de-chunked and split."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.buffer = b""

    @classmethod
    async def open(cls, url: str, task_ids: list[str], request_id: int) -> SseStream:
        parts = urlsplit(url)
        reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
        body = json.dumps(
            {
                "jsonrpc": "2.0",
                "id": request_id,
                "method": "subscriptions/listen",
                "params": {
                    "notifications": {"taskIds": task_ids},
                    "_meta": {
                        "io.modelcontextprotocol/protocolVersion": PROTOCOL,
                        "io.modelcontextprotocol/clientCapabilities": {"extensions": {EXT: {}}},
                    },
                },
            }
        ).encode()
        head = (
            f"POST {parts.path} HTTP/1.1\r\nHost: {parts.netloc}\r\nContent-Type: application/json\r\n"
            "Accept: application/json, text/event-stream\r\n"
            f"MCP-Protocol-Version: {PROTOCOL}\r\nMcp-Method: subscriptions/listen\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        )
        writer.write(head.encode() + body)
        await writer.drain()
        status = await reader.readline()
        headers = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").lower()
        if b" 200 " not in status or "text/event-stream" not in headers or "chunked" not in headers:
            writer.close()
            raise RuntimeError(f"listen answered {status.decode().strip()}")
        return cls(reader, writer)

    async def message(self) -> dict[str, Any]:
        """The next JSON-RPC message on the stream."""
        while True:
            event, sep, rest = self.buffer.partition(b"\r\n\r\n" if b"\r\n\r\n" in self.buffer else b"\n\n")
            if sep:
                self.buffer = rest
                for line in event.replace(b"\r\n", b"\n").split(b"\n"):
                    if line.startswith(b"data:"):
                        return dict(json.loads(line[5:]))
                continue  # a comment (keep-alive) or an empty event
            size = int((await self.reader.readline()).split(b";")[0], 16)
            if size == 0:
                raise EOFError("the stream ended")
            self.buffer += (await self.reader.readexactly(size + 2))[:-2]

    def close(self) -> None:
        self.writer.close()


@dataclass
class StreamsResult:
    wanted: int
    opened: int
    refused: str | None  # why the first stream that could not open did not
    rss_before_mb: float
    rss_open_mb: float
    rss_after_mb: float
    reached: int
    last_ms: float | None  # from the write to the last stream that saw it
    open_s: float


async def _streams(
    url: str, task_id: str, n: int, pid: int, write: Callable[[str], object], wait_s: float
) -> StreamsResult:
    rss_before = vm_rss_mb(pid)
    gate = asyncio.Semaphore(200)  # connects in flight at once (the listen backlog is finite)
    began = time.perf_counter()
    refused: list[str] = []

    async def open_one(i: int) -> SseStream | None:
        async with gate:
            try:
                stream = await SseStream.open(url, [task_id], i + 1)
                ack = await asyncio.wait_for(stream.message(), 60)
            except (OSError, RuntimeError, EOFError, TimeoutError, asyncio.IncompleteReadError) as exc:
                refused.append(f"{type(exc).__name__}: {exc}")
                return None
            if ack.get("method") != "notifications/subscriptions/acknowledged":
                stream.close()
                refused.append(str(ack)[:200])
                return None
            return stream

    opened = [s for s in await asyncio.gather(*(open_one(i) for i in range(n))) if s is not None]
    open_s = time.perf_counter() - began
    await asyncio.sleep(1.0)
    rss_open = vm_rss_mb(pid)
    message = f"scale {time.time()}"
    arrivals: list[float] = []

    async def hear(stream: SseStream) -> None:
        while True:
            got = await stream.message()
            if got.get("method") == "notifications/tasks" and got["params"].get("statusMessage") == message:
                arrivals.append(time.perf_counter())
                return

    listeners = [asyncio.ensure_future(hear(s)) for s in opened]
    await asyncio.sleep(0.2)
    written = time.perf_counter()
    await asyncio.to_thread(write, message)
    await asyncio.wait(listeners, timeout=wait_s)
    for listener in listeners:
        listener.cancel()
    rss_after = vm_rss_mb(pid)
    for stream in opened:
        stream.close()
    return StreamsResult(
        wanted=n,
        opened=len(opened),
        refused=refused[0] if refused else None,
        rss_before_mb=rss_before,
        rss_open_mb=rss_open,
        rss_after_mb=rss_after,
        reached=len(arrivals),
        last_ms=(max(arrivals) - written) * 1e3 if arrivals else None,
        open_s=open_s,
    )


def streams(
    url: str, task_id: str, n: int, pid: int, write: Callable[[str], object], timeout: float = 60
) -> StreamsResult:
    """Open `n` streams following `task_id`, `write(message)` once, and see which streams hear it."""
    return asyncio.run(_streams(url, task_id, n, pid, write, timeout))
