"""Prometheus metrics, opt-in through the `Prometheus` plugin (MCP_TASKS_METRICS=on).

Every process counts what it committed, from the rows before and after each write (summed over the
scrape targets: created = finished + in flight); never a task id, key or argument as a label, and
the `tool` label takes the app's registered tool names only ("other" for anything else).
"""

from __future__ import annotations

import asyncio
import contextlib
import glob
import logging
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Collection, Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from celery_mcp_tasks.model import TaskRecord, TaskStatus
from celery_mcp_tasks.ops.probes import in_daemon_thread
from celery_mcp_tasks.ops.prometheus_internals import count_in_files, counts_in_files, read_values, write_values
from celery_mcp_tasks.plugin import Plugin, Runtime
from celery_mcp_tasks.service import ENQUEUE_FAILED
from celery_mcp_tasks.worker.janitor import EXPIRED_UNFINISHED, METRIC

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

    from prometheus_client import CollectorRegistry
    from prometheus_client.registry import Collector
    from sqlalchemy.engine import Engine, ExceptionContext
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import BaseRoute

    from celery_mcp_tasks.service import TaskService
    from celery_mcp_tasks.store.base import Store
    from celery_mcp_tasks.store.ledger import SweepRecord

logger = logging.getLogger("celery_mcp_tasks.ops.metrics")

PREFIX = "mcp_tasks"
OTHER = "other"  # the `tool` label of a tool this app does not register (bounded cardinality)
EXPIRED = "expired"  # the `status` label of `finished_total` for a task its TTL removed before it was final

QUEUE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
RUN_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 7200, 21600)
INPUT_BUCKETS = (1, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 7200, 21600, 43200, 86400)
PUSH_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)

# Sweep report keys -> the `action` label of `mcp_tasks_janitor_tasks_total` (other keys are not counted).
JANITOR_ACTIONS = {"removed": "evicted", "resent": "resent", "failed": "failed_lost", "expired_inputs": "expired_input"}


class Families:
    """Every metric this package exports, in one registry."""

    def __init__(self, registry: CollectorRegistry | None) -> None:
        from prometheus_client import Counter, Gauge, Histogram

        def counter(name: str, doc: str, *labels: str) -> Counter:
            return Counter(f"{PREFIX}_{name}", doc, labels, registry=registry)

        def histogram(name: str, doc: str, buckets: tuple[float, ...], *labels: str) -> Histogram:
            return Histogram(f"{PREFIX}_{name}", doc, labels, registry=registry, buckets=buckets)

        self.created = counter("created", "Tasks created", "tool")
        self.finished = counter(
            "finished", "Tasks that reached a final status, or expired before one", "tool", "status"
        )
        self.refused = counter(
            "refused", "Creations a caller's quota or rate limit refused, by tool and limit", "tool", "limit"
        )
        self.enqueue_failures = counter("enqueue_failures", "Tasks failed because their job could not be sent", "tool")
        self.queue_wait = histogram(
            "queue_wait_seconds", "From the write that queued a run to the run's start", QUEUE_BUCKETS, "tool"
        )
        self.run = histogram(
            "run_seconds", "From a run's start to its end (a final status or a question)", RUN_BUCKETS, "tool"
        )
        self.duration = histogram(
            "duration_seconds", "From creation to the final status", RUN_BUCKETS, "tool", "status"
        )
        self.input_wait = histogram(
            "input_wait_seconds", "Time in input_required, from its last write to the answer", INPUT_BUCKETS, "tool"
        )
        self.janitor_sweeps = counter("janitor_sweeps", "Janitor sweeps this process ran")
        self.janitor_tasks = counter("janitor_tasks", "Tasks the janitor acted on, by action", "action")
        self.listen_streams = Gauge(
            f"{PREFIX}_listen_streams",
            "Open subscriptions/listen streams",
            registry=registry,
            multiprocess_mode="livesum",
        )
        self.push_latency = histogram(
            "push_notify_latency_seconds", "From a hint waking a listen stream to its notification", PUSH_BUCKETS
        )
        self.store_errors = counter("store_errors", "Database errors met by the task store, by operation", "operation")
        self.scrape_errors = counter("scrape_errors", "Parts of a /metrics scrape that could not be read", "source")


_lock = threading.Lock()
_families: Families | None = None


def families() -> Families:
    """This process's metrics in the default registry, made on first use: prometheus_client fixes a metric's
    value class (memory, or a prefork worker's files) when it is made, so none exists before a worker decided."""
    global _families
    if _families is None:
        with _lock:
            if _families is None:
                from prometheus_client import REGISTRY

                _families = Families(REGISTRY)
    return _families


def queued_at(before: TaskRecord) -> int:
    """When the run that starts after `before` was queued: its send, an answer, or a retry's due time (a retry
    sets `updated_at` and moves `heartbeat_at` to the end of its countdown; a send sets `heartbeat_at`)."""
    return max(before.updated_at, before.heartbeat_at or 0)


def _seconds(later_ms: int, earlier_ms: int) -> float:  # two processes' clocks: a skew is no negative duration
    return max(later_ms - earlier_ms, 0) / 1000.0


class Counts(Plugin):
    """The counting hooks (`Prometheus` adds where they are served). `tools`: the app's live registry of
    task tool names (tools declared later count too); any other name is labelled `other`."""

    def __init__(self, tools: Collection[str] = (), metrics: Callable[[], Families] = families) -> None:
        self._tools = tools
        self._metrics = metrics

    def tool(self, name: str) -> str:
        return name if name in self._tools else OTHER

    def task_changed(self, before: TaskRecord | None, after: TaskRecord) -> None:
        m = self._metrics()
        tool = self.tool(after.tool)
        if before is None:
            m.created.labels(tool).inc()
        else:
            self._timings(m, tool, before, after)
        if after.terminal and (before is None or not before.terminal):
            status = after.status.value
            m.finished.labels(tool, status).inc()
            m.duration.labels(tool, status).observe(_seconds(after.updated_at, after.created_at))
            if after.status is TaskStatus.FAILED and (after.error or {}).get("message") == ENQUEUE_FAILED:
                m.enqueue_failures.labels(tool).inc()

    @staticmethod
    def _timings(m: Families, tool: str, before: TaskRecord, after: TaskRecord) -> None:
        if before.started_at is None and after.started_at is not None:  # a queued run started
            m.queue_wait.labels(tool).observe(_seconds(after.started_at, queued_at(before)))
        asked = after.status is TaskStatus.INPUT_REQUIRED and not after.parked  # a parked job still runs
        ended = (after.terminal and after.status is not TaskStatus.CANCELLED) or asked  # a cancel is not the job's
        if before.started_at is not None and before.status is TaskStatus.WORKING and ended:
            m.run.labels(tool).observe(_seconds(after.updated_at, before.started_at))
        if before.status is TaskStatus.INPUT_REQUIRED and after.status is not TaskStatus.INPUT_REQUIRED:
            m.input_wait.labels(tool).observe(_seconds(after.updated_at, before.updated_at))

    def creation_refused(self, tool: str, limit: str) -> None:
        self._metrics().refused.labels(self.tool(tool), limit).inc()

    def swept(self, name: str, counts: dict[str, int]) -> None:
        """The sweeps this process ran, what they did, and the tasks they evicted unfinished
        (`finished{status="expired"}`, by tool). Other names are ignored."""
        if name == METRIC:
            m = self._metrics()
            m.janitor_sweeps.inc()
            for key, action in JANITOR_ACTIONS.items():
                count = counts.get(key, 0)
                if count > 0:
                    m.janitor_tasks.labels(action).inc(count)
        elif name == EXPIRED_UNFINISHED:
            m = self._metrics()
            for tool, count in counts.items():
                if count > 0:
                    m.finished.labels(self.tool(tool), EXPIRED).inc(count)

    def stream_opened(self) -> None:
        self._metrics().listen_streams.inc()

    def stream_closed(self) -> None:
        self._metrics().listen_streams.dec()

    def stream_notified(self, latency_s: float) -> None:
        self._metrics().push_latency.observe(max(latency_s, 0.0))


# The web process's /metrics, on the operations app (it needs no authorization: off the MCP port). What
# only the store knows (the janitor's last sweep) is read in a thread under a short deadline, one read at
# a time; a read that fails or overruns costs those series, `ledger_up` 0 and a log line, never a 500.

LEDGER_TIMEOUT_S = 0.5
_LOG_EVERY_S = 60.0
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


@dataclass(frozen=True)
class LedgerView:
    """What one scrape learned from the sweep ledger (`ok` False: the read failed or overran)."""

    ok: bool
    record: SweepRecord | None = None


def _s(ms: int | None) -> float | None:
    return None if ms is None else ms / 1000.0


class LedgerCollector:
    """The store-derived series of one scrape (no I/O here)."""

    def __init__(self, view: LedgerView, interval_s: float | None) -> None:
        self._view = view
        self._interval_s = interval_s

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        record = self._view.record
        swept_at, took = (None, None) if record is None else (_s(record.swept_at), _s(record.duration_ms))
        for name, doc, value in (
            ("ledger_up", "Whether this scrape could read the janitor's sweep record", int(self._view.ok)),
            ("janitor_interval_seconds", "The janitor's configured interval", self._interval_s),
            ("janitor_last_sweep_timestamp_seconds", "When the janitor last recorded a sweep (Unix time)", swept_at),
            ("janitor_last_sweep_duration_seconds", "How long the last recorded sweep took", took),
        ):
            if value is not None:
                yield GaugeMetricFamily(f"{PREFIX}_{name}", doc, value=value)
        if record is not None and record.statuses:
            family = GaugeMetricFamily(
                f"{PREFIX}_in_status", "Tasks in each status, as the last sweep counted them", labels=["status"]
            )
            for status in TaskStatus:  # every status, and only ours: a bounded label
                family.add_metric([status.value], float(record.statuses.get(status.value, 0)))
            yield family


class Scrape:
    """One app's `/metrics`: this process's registry plus the store-derived series."""

    def __init__(
        self, service: Callable[[], TaskService], interval_s: float | None, *, timeout_s: float = LEDGER_TIMEOUT_S
    ) -> None:
        self._service = service
        self._interval_s = interval_s
        self._timeout_s = timeout_s
        self._reading: Future[LedgerView] | None = None  # a read that overran may still run: never start a second
        self._logged_at = float("-inf")

    async def respond(self, _request: Request | None = None) -> Response:
        import anyio.to_thread
        from starlette.responses import Response

        view = await self.ledger()
        try:
            body = await anyio.to_thread.run_sync(self.render, view)
        except Exception:
            logger.exception("metrics: could not render the scrape")
            body = b""
        return Response(body, media_type=CONTENT_TYPE)

    async def ledger(self) -> LedgerView:
        """The sweep record, read in a daemon thread of its own: not one of the event loop's pool, whose tokens
        the application's own work may hold (a read still waiting for one when the deadline passed never ran,
        and its scrape's "still reading" never ended)."""
        if self._reading is not None and not self._reading.done():
            return self._failed("a previous read has not returned")
        self._reading = in_daemon_thread(self._read, name="mcp-tasks-metrics-ledger")
        waiting = asyncio.wrap_future(self._reading)
        done, _ = await asyncio.wait({waiting}, timeout=self._timeout_s)
        return waiting.result() if done else self._failed(f"no answer within {self._timeout_s:g}s")

    def _read(self) -> LedgerView:
        from celery_mcp_tasks.store.ledger import JANITOR

        try:
            return LedgerView(True, self._service().ledger().last(JANITOR))
        except Exception as exc:  # noqa: BLE001 - the store is down or behind: reported, never raised
            return self._failed(type(exc).__name__)

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
            registry = REGISTRY
            if counts_in_files() and os.environ.get(MULTIPROC_DIR):  # e.g. a web process under gunicorn
                registry = CollectorRegistry()
                MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
            parts.append(generate_latest(registry))
        except Exception:
            families().scrape_errors.labels("registry").inc()
            logger.exception("metrics: could not collect this process's registry")
        parts.append(generate_latest(cast("Collector", LedgerCollector(view, self._interval_s))))
        return b"".join(parts)


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


# The worker's exporter. A prefork child counts where no scrape reaches, so a `celery worker` counts in
# multiprocess files (in PROMETHEUS_MULTIPROC_DIR, else a private directory made before the fork and any
# metric) that its main process serves. prometheus_client keeps a dead child's counter files for ever and
# every scrape reads them all, so with `--max-tasks-per-child` they would pile up: in a private directory
# an exiting child folds its counts into one `*_merged.db` per type, under a lock the endpoint also takes.
# A deployment's directory may have readers of its own: it is left as prometheus_client writes it.

MULTIPROC_DIR = "PROMETHEUS_MULTIPROC_DIR"
PRIVATE_PREFIX = "celery-mcp-tasks-metrics-"  # then the worker's pid, a random tail
MERGED = "merged"  # `counter_merged.db`, ...: the exited children's counts (the collector reads any `TYPE_*.db`)
_ADDITIVE = ("counter", "histogram", "summary")  # values that sum across processes (gauges are per process)
_LOCK_FILE = ".fold.lock"  # not `*.db`: the collector never reads it


@contextlib.contextmanager
def _locked(directory: str, *, exclusive: bool) -> Iterator[None]:
    """The directory's fold lock: a fold is exclusive, a scrape shares it."""
    import fcntl

    with open(os.path.join(directory, _LOCK_FILE), "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def fold_files(directory: str, pid: int) -> int:
    """Add process `pid`'s counter, histogram and summary files into the `*_merged.db` ones; how many went. The
    merged file is written under a name no reader globs, then replaces the old one, before `pid`'s goes."""
    folded = 0
    with _locked(directory, exclusive=True):
        for kind in _ADDITIVE:
            own = os.path.join(directory, f"{kind}_{pid}.db")
            if not os.path.exists(own):
                continue
            merged = os.path.join(directory, f"{kind}_{MERGED}.db")
            totals: dict[str, float] = {}
            for path in (merged, own):
                if os.path.exists(path):
                    for key, value in read_values(path):
                        totals[key] = totals.get(key, 0.0) + value
            partial = f"{merged}.partial"
            with contextlib.suppress(FileNotFoundError):
                os.unlink(partial)  # left by a fold that was killed: never reopen (and add to) it
            write_values(partial, totals)
            os.replace(partial, merged)
            os.unlink(own)
            folded += 1
    return folded


class _Locked:
    """The multiprocess collector, read under the fold lock (never a fold half done)."""

    def __init__(self, directory: str) -> None:
        from prometheus_client.multiprocess import MultiProcessCollector

        self._directory = directory
        self._inner = MultiProcessCollector(None, path=directory)  # type: ignore[no-untyped-call]

    def collect(self) -> list[Any]:
        with _locked(self._directory, exclusive=False):
            return list(self._inner.collect())  # type: ignore[no-untyped-call]


def remove_orphans(parent: str | None = None) -> list[str]:
    """Remove the private directories of workers that are gone (killed before they could clean up)."""
    removed: list[str] = []
    for path in glob.glob(os.path.join(parent or tempfile.gettempdir(), f"{PRIVATE_PREFIX}*-*")):
        owner = os.path.basename(path).removeprefix(PRIVATE_PREFIX).split("-", 1)[0]
        if not owner.isdigit():
            continue
        try:
            os.kill(int(owner), 0)  # alive: its directory stays
        except PermissionError:  # alive: another user's process
            pass
        except ProcessLookupError:
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


class WorkerExporter:
    """One worker's multiprocess directory and the HTTP endpoint that serves it."""

    def __init__(self, port: int | None, *, addr: str = "0.0.0.0") -> None:
        self.port = port
        self.addr = addr
        self.directory: str | None = None
        self.private = False
        self.server: WSGIServer | None = None

    def prepare(self) -> None:
        """Decide how this worker counts (in files under one directory), before any child exists."""
        directory = os.environ.get(MULTIPROC_DIR)
        if not directory:
            if self.port is None:
                return  # no endpoint of ours and no directory of the deployment's: nothing would read files
            remove_orphans()
            directory = tempfile.mkdtemp(prefix=f"{PRIVATE_PREFIX}{os.getpid()}-")
            self.private = True
        os.makedirs(directory, exist_ok=True)
        self.directory = os.environ[MULTIPROC_DIR] = directory
        if not counts_in_files():
            if _families is None:
                count_in_files()
            else:  # made in memory, they would count there, unseen by the exporter
                logger.warning(
                    "metrics: counted in memory before the worker started; its pool's counts are not exported"
                )

    def serve(self) -> None:
        if self.port is None or self.directory is None or self.server is not None:
            return
        from prometheus_client import CollectorRegistry, start_http_server
        from prometheus_client.multiprocess import MultiProcessCollector

        registry = CollectorRegistry()
        if self.private:
            registry.register(cast("Collector", _Locked(self.directory)))
        else:
            MultiProcessCollector(registry, path=self.directory)  # type: ignore[no-untyped-call]
        try:
            self.server, _thread = start_http_server(self.port, addr=self.addr, registry=registry)
        except OSError as exc:
            logger.warning(
                "celery-mcp-tasks: worker metrics port %d is not free on %s (%s); this worker runs without its "
                "metrics endpoint (set MCP_TASKS_WORKER_METRICS_PORT to a free port, or off, and "
                "MCP_TASKS_WORKER_METRICS_HOST to an address of this host)",
                self.port,
                self.addr,
                exc.strerror or type(exc).__name__,
            )
            return
        logger.info("celery-mcp-tasks: worker metrics on http://%s:%d/metrics", self.addr, self.port)

    def child_exited(self, pid: int) -> None:
        """A pool process ends (in that process): drop its live gauges; in a private directory, fold its
        counters and histograms into the merged files (elsewhere they stay as they are)."""
        if self.directory is None:
            return
        from prometheus_client.multiprocess import mark_process_dead

        try:
            mark_process_dead(pid, self.directory)  # type: ignore[no-untyped-call]
            if self.private:
                fold_files(self.directory, pid)
        except Exception:  # its files stay: counted still, only not folded
            logger.warning("metrics: could not fold the counts of process %d", pid, exc_info=True)

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None
        if self.private and self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)
            self.directory = None
            self.private = False


def install_worker_exporter(celery: Any, port: int | None, *, addr: str = "0.0.0.0") -> list[Callable[..., None]]:
    """Connect an exporter to the `celery worker` of `celery` (by signal: only that command starts one). The
    receivers are connected weakly and returned: the plugin keeps them, and takes them along when it goes."""
    from celery import signals

    exporter = WorkerExporter(port, addr=addr)

    def of_this_worker(step: Callable[[], None]) -> Callable[..., None]:
        def receiver(sender: Any = None, instance: Any = None, **_: Any) -> None:
            if getattr(sender if instance is None else instance, "app", None) is celery:  # the worker
                step()

        return receiver

    def child_exited(sender: Any = None, pid: int | None = None, **_: Any) -> None:
        exporter.child_exited(pid if pid is not None else os.getpid())

    receivers = [
        (signals.celeryd_init, of_this_worker(exporter.prepare)),
        (signals.celeryd_after_setup, of_this_worker(exporter.serve)),
        (signals.worker_process_shutdown, child_exited),
        (signals.worker_shutdown, of_this_worker(exporter.stop)),
    ]
    for signal, receiver in receivers:
        signal.connect(receiver)
    return [receiver for _, receiver in receivers]


_DEFAULT_PORT: Any = object()


class Prometheus(Counts):
    """The metrics plugin (MCP_TASKS_METRICS=on): every process counts what it committed (`Counts`); the
    web process serves `/metrics` on the operations app (`McpTasks.ops_app()`), and each `celery worker`
    serves its own and its prefork children's on `worker_port` (default MCP_TASKS_WORKER_METRICS_PORT,
    9808; None: no worker endpoint). prometheus_client is imported on first use."""

    def __init__(self, *, worker_port: int | None = _DEFAULT_PORT) -> None:
        super().__init__()
        self._worker_port = worker_port
        self._route: BaseRoute | None = None
        self._receivers: list[Callable[..., None]] = []  # every app's it was set up on (a shared plugin)

    def setup(self, runtime: Runtime) -> None:
        from starlette.routing import Route

        settings = runtime.settings
        self._tools = runtime.tools
        port = settings.worker_metrics_port if self._worker_port is _DEFAULT_PORT else self._worker_port
        # The embedded default is one machine (as `serve` binds 127.0.0.1); a deployment is scraped from afar,
        # unless MCP_TASKS_WORKER_METRICS_HOST names the one interface its scraper reaches.
        local = settings.database_url is None and settings.embedded_broker
        addr = settings.worker_metrics_host or ("127.0.0.1" if local else "0.0.0.0")
        self._receivers += install_worker_exporter(runtime.celery, port, addr=addr)
        scrape = Scrape(runtime.service, settings.janitor_interval_s)
        self._route = Route("/metrics", scrape.respond, methods=["GET"])

    def store_built(self, store: Store, engine: Engine) -> None:
        from sqlalchemy import event

        # The store's own engine (not the application's); it runs on a failure only, once each, retries too.
        if not event.contains(engine, "handle_error", _on_error):
            event.listen(engine, "handle_error", _on_error)

    def routes(self) -> list[BaseRoute]:
        return [self._route] if self._route is not None else []
