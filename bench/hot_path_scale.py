"""The scale half of bench/bench_hot_path.py (`--scale`): a big table, and many open listen streams.

- Rows: the store's table is filled with SQL (`generate_series`, in one statement per
  level) to each size, ANALYZEd, and `tasks/get` of tasks created over MCP is timed.
- Streams: N `subscriptions/listen` streams, all following one task, on one web process;
  a progress write (as a worker makes it) must reach every one. The streams are raw
  asyncio connections (one thread per stream would not scale to 10 000 here), read
  through a small chunked-transfer and SSE decoder.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import sqlalchemy as sa

from tests.support import EXT, PROTOCOL

# -- rows ------------------------------------------------------------------------------------


def _bulk_values(now_ms: int) -> dict[str, str]:
    """SQL for each column of a bulk row `g` (a mix of finished and running tasks, like a live table)."""
    done = "(g % 10 <> 0)"
    return {
        "key": "encode(sha256(('bulk-' || g)::text::bytea), 'hex')",
        "owner": "NULL",
        "tool": "'noop'",
        "status": f"CASE WHEN {done} THEN 'completed' ELSE 'working' END",
        "status_message": "NULL",
        "created_at": f"{now_ms} - g",
        "updated_at": f"{now_ms} - g",
        "ttl_ms": "3600000",
        "expires_at": f"{now_ms} - g + 3600000",
        "poll_interval_ms": "1000",
        "arguments": "'{\"n\": 0}'",
        "input_requests": "'{}'",
        "input_responses": "'{}'",
        "issued_keys": "'[]'",
        "result": f'CASE WHEN {done} THEN \'{{"content": [{{"type": "text", "text": "ok"}}]}}\' END',
        "error": "NULL",
        "version": f"CASE WHEN {done} THEN 3 ELSE 2 END",
        "dispatches": "1",
        "heartbeat_at": f"{now_ms} - g",
    }


def fill_rows(url: str, start: int, stop: int) -> float:
    """Insert bulk rows `start..stop-1` into the store's table; returns the seconds it took."""
    from celery_mcp_tasks.store.engine import normalize_url
    from celery_mcp_tasks.store.schema import tasks

    values = _bulk_values(int(time.time() * 1000))
    columns, exprs = [], []
    for column in tasks.columns:
        if column.name in values:
            expr = values[column.name]
            if isinstance(column.type, sa.JSON) and expr.startswith(("'", "CASE")):
                expr = f"({expr})::json"
        elif column.nullable:
            expr = "NULL"
        elif column.server_default is not None:
            continue
        else:
            raise RuntimeError(f"{tasks.name}.{column.name}: the bulk rows do not know this column")
        columns.append(column.name)
        exprs.append(expr)
    statement = (
        f"INSERT INTO {tasks.name} ({', '.join(columns)}) "
        f"SELECT {', '.join(exprs)} FROM generate_series({start}, {stop - 1}) AS g"
    )
    engine = sa.create_engine(normalize_url(url))
    began = time.perf_counter()
    try:
        with engine.begin() as conn:
            conn.execute(sa.text(statement))
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(sa.text(f"ANALYZE {tasks.name}"))
    finally:
        engine.dispose()
    return time.perf_counter() - began


def count_rows(url: str) -> int:
    from celery_mcp_tasks.store.engine import normalize_url
    from celery_mcp_tasks.store.schema import tasks

    engine = sa.create_engine(normalize_url(url))
    try:
        with engine.connect() as conn:
            return int(conn.execute(sa.select(sa.func.count()).select_from(tasks)).scalar_one())
    finally:
        engine.dispose()


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
