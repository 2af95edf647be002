"""Closed-loop HTTP clients for bench/bench_task.py: one client, or N on threads, each its own connection.

A client sends its next request when the previous answer is in (closed loop), so
throughput is what the server sustains at that concurrency, and latency is not
inflated by a queue the client built. Every answer is checked: a wrong reply stops
the benchmark instead of being timed.
"""

from __future__ import annotations

import itertools
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tests.support import McpHttp

Call = Callable[[], None]
Factory = Callable[[], tuple[Call, Callable[[], None]]]
"""Makes one client: its call (one request, checked) and how to close it. Called once per client thread."""


class BenchError(RuntimeError):
    """A reply that is not what the measured path must answer."""


@dataclass
class Sample:
    latencies: list[float]  # seconds, one per timed call
    ops_s: float

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
    return Sample(latencies, len(ended) / seconds)


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


class Burst:
    """`clients` threads in a closed loop make `total` calls between them, as fast as they are answered.

    `start()` returns at once (the caller watches what the calls cause); `join()` waits for the calls."""

    def __init__(self, factory: Factory, total: int, clients: int) -> None:
        self.made = [factory() for _ in range(clients)]
        self.left = itertools.count(total, -1)  # next() on it is atomic under the GIL
        self.errors: list[BaseException] = []
        self.threads = [threading.Thread(target=self._client, args=(call,), daemon=True) for call, _ in self.made]

    def _client(self, call: Call) -> None:
        try:
            while next(self.left) > 0 and not self.errors:
                call()
        except BaseException as exc:  # noqa: BLE001 - raised by join(), after every thread has stopped
            self.errors.append(exc)

    def start(self) -> None:
        for thread in self.threads:
            thread.start()

    def join(self) -> None:
        for thread in self.threads:
            thread.join(300)
        for _, close in self.made:
            close()
        if self.errors:
            raise self.errors[0]
