"""`/healthz` (liveness) and `/readyz` (readiness): the `Health` plugin's routes on the operations app.

`/healthz` answers from the event loop alone: a probe that touched the database would have an
orchestrator restart every replica during a database outage, which no restart fixes. A stale
janitor is a "warn", not a failure: taking every replica out because beat stopped would turn a
slow leak into an outage (`doctor` and the alert rules treat it as one).
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import asdict
from functools import partial

from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import BaseRoute, Route

from celery_mcp_tasks.model import now_ms
from celery_mcp_tasks.ops.probes import (
    Finding,
    ProbeEngine,
    broker_probe,
    in_daemon_thread,
    janitor_probe,
    schema_probe,
    store_probe,
)
from celery_mcp_tasks.plugin import Plugin, Runtime
from celery_mcp_tasks.preflight import short_reason

logger = logging.getLogger("celery_mcp_tasks.ops.health")

DEADLINE_S = 1.5  # how long `/readyz` waits for its checks: it answers within 2 s whatever hangs


class Health(Plugin):
    """The health plugin: `/healthz` and `/readyz` on the operations app (nothing connects until a probe)."""

    def __init__(self) -> None:
        self._runner: CheckRunner | None = None

    def setup(self, runtime: Runtime) -> None:
        settings, celery = runtime.settings, runtime.celery
        probe = ProbeEngine(settings.store_url)
        since = now_ms()  # a fresh deployment has three intervals for its first sweep
        self._runner = CheckRunner(
            {  # in the order the body lists them
                "store": lambda: store_probe(probe),
                "schema": lambda: schema_probe(probe),
                "broker": lambda: broker_probe(celery),
                "janitor": lambda: janitor_probe(probe, settings, since_ms=since),
            }
        )

    def routes(self) -> list[BaseRoute]:
        if self._runner is None:
            raise RuntimeError("Health: routes() before setup(): give the plugin to McpTasks(plugins=[...])")
        return [Route("/healthz", healthz, methods=["GET"]), Route("/readyz", self._runner.readyz, methods=["GET"])]


async def healthz(_request: Request) -> JSONResponse:
    """Liveness: the process is up and its event loop answers (no store or broker round trip)."""
    return JSONResponse({"status": "ok"})


class CheckRunner:
    """Runs named checks in daemon threads, each run with its deadline; at most one run of each check in flight.

    Concurrent requests share a running check's result; a check that outlives its deadline keeps its one
    thread and answers "timed out", at once, until it returns: while the database hangs, a probe every few
    seconds costs one thread in all. Daemon threads, not a pool: the interpreter joins a pool's threads at
    exit, so a probe hung on a silent socket would keep the process from exiting after SIGTERM.
    """

    def __init__(self, checks: Mapping[str, Callable[[], Finding]], *, deadline_s: float = DEADLINE_S) -> None:
        self.checks = dict(checks)
        self.deadline_s = deadline_s
        self._lock = threading.Lock()
        self._pid: int | None = None
        self._running: dict[str, tuple[Future[Finding], float]] = {}

    def _start(self, name: str) -> tuple[Future[Finding], float]:
        """The check's run in flight, or a new one; with the monotonic time its deadline falls (a forked
        child starts with none in flight: the parent's threads did not cross)."""
        with self._lock:
            if self._pid != os.getpid():
                self._pid = os.getpid()
                self._running = {}
            run = self._running.get(name)
            if run is None or run[0].done():
                future = in_daemon_thread(partial(_contained, self.checks[name]), name="mcp-tasks-readyz")
                run = self._running[name] = (future, time.monotonic() + self.deadline_s)
            return run

    @property
    def in_flight(self) -> int:  # checks running now (a hung one counts until it returns)
        with self._lock:
            return sum(not future.done() for future, _ in self._running.values())

    async def readyz(self, _request: Request) -> JSONResponse:
        """200 when no check fails, 503 otherwise; a failure of the runner itself is a 503, never a 500."""
        try:
            findings = await self.run()
        except Exception as exc:  # noqa: BLE001 - readiness answers, whatever happened
            logger.warning("readiness checks could not run (%s)", type(exc).__name__)
            return JSONResponse({"status": "fail", "checks": {}, "detail": short_reason(exc)}, status_code=503)
        failed = any(finding.status == "fail" for finding in findings.values())
        body = {"status": "fail" if failed else "ok", "checks": {name: asdict(f) for name, f in findings.items()}}
        return JSONResponse(body, status_code=503 if failed else 200)

    async def run(self) -> dict[str, Finding]:
        """Every check's finding, or "timed out" for those still running at their run's deadline."""
        runs = {name: self._start(name) for name in self.checks}
        await asyncio.gather(*(_settled(future, until) for future, until in runs.values()))
        return {name: _finding(future, self.deadline_s) for name, (future, _) in runs.items()}


async def _settled(future: Future[Finding], until: float) -> None:
    """Return when `future` is done or at `until` (monotonic), whichever comes first; the run goes on."""
    remaining = until - time.monotonic()
    if not future.done() and remaining > 0:
        await asyncio.wait([asyncio.wrap_future(future)], timeout=remaining)


def _contained(check: Callable[[], Finding]) -> Finding:
    """A probe that raises is a failed check, decided in its thread: a future that held the exception would
    have asyncio log "Future exception was never retrieved" for the copy a request waited on."""
    try:
        return check()
    except Exception as exc:  # noqa: BLE001
        return Finding("fail", short_reason(exc))


def _finding(future: Future[Finding], deadline_s: float) -> Finding:
    if not future.done():
        return Finding("fail", f"timed out (no answer within {deadline_s:g}s)")
    if future.cancelled():
        return Finding("fail", "cancelled")
    return future.result()
