"""`/metrics` on the web process's operations app, and the count of the task store's database errors.

A route of the operations app (`McpTasks.ops_app()`, served by `serve --ops-port`),
never of the MCP app: it needs no authorization, so it stays off the public port.

The scrape answers even while the store is down. What only the store knows (the
janitor's last sweep and the tasks in each status it sampled) is read in a
worker thread under a short deadline, at most one read at a time; a read that
fails or overruns leaves those series out of this scrape, sets
`mcp_tasks_ledger_up` to 0, counts `mcp_tasks_scrape_errors_total{source="ledger"}`
and logs (at most once a minute): a scrape never fails with a 500.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import anyio
import anyio.to_thread
from starlette.requests import Request
from starlette.responses import Response

from celery_mcp_tasks.model import TaskStatus
from celery_mcp_tasks.ops.metrics import PREFIX, families, multiprocess

if TYPE_CHECKING:
    from prometheus_client.registry import Collector
    from sqlalchemy.engine import Engine, ExceptionContext

    from celery_mcp_tasks.service import TaskService
    from celery_mcp_tasks.store.base import Store
    from celery_mcp_tasks.store.sweeps import SweepRecord

__all__ = [
    "LEDGER_TIMEOUT_S",
    "LedgerCollector",
    "LedgerView",
    "Scrape",
    "count_store_errors",
    "endpoint",
    "store_operation",
]

logger = logging.getLogger("celery_mcp_tasks.ops.metrics")

LEDGER_TIMEOUT_S = 0.5
"""How long a scrape waits for the sweep record before it answers without it."""
_LOG_EVERY_S = 60.0
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


@dataclass(frozen=True)
class LedgerView:
    """What one scrape learned from the sweep ledger: `ok` False when the read failed or overran."""

    ok: bool
    record: SweepRecord | None = None


class LedgerCollector:
    """The store-derived series of one scrape, from a `LedgerView` read beforehand (no I/O here)."""

    def __init__(self, view: LedgerView, interval_s: float | None) -> None:
        self._view = view
        self._interval_s = interval_s

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        yield GaugeMetricFamily(
            f"{PREFIX}_ledger_up", "Whether this scrape could read the janitor's sweep record", value=int(self._view.ok)
        )
        if self._interval_s is not None:
            yield GaugeMetricFamily(
                f"{PREFIX}_janitor_interval_seconds", "The janitor's configured interval", value=self._interval_s
            )
        record = self._view.record
        if record is None:
            return
        if record.swept_at is not None:
            yield GaugeMetricFamily(
                f"{PREFIX}_janitor_last_sweep_timestamp_seconds",
                "When the janitor last recorded a sweep (Unix time)",
                value=record.swept_at / 1000.0,
            )
        if record.duration_ms is not None:
            yield GaugeMetricFamily(
                f"{PREFIX}_janitor_last_sweep_duration_seconds",
                "How long the last recorded sweep took",
                value=record.duration_ms / 1000.0,
            )
        if record.statuses:
            family = GaugeMetricFamily(
                f"{PREFIX}_in_status", "Tasks in each status, as the last sweep counted them", labels=["status"]
            )
            for status in TaskStatus:  # every status, and only ours: a bounded label
                family.add_metric([status.value], float(record.statuses.get(status.value, 0)))
            yield family


class Scrape:
    """One app's `/metrics`: this process's registry plus the store-derived series."""

    def __init__(
        self,
        service: Callable[[], TaskService],
        interval_s: float | None,
        *,
        timeout_s: float = LEDGER_TIMEOUT_S,
    ) -> None:
        self._service = service
        self._interval_s = interval_s
        self._timeout_s = timeout_s
        self._reading = False  # a read that overran may still run: never start a second one
        self._logged_at = float("-inf")

    async def respond(self) -> Response:
        view = await self.ledger()
        try:
            body = await anyio.to_thread.run_sync(self.render, view)
        except Exception:
            logger.exception("metrics: could not render the scrape")
            body = b""
        return Response(body, media_type=CONTENT_TYPE)

    async def ledger(self) -> LedgerView:
        if self._reading:
            return self._failed("a previous read has not returned")
        self._reading = True
        outcome: list[LedgerView] = []

        def read() -> None:
            try:
                outcome.append(LedgerView(True, self._last_sweep()))
            except Exception as exc:  # noqa: BLE001 - the store is down or behind: reported below
                outcome.append(self._failed(type(exc).__name__))
            finally:
                self._reading = False

        with anyio.move_on_after(self._timeout_s):
            await anyio.to_thread.run_sync(read, abandon_on_cancel=True)
        return outcome[0] if outcome else self._failed(f"no answer within {self._timeout_s:g}s")

    def _last_sweep(self) -> SweepRecord | None:
        from celery_mcp_tasks.janitor import ledger_of
        from celery_mcp_tasks.store.sweeps import JANITOR

        ledger = ledger_of(self._service())  # None for a store that keeps no sweep ledger
        return ledger.last(JANITOR) if ledger is not None else None

    def _failed(self, why: str) -> LedgerView:
        families().scrape_errors.labels("ledger").inc()
        now = time.monotonic()
        if now - self._logged_at >= _LOG_EVERY_S:
            self._logged_at = now
            logger.warning("metrics: could not read the janitor's sweep record (%s); scraped without it", why)
        return LedgerView(False)

    def render(self, view: LedgerView) -> bytes:
        from prometheus_client import REGISTRY, CollectorRegistry, generate_latest
        from prometheus_client.multiprocess import MultiProcessCollector

        families()  # described from the first scrape on, before any task changed here
        parts: list[bytes] = []
        try:
            if multiprocess():  # e.g. a web process under gunicorn with PROMETHEUS_MULTIPROC_DIR set
                registry = CollectorRegistry()
                MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
                parts.append(generate_latest(registry))
            else:
                parts.append(generate_latest(REGISTRY))
        except Exception:
            families().scrape_errors.labels("registry").inc()
            logger.exception("metrics: could not collect this process's registry")
        collector = LedgerCollector(view, self._interval_s)
        parts.append(generate_latest(cast("Collector", collector)))
        return b"".join(parts)


def endpoint(service: Callable[[], TaskService], interval_s: float | None) -> Callable[[Request], Awaitable[Response]]:
    """The route handler (a plain function: Starlette treats any other callable as an ASGI app)."""
    scrape = Scrape(service, interval_s)

    async def metrics(_request: Request) -> Response:
        return await scrape.respond()

    return metrics


# -- the store's database errors -------------------------------------------------------------


def store_operation(context: ExceptionContext) -> str:
    """A bounded label: connect, select, insert, update, delete, transaction (commit/rollback) or other."""
    if context.connection is None:
        return "connect"
    statement = (context.statement or "").lstrip()
    if not statement:
        return "transaction"
    verb = statement.split(None, 1)[0].lower()
    return verb if verb in ("select", "insert", "update", "delete") else "other"


def _on_error(context: ExceptionContext) -> None:
    try:
        families().store_errors.labels(store_operation(context)).inc()
    except Exception:
        logger.debug("metrics: could not count a store error", exc_info=True)


def count_store_errors(store: Store | Engine) -> None:
    """Count the database errors of the task store's own engine (each process builds its own).

    A store without a SQLAlchemy `engine` is not counted here.

    A SQLAlchemy `handle_error` listener on that engine alone: the application's
    own engines, even on the same database, are not the store's. It runs only
    when the database fails (nothing on the success path), and sees each failure
    once, including a dropped connection the store then retries and the connect
    of a database that is down.
    """
    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    engine = store if isinstance(store, Engine) else getattr(store, "engine", None)
    if not isinstance(engine, Engine):
        return
    if not event.contains(engine, "handle_error", _on_error):
        event.listen(engine, "handle_error", _on_error)
