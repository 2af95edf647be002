"""Closed-loop HTTP clients for bench/bench_hot_path.py: one client, or N on threads, each its own connection.

A client sends its next request when the previous answer is in (closed loop), so
throughput is what the server sustains at that concurrency, and latency is not
inflated by a queue the client built. Every answer is checked: a wrong reply stops
the benchmark instead of being timed.
"""

from __future__ import annotations

import itertools
import json
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx

from tests.support import EXT, PROTOCOL, McpHttp

Call = Callable[[], None]
Factory = Callable[[], tuple[Call, Callable[[], None]]]
"""Makes one client: its call (one request, checked) and how to close it. Called once per client thread."""


class BenchError(RuntimeError):
    """A reply that is not what the measured path must answer."""


@dataclass
class Sample:
    latencies: list[float]  # seconds, one per timed call
    ops_s: float
    calls: int = 0  # every call made after the start barrier, warm-up included (CPU per call: bench_ops_overhead)

    @property
    def p50_ms(self) -> float:
        return statistics.median(self.latencies) * 1e3


def one_client(factory: Factory, rounds: int, warmup: int) -> Sample:
    call, close = factory()
    try:
        for _ in range(warmup):
            call()
        latencies: list[float] = []
        began = time.perf_counter()
        for _ in range(rounds):
            start = time.perf_counter()
            call()
            latencies.append(time.perf_counter() - start)
        elapsed = time.perf_counter() - began
    finally:
        close()
    return Sample(latencies, rounds / elapsed)


def interleaved(factories: dict[str, Factory], rounds: int, warmup: int) -> dict[str, Sample]:
    """One client per path, taking turns call by call (the order rotated every round), so drift and
    noise on a shared machine fall on every path alike. A closed loop of one: ops/s = 1 / mean latency."""
    made = {name: factory() for name, factory in factories.items()}
    names = list(made)
    latencies: dict[str, list[float]] = {name: [] for name in names}
    try:
        for _ in range(warmup):
            for call, _ in made.values():
                call()
        for index in range(rounds):
            shift = index % len(names)
            for name in names[shift:] + names[:shift]:
                call = made[name][0]
                start = time.perf_counter()
                call()
                latencies[name].append(time.perf_counter() - start)
    finally:
        for _, close in made.values():
            close()
    return {name: Sample(values, len(values) / sum(values)) for name, values in latencies.items()}


def many_clients(factory: Factory, clients: int, seconds: float, warm_s: float) -> Sample:
    """`clients` threads in a closed loop; counted: the calls that end inside the window after `warm_s`."""
    barrier = threading.Barrier(clients + 1)
    stop = threading.Event()
    spans: list[list[tuple[float, float]]] = [[] for _ in range(clients)]
    errors: list[BaseException] = []

    def client(index: int) -> None:
        try:
            call, close = factory()
        except BaseException as exc:  # noqa: BLE001 - reported below, after every thread has stopped
            errors.append(exc)
            barrier.abort()
            return
        try:
            for _ in range(3):  # the connection and this client's first request are not measured
                call()
            barrier.wait(timeout=120)
            mine = spans[index]
            while not stop.is_set():
                start = time.perf_counter()
                call()
                mine.append((start, time.perf_counter()))
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)
            stop.set()
            barrier.abort()
        finally:
            close()

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(clients)]
    for thread in threads:
        thread.start()
    try:
        barrier.wait(timeout=120)
    except threading.BrokenBarrierError:
        pass
    began = time.perf_counter()
    window = (began + warm_s, began + warm_s + seconds)
    stop.wait(warm_s + seconds)
    stop.set()
    for thread in threads:
        thread.join(60)
    if errors:
        raise errors[0]
    ended = [(s, e) for mine in spans for s, e in mine if window[0] <= e <= window[1]]
    latencies = [e - s for s, e in ended if s >= window[0]]
    if not latencies:
        raise BenchError("no call completed inside the measurement window")
    return Sample(latencies, len(ended) / seconds, sum(len(mine) for mine in spans))


# -- the calls ---------------------------------------------------------------------------


def _text(result: dict[str, Any]) -> str | None:
    content = result.get("content") or [{}]
    return content[0].get("text") if isinstance(content[0], dict) else None


def tool_call(
    url: str,
    name: str,
    want: Callable[[dict[str, Any]], bool],
    *,
    capabilities: dict[str, Any] | None = None,
    sink: Callable[[dict[str, Any]], None] | None = None,
) -> Factory:
    """`tools/call name {"n": i}` on a 2026-07-28 client (with the extension unless `capabilities` says otherwise)."""

    def make() -> tuple[Call, Callable[[], None]]:
        http = McpHttp(url) if capabilities is None else McpHttp(url, capabilities=capabilities)
        counter = itertools.count()

        def call() -> None:
            reply = http.call_tool(name, {"n": next(counter)})
            result = reply.get("result")
            if not isinstance(result, dict) or not want(result):
                raise BenchError(f"tools/call {name}: unexpected reply {str(reply)[:300]}")
            if sink is not None:
                sink(result)

        return call, http.close

    return make


def is_task(result: dict[str, Any]) -> bool:
    return result.get("resultType") == "task" and isinstance(result.get("taskId"), str)


def says(text: str) -> Callable[[dict[str, Any]], bool]:
    return lambda result: not result.get("isError") and _text(result) == text


def rpc_call(url: str, method: str, want: Callable[[dict[str, Any]], bool]) -> Factory:
    def make() -> tuple[Call, Callable[[], None]]:
        http = McpHttp(url)

        def call() -> None:
            reply = http.rpc(method)
            if not want(reply.get("result") or {}):
                raise BenchError(f"{method}: unexpected reply {str(reply)[:300]}")

        return call, http.close

    return make


def task_get(url: str, task_ids: list[str]) -> Factory:
    """`tasks/get` over a pool of existing tasks, each client starting at a different one."""
    start = itertools.count(0, 7)

    def make() -> tuple[Call, Callable[[], None]]:
        http = McpHttp(url)
        ids = itertools.cycle(task_ids[next(start) % len(task_ids) :] + task_ids)

        def call() -> None:
            reply = http.task("tasks/get", next(ids))
            if "status" not in (reply.get("result") or {}):
                raise BenchError(f"tasks/get: unexpected reply {str(reply)[:300]}")

        return call, http.close

    return make


def legacy_call(url: str, version: str, name: str, text: str) -> Factory:
    """`tools/call` from an earlier-era client: an `initialize` session, no extension (the synchronous path)."""
    from tests.integration.test_protocol_eras import LegacySession

    def make() -> tuple[Call, Callable[[], None]]:
        session = LegacySession(url, version, {}).open()
        counter = itertools.count()

        def call() -> None:
            reply = session.call_tool(name, {"n": next(counter)})
            if not says(text)(reply.get("result") or {}):
                raise BenchError(f"tools/call {name} ({version}): unexpected reply {str(reply)[:300]}")

        return call, session.close

    return make


# -- completion: create, listen, see it completed ----------------------------------------------


@dataclass
class Completion:
    """One no-op task from `tools/call` to the moment the client knows it completed (seconds, wall ms)."""

    total: float
    created: float  # tools/call answered
    acked: float  # listen stream open and acknowledged
    by_notification: bool  # False: the task had completed before the stream opened; seen by the one tasks/get
    server_ms: float  # the row: created -> completed (queue pickup, job, final write)
    delivery_ms: float | None  # completed write -> notification read here (same machine, same clock)


def _epoch_ms(stamp: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp() * 1e3


def _listen_body(task_id: str) -> str:
    return json.dumps(
        {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "subscriptions/listen",
            "params": {
                "notifications": {"taskIds": [task_id]},
                "_meta": {
                    "io.modelcontextprotocol/protocolVersion": PROTOCOL,
                    "io.modelcontextprotocol/clientCapabilities": {"extensions": {EXT: {}}},
                },
            },
        }
    )


_LISTEN_HEADERS = {
    "Accept": "application/json, text/event-stream",
    "Content-Type": "application/json",
    "MCP-Protocol-Version": PROTOCOL,
    "Mcp-Method": "subscriptions/listen",
}


def _messages(lines: Iterator[str]) -> Iterator[dict[str, Any]]:
    for line in lines:
        if line.startswith("data:"):
            yield json.loads(line[5:])


def completion(url: str, sink: list[Completion]) -> Factory:
    """What a listening client does (the package's own client does the same): `tools/call`, then
    `subscriptions/listen` with the new id, and once acknowledged one `tasks/get` (the job may have
    finished before the stream opened), else the `completed` notification. Each call appends its
    breakdown to `sink`. The stream is read on the calling thread through one long-lived HTTP
    client (a new client per stream costs ~20 ms of TLS context setup, a client-side artefact)."""

    def make() -> tuple[Call, Callable[[], None]]:
        http = McpHttp(url)
        listen = httpx.Client(timeout=httpx.Timeout(10, read=30))
        counter = itertools.count()

        def call() -> None:
            start = time.perf_counter()
            reply = http.call_tool("noop", {"n": next(counter)})
            result = reply.get("result") or {}
            if not is_task(result):
                raise BenchError(f"tools/call noop: unexpected reply {str(reply)[:300]}")
            created = time.perf_counter()
            task_id = result["taskId"]
            with listen.stream("POST", url, content=_listen_body(task_id), headers=_LISTEN_HEADERS) as response:
                messages = _messages(response.iter_lines())
                ack = next(messages)
                acked = time.perf_counter()
                if ack.get("params", {}).get("notifications", {}).get("taskIds") != [task_id]:
                    raise BenchError(f"listen did not follow the task: {ack}")
                task = http.get(task_id)
                by_notification = task["status"] != "completed"
                while task["status"] != "completed":
                    if task["status"] in ("failed", "cancelled"):
                        raise BenchError(f"the no-op task ended {task['status']}")
                    message = next(messages)
                    if message.get("method") == "notifications/tasks":
                        task = message["params"]
                done = time.perf_counter()
                done_wall_ms = time.time() * 1e3
            updated_ms = _epoch_ms(task["lastUpdatedAt"])
            sink.append(
                Completion(
                    total=done - start,
                    created=created - start,
                    acked=acked - created,
                    by_notification=by_notification,
                    server_ms=updated_ms - _epoch_ms(task["createdAt"]),
                    delivery_ms=done_wall_ms - updated_ms if by_notification else None,
                )
            )

        def close() -> None:
            listen.close()
            http.close()

        return call, close

    return make
