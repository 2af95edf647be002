"""Prometheus metrics: each process counts the changes it committed, from the Observer seam.

Every process counts what it did (the web process creates and cancels, the
workers start and finish runs, the janitor reaps, expires questions and evicts
tasks whose TTL ran out before they were final: `status="expired"`), so summed
over the scrape targets the counts tell the whole story: created = finished + in
flight. Timings come from the row before and after each write (`task_changed`),
never from another read of the store.

A run ends when the job itself ends it (a final status, or a question); a cancel
ends the task (`finished`, `duration_seconds`) but not the run, which goes on
unseen until the job notices: no `run_seconds` sample would be true for it.

No task id, row key, argument or result ever becomes a label. The `tool` label
takes the names of the app's registered task tools only ("other" for anything
else), so its values are bounded by the code, not by callers.

prometheus_client picks its value class (in memory, or the per-process files a
prefork worker needs) when `prometheus_client.values` is imported, and every
metric object keeps the class it was made with. So no metric object exists at
import or `install` time: `families()` makes them on first use, after a worker
has decided how it counts (`worker_metrics`).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Collection
from typing import TYPE_CHECKING, Any

from celery_mcp_tasks.janitor import EXPIRED_UNFINISHED, METRIC
from celery_mcp_tasks.model import TaskRecord, TaskStatus
from celery_mcp_tasks.plugin import Plugin, Runtime
from celery_mcp_tasks.service import ENQUEUE_FAILED

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry
    from starlette.routing import BaseRoute

    from celery_mcp_tasks.store.base import Store

__all__ = [
    "OTHER",
    "PREFIX",
    "Families",
    "JanitorMetrics",
    "Prometheus",
    "PushMetrics",
    "TaskMetrics",
    "families",
    "queued_at",
    "use_multiprocess",
]

logger = logging.getLogger("celery_mcp_tasks.ops.metrics")

PREFIX = "mcp_tasks"
OTHER = "other"
"""The `tool` label of a record whose tool this app does not register (bounded cardinality)."""
EXPIRED = "expired"
"""The `status` label of `mcp_tasks_finished_total` for a task its TTL removed before it was final."""

QUEUE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
RUN_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 7200, 21600)
INPUT_BUCKETS = (1, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 7200, 21600, 43200, 86400)
PUSH_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)

JANITOR_ACTIONS = {"removed": "evicted", "resent": "resent", "failed": "failed_lost", "expired_inputs": "expired_input"}
"""Sweep report keys -> the `action` label of `mcp_tasks_janitor_tasks_total` (other keys are not counted)."""


class Families:
    """Every metric this package exports, registered in one registry."""

    def __init__(self, registry: CollectorRegistry | None) -> None:
        from prometheus_client import Counter, Gauge, Histogram

        def counter(name: str, doc: str, labels: tuple[str, ...] = ()) -> Counter:
            return Counter(f"{PREFIX}_{name}", doc, labels, registry=registry)

        def histogram(name: str, doc: str, labels: tuple[str, ...], buckets: tuple[float, ...]) -> Histogram:
            return Histogram(f"{PREFIX}_{name}", doc, labels, registry=registry, buckets=buckets)

        tool = ("tool",)
        self.created = counter("created", "Tasks created", tool)
        self.finished = counter(
            "finished", "Tasks that reached a final status, or expired before one", ("tool", "status")
        )
        self.enqueue_failures = counter("enqueue_failures", "Tasks failed because their job could not be sent", tool)
        self.queue_wait = histogram(
            "queue_wait_seconds", "From the write that queued a run to the run's start", tool, QUEUE_BUCKETS
        )
        self.run = histogram(
            "run_seconds", "From a run's start to its end (a final status or a question)", tool, RUN_BUCKETS
        )
        self.duration = histogram(
            "duration_seconds", "From creation to the final status", ("tool", "status"), RUN_BUCKETS
        )
        self.input_wait = histogram(
            "input_wait_seconds", "Time in input_required, from its last write to the answer", tool, INPUT_BUCKETS
        )
        self.janitor_sweeps = counter("janitor_sweeps", "Janitor sweeps this process ran")
        self.janitor_tasks = counter("janitor_tasks", "Tasks the janitor acted on, by action", ("action",))
        self.listen_streams = Gauge(
            f"{PREFIX}_listen_streams",
            "Open subscriptions/listen streams",
            registry=registry,
            multiprocess_mode="livesum",
        )
        self.push_latency = histogram(
            "push_notify_latency_seconds", "From a hint waking a listen stream to its notification", (), PUSH_BUCKETS
        )
        self.store_errors = counter(
            "store_errors", "Database errors met by the task store, by operation", ("operation",)
        )
        self.scrape_errors = counter("scrape_errors", "Parts of a /metrics scrape that could not be read", ("source",))


_lock = threading.Lock()
_families: Families | None = None


def families() -> Families:
    """This process's metrics in prometheus_client's default registry, made on first use."""
    global _families
    if _families is None:
        with _lock:
            if _families is None:
                from prometheus_client import REGISTRY

                _families = Families(REGISTRY)
    return _families


def use_multiprocess(directory: str) -> bool:
    """Count in per-process files under `directory` from now on (a worker, before its pool forks).

    False when this process already made its metric objects in memory: they would
    keep counting there, unseen by the exporter that reads the files.
    """
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = directory
    from prometheus_client import values

    if getattr(values.ValueClass, "_multiprocess", False):
        return True
    if _families is not None:
        logger.warning("metrics: counted in memory before the worker started; its pool's counts are not exported")
        return False
    values.ValueClass = values.MultiProcessValue()  # type: ignore[no-untyped-call]
    return True


def multiprocess() -> bool:
    """Whether this process counts in multiprocess files (so an exporter must read them all)."""
    from prometheus_client import values

    return bool(getattr(values.ValueClass, "_multiprocess", False)) and bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))


def queued_at(before: TaskRecord) -> int:
    """When the run that starts after `before` was queued: its send, an answer, or a retry's due time.

    A retry's write sets `updated_at` when Celery schedules it and moves
    `heartbeat_at` to the end of its countdown; a send leaves `updated_at` alone
    and sets `heartbeat_at`. The later of the two is when the run could start, so
    a queue wait never includes a retry's countdown.
    """
    return max(before.updated_at, before.heartbeat_at or 0)


def _seconds(later_ms: int, earlier_ms: int) -> float:
    """Clocks of two processes: a small skew must not become a negative duration."""
    return max(later_ms - earlier_ms, 0) / 1000.0


class TaskMetrics:
    """The Observer: counts and times each committed change from (before, after) alone."""

    def __init__(self, tools: Collection[str], metrics: Callable[[], Families] = families) -> None:
        self._tools = tools  # the app's live registry of task tools: tools declared later count too
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


class JanitorMetrics:
    """A sweep hook: the sweeps this process ran, what they did (known report keys only), and the
    tasks they evicted unfinished (`finished{status="expired"}`, by tool). Other names are ignored."""

    def __init__(self, metrics: Callable[[], Families] = families, *, tools: Collection[str] = ()) -> None:
        self._metrics = metrics
        self._tools = tools  # the app's live registry of task tools, as for `TaskMetrics`

    def __call__(self, name: str, counts: dict[str, int]) -> None:
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
                    m.finished.labels(tool if tool in self._tools else OTHER, EXPIRED).inc(count)


class PushMetrics:
    """The listen handler's observer: open streams, and how fast a hint becomes a notification."""

    def __init__(self, metrics: Callable[[], Families] = families) -> None:
        self._metrics = metrics

    def stream_opened(self) -> None:
        self._metrics().listen_streams.inc()

    def stream_closed(self) -> None:
        self._metrics().listen_streams.dec()

    def notified(self, latency_s: float) -> None:
        self._metrics().push_latency.observe(max(latency_s, 0.0))


_DEFAULT_PORT: Any = object()


class Prometheus(Plugin):
    """The metrics plugin (MCP_TASKS_METRICS=on): every process counts what it committed; the web
    process serves `/metrics` on the operations app (`McpTasks.ops_app()`), and each `celery worker`
    serves its own and its prefork children's on `worker_port` (default MCP_TASKS_WORKER_METRICS_PORT,
    9808; None: no worker endpoint). prometheus_client is imported on first use."""

    def __init__(self, *, worker_port: int | None = _DEFAULT_PORT) -> None:
        self._worker_port = worker_port
        self._tasks: TaskMetrics | None = None
        self._janitor: JanitorMetrics | None = None
        self._push = PushMetrics()
        self._route: BaseRoute | None = None

    def setup(self, runtime: Runtime) -> None:
        from starlette.routing import Route

        from celery_mcp_tasks.ops import metrics_scrape, worker_metrics

        settings = runtime.settings
        self._tasks = TaskMetrics(runtime.tools)
        self._janitor = JanitorMetrics(tools=runtime.tools)
        port = settings.worker_metrics_port if self._worker_port is _DEFAULT_PORT else self._worker_port
        # The embedded default is one machine (as `serve` binds 127.0.0.1); a deployment is scraped from afar.
        local = settings.database_url is None and settings.embedded_broker
        worker_metrics.install(runtime.celery, port, addr="127.0.0.1" if local else "0.0.0.0")
        scrape = metrics_scrape.endpoint(runtime.service, settings.janitor_interval_s)
        self._route = Route("/metrics", scrape, methods=["GET"])

    def task_changed(self, before: TaskRecord | None, after: TaskRecord) -> None:
        if self._tasks is not None:
            self._tasks.task_changed(before, after)

    def swept(self, name: str, counts: dict[str, int]) -> None:
        if self._janitor is not None:
            self._janitor(name, counts)

    def store_built(self, store: Store) -> None:
        from celery_mcp_tasks.ops.metrics_scrape import count_store_errors

        count_store_errors(store)

    def stream_opened(self) -> None:
        self._push.stream_opened()

    def stream_closed(self) -> None:
        self._push.stream_closed()

    def stream_notified(self, latency_s: float) -> None:
        self._push.notified(latency_s)

    def routes(self) -> list[BaseRoute]:
        return [self._route] if self._route is not None else []
