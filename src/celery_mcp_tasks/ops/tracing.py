"""Traces in the worker: a run span per job (Celery signals), the status events, and the providers
MCP_TASKS_TRACING=otlp|console sets (the stock SDK ones, in the web process and each worker process).

Never a task id, an argument, a result or an exception's text in a span; the row key's first 8 hex
digits at most. A span that cannot be started or ended costs that span, never the job.
"""

from __future__ import annotations

import atexit
import functools
import importlib.util
import logging
import os
import sys
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

from opentelemetry import propagate, trace
from opentelemetry.propagators.textmap import Getter
from opentelemetry.trace import SpanKind

from celery_mcp_tasks.config import ConfigError
from celery_mcp_tasks.model import TaskRecord
from celery_mcp_tasks.ops.redaction import KEY_SHOWN
from celery_mcp_tasks.plugin import Plugin, Runtime
from celery_mcp_tasks.propagation import TOOL, end_span, mark_failed, start_span, warn_once

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider

logger = logging.getLogger("celery_mcp_tasks.ops")

EXTRA = "pip install 'celery-mcp-tasks[otel]'"
KEY_PREFIX = "mcp_task.key_prefix"
DISPATCH = "mcp_task.dispatch"
ATTEMPT = "mcp_task.attempt"
STATUS = "mcp_task.status"
RUN_END = "mcp_task.run_end"
_STOP_S = 5.0  # the bound on the last flush at exit: a collector that is down never holds a shutdown
_SPAN = "_mcp_run_span"  # request attribute: our run span and the context token of its run


class _RequestGetter(Getter[Any]):
    """A propagator's fields from a Celery request: message headers are its attributes (or `.headers`)."""

    def get(self, carrier: Any, key: str) -> list[str] | None:
        value = getattr(carrier, key, None)
        if value is None:
            value = (getattr(carrier, "headers", None) or {}).get(key)
        return [value] if isinstance(value, str) else None

    def keys(self, carrier: Any) -> list[str]:
        return list(getattr(carrier, "headers", None) or {})


_GETTER = _RequestGetter()


def _celery_instrumented() -> bool:
    """opentelemetry-instrumentation-celery is active here: its spans are the message's, ours would duplicate them."""
    module = sys.modules.get("opentelemetry.instrumentation.celery")
    if module is None:
        return False
    try:
        return bool(module.CeleryInstrumentor().is_instrumented_by_opentelemetry)
    except Exception:  # noqa: BLE001 - an instrumentor we cannot ask is one we do not defer to
        return False


def _ours(task: Any) -> tuple[Any, str, Any] | None:
    """(request, row key, run) when `task` runs an MCP task's message; None for anything else."""
    from celery_mcp_tasks.worker.job import McpJob, row_key, run_of

    if not isinstance(task, McpJob):
        return None
    request = task.request
    key = row_key(request)
    if key is None:
        return None
    return request, key, run_of(request)


def _attributes(tool: str, key: str, run: Any) -> dict[str, Any]:
    attributes: dict[str, Any] = {TOOL: tool, KEY_PREFIX: key[:KEY_SHOWN]}
    if run is not None:
        attributes |= {DISPATCH: run.dispatch, ATTEMPT: run.attempt + 1}
    return attributes


def _contained(receiver: Callable[..., None]) -> Callable[..., None]:
    """A run-span signal receiver that never raises: Celery would log each failure with a traceback."""

    @functools.wraps(receiver)
    def contained(*args: Any, **kwargs: Any) -> None:
        try:
            receiver(*args, **kwargs)
        except Exception as error:  # noqa: BLE001 - tracing costs the span, never the run or its log
            warn_once(f"a run span's {receiver.__name__.removeprefix('_on_')} failed", error)

    return contained


@_contained
def _on_prerun(sender: Any = None, task: Any = None, **_: Any) -> None:
    job = task or sender
    found = _ours(job)
    if found is None or _celery_instrumented():
        return
    request, key, run = found
    tool = job.mcp_tool.name
    parent = propagate.extract(request, getter=_GETTER)
    started = start_span(f"mcp_task run {tool}", _attributes(tool, key, run), parent=parent, kind=SpanKind.CONSUMER)
    if started is not None:
        setattr(request, _SPAN, started)


def _run_span(task: Any) -> tuple[trace.Span, bool] | None:
    """The span of the run `task` is in: ours (True), or the Celery instrumentor's (False)."""
    found = _ours(task)
    if found is None:
        return None
    request, key, run = found
    held = getattr(request, _SPAN, None)
    if held is not None:
        return held[0], True
    span = trace.get_current_span()
    if not span.is_recording():
        return None
    span.set_attributes(_attributes(task.mcp_tool.name, key, run))  # the instrumentor's run span
    return span, False


@_contained
def _on_success(sender: Any = None, **_: Any) -> None:
    from celery_mcp_tasks.worker.job import RUN_END as ended

    found = _run_span(sender)
    if found is not None:
        why = getattr(sender.request, ended, None)
        if isinstance(why, str):
            found[0].set_attribute(RUN_END, why)


@_contained
def _on_failure(sender: Any = None, exception: BaseException | None = None, **_: Any) -> None:
    found = _run_span(sender)
    if found is not None and found[1]:  # the instrumentor sets its own span's status
        mark_failed(found[0], exception)


@_contained
def _on_retry(sender: Any = None, **_: Any) -> None:
    found = _run_span(sender)
    if found is not None:
        found[0].add_event("mcp_task.retry")


@_contained
def _on_postrun(sender: Any = None, task: Any = None, **_: Any) -> None:
    request = getattr(task or sender, "request", None)
    held = getattr(request, _SPAN, None)
    if held is None:
        return
    delattr(request, _SPAN)
    end_span(*held)


@functools.cache
def _connect_run_spans() -> None:
    """Once per process (forked pool children inherit the receivers), like the signal bridge."""
    from celery import signals

    for signal, receiver in (
        (signals.task_prerun, _on_prerun),
        (signals.task_success, _on_success),
        (signals.task_failure, _on_failure),
        (signals.task_retry, _on_retry),
        (signals.task_postrun, _on_postrun),
    ):
        signal.connect(receiver, weak=False)


def require_extra(mode: str) -> None:
    """Raise `ConfigError` (one line naming the extra) when `mode` needs packages that are not installed."""
    needed = ["opentelemetry.sdk"]
    if mode == "otlp":
        needed.append("opentelemetry.exporter.otlp.proto.http")
    for module in needed:
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            raise ConfigError(f"MCP_TASKS_TRACING={mode} needs the otel extra ({module} is missing): {EXTRA}")


class _Process:
    """This process's provider (at most one: a pool child builds its own after the fork)."""

    lock = threading.Lock()
    pid: int | None = None
    provider: TracerProvider | None = None


_process = _Process()


def configure(mode: str, service_name: str) -> TracerProvider | None:
    """Set the global tracer provider for `mode` in this process, once; None if one was already set."""
    with _process.lock:
        if _process.pid == os.getpid():
            return _process.provider
        _process.pid = os.getpid()
        _process.provider = None
        if not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
            logger.info("tracing: a tracer provider is already set (e.g. opentelemetry-instrument); using it")
            return None
        from celery_mcp_tasks.worker.termination import termination_blocked

        with termination_blocked():  # its export thread never takes a SIGTERM (see worker.termination)
            provider = _provider(mode, service_name)
        trace.set_tracer_provider(provider)
        _process.provider = provider
        atexit.register(shutdown)
        return provider


def _provider(mode: str, service_name: str) -> TracerProvider:
    """The stock SDK provider with the stock exporter: nothing of ours between a span and the collector."""
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter

    named = "OTEL_SERVICE_NAME" in os.environ or "service.name=" in os.environ.get("OTEL_RESOURCE_ATTRIBUTES", "")
    provider = TracerProvider(
        resource=Resource.create({} if named else {SERVICE_NAME: service_name}), shutdown_on_exit=False
    )
    exporter: SpanExporter
    if mode == "otlp":  # endpoint, headers, timeout, compression: the standard OTEL_EXPORTER_OTLP_* variables
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        exporter = OTLPSpanExporter()
    else:  # one JSON object a line on the real stdout (Celery redirects sys.stdout into its logger)
        exporter = ConsoleSpanExporter(
            out=sys.__stdout__ or sys.stdout, formatter=lambda span: str(span.to_json(indent=None)) + "\n"
        )
    provider.add_span_processor(BatchSpanProcessor(exporter))  # drops, never blocks, when the export fails
    return provider


def shutdown() -> None:
    """Flush and stop this process's provider, within `_STOP_S` (a flush to a dead collector is left behind)."""
    with _process.lock:
        provider, _process.provider = _process.provider, None
    if provider is None:
        return
    from celery_mcp_tasks.worker.termination import start_thread

    stopping = start_thread(provider.shutdown, "mcp-tasks-trace-flush")  # may be left behind in an ending process
    stopping.join(_STOP_S)


def _forks(pool_cls: Any) -> bool:
    """A prefork (billiard) pool: its children run the jobs, so each configures itself after the fork. At
    `worker_init` the pool may still be a name (`prefork`, `processes`): Celery's aliases resolve it."""
    from celery.concurrency import get_implementation

    try:
        cls = get_implementation(pool_cls) if isinstance(pool_cls, str) else pool_cls
        from celery.concurrency.prefork import TaskPool
    except Exception:  # noqa: BLE001 - a pool Celery cannot load either stops the worker right after this
        return False
    return isinstance(cls, type) and issubclass(cls, TaskPool)


def _install_worker_provider(celery: Any, name: str, mode: str) -> list[Callable[..., None]]:
    """The stock provider in each process of `celery`'s worker that runs jobs. The receivers are connected weakly
    and returned: the plugin keeps them, and takes them along when it goes."""
    from celery import signals

    def in_worker(sender: Any = None, **_: Any) -> None:
        if getattr(sender, "app", None) is celery and not _forks(getattr(sender, "pool_cls", "prefork")):
            configure(mode, name)  # solo, threads, gevent: the jobs run in this very process

    def in_child(**_: Any) -> None:
        configure(mode, name)

    def stopping(**_: Any) -> None:
        shutdown()

    signals.worker_process_init.connect(in_child)
    signals.worker_init.connect(in_worker)
    signals.worker_process_shutdown.connect(stopping)
    signals.worker_shutdown.connect(stopping)
    return [in_child, in_worker, stopping]


@asynccontextmanager
async def _provider_while_serving(mode: str, name: str) -> AsyncIterator[None]:
    import anyio.to_thread

    configure(mode, name)
    try:
        yield
    finally:
        await anyio.to_thread.run_sync(shutdown)


class Tracing(Plugin):
    """The tracing plugin: a span for each run of a job in the worker, and each status a write sets as
    an attribute and event on the current span. The spans go to the application's tracer provider
    (e.g. `opentelemetry-instrument`); with `exporter="otlp"|"console"` (MCP_TASKS_TRACING=otlp|console,
    the otel extra) this plugin sets the stock SDK provider and exporter in the web process and in each
    worker process, where none is set. Without this plugin, every task still carries its trace context
    through the Celery headers (opentelemetry-api, a no-op without a provider)."""

    def __init__(self, *, exporter: str | None = None) -> None:
        if exporter not in (None, "otlp", "console"):
            raise ConfigError(f"MCP_TASKS_TRACING: expected on, otlp or console, got {exporter!r}")
        self.exporter = exporter
        self._name = "celery-mcp-tasks"
        self._receivers: list[Callable[..., None]] = []  # every app's it was set up on (a shared plugin)

    def setup(self, runtime: Runtime) -> None:
        """Only registers (signals, a serving context). A missing extra is a `ConfigError` naming it."""
        if self.exporter is not None:
            require_extra(self.exporter)
            self._name = runtime.name
            self._receivers += _install_worker_provider(runtime.celery, runtime.name, self.exporter)
        _connect_run_spans()

    def task_changed(self, before: TaskRecord | None, after: TaskRecord) -> None:
        """Each status a write sets is attributes (tool, key prefix, status) on the span current there (a run,
        a `tasks/*` request: which task it changed, as its own trace is the caller's) and, after the creation, an
        event; a creation's is attributes only, on the span the row is inserted in: its time is the span's own,
        and an event costs ~0.7 % of a creation (callgrind)."""
        if before is not None and before.status is after.status:
            return
        span = trace.get_current_span()
        if not span.is_recording():
            return
        span.set_attributes({TOOL: after.tool, KEY_PREFIX: after.key[:KEY_SHOWN], STATUS: after.status.value})
        if before is not None:
            span.add_event("mcp_task.status", {STATUS: after.status.value})

    def serving(self) -> Any:
        return None if self.exporter is None else _provider_while_serving(self.exporter, self._name)
