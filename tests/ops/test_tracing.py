"""Traces without processes: what a creation stores, what a send puts in a real Celery message, the extra,
the providers and which worker pools build theirs after the fork.

No SDK provider is set in this process (a global one would leak into other tests):
opentelemetry-api alone still propagates a context, which is what MCP_TASKS_TRACING=off
relies on. The SDK pieces (`_provider`) are exercised on providers of their own; a broken
sampler or processor: test_tracing_faults. The real processes, exporting to a collector:
tests/integration/test_tracing.py (and the one-line refusal at the end here starts two).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from celery import Celery, signals
from opentelemetry import baggage, propagate, trace
from opentelemetry import context as otel_context
from opentelemetry.propagators.composite import CompositePropagator
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from celery_mcp_tasks import propagation
from celery_mcp_tasks.app import internals
from celery_mcp_tasks.config import ConfigError, Settings
from celery_mcp_tasks.ops import tracing
from celery_mcp_tasks.worker.dispatch import CeleryDispatcher
from tests.builders import record
from tests.support import ROOT

CLIENT_TRACE = 0x4BF92F3577B34DA6A3CE929D0E0E4736
OTHER_TRACE = 0x0AF7651916CD43DD8448EB211C80319C


def remote(trace_id: int, span_id: int = 0x00F067AA0BA902B7) -> NonRecordingSpan:
    """A span context as a caller's `traceparent` brings it (sampled)."""
    return NonRecordingSpan(SpanContext(trace_id, span_id, is_remote=True, trace_flags=TraceFlags(TraceFlags.SAMPLED)))


def trace_id_of(traceparent: str | None) -> int | None:
    return None if traceparent is None else int(traceparent.split("-")[1], 16)


def test_a_creation_stores_the_traceparent_of_the_call_it_is_part_of():
    with trace.use_span(remote(CLIENT_TRACE)), propagation.creating("report") as stored:
        assert trace_id_of(stored) == CLIENT_TRACE
    assert stored is not None and len(stored) == 55  # 00-<32 hex>-<16 hex>-<2 hex>: fits the 512-char column


@pytest.mark.parametrize("flags", [TraceFlags.SAMPLED, TraceFlags.DEFAULT])
def test_the_stored_traceparent_is_what_the_w3c_propagator_writes(flags: int):
    span = NonRecordingSpan(
        SpanContext(CLIENT_TRACE, 0x00000000000000AB, is_remote=False, trace_flags=TraceFlags(flags))
    )
    with trace.use_span(span):
        carrier: dict[str, str] = {}
        propagation._W3C.inject(carrier)
        assert propagation.current_traceparent() == carrier["traceparent"]


def test_a_send_writes_its_headers_with_the_applications_propagators(monkeypatch: pytest.MonkeyPatch):
    class Custom(TraceContextTextMapPropagator):  # the trace context's very fields, written otherwise
        def inject(self, carrier: Any, context: Any = None, setter: Any = None) -> None:
            carrier["x-custom"] = "1"

    for textmap in (Custom(), CompositePropagator([TraceContextTextMapPropagator(), Custom()])):
        monkeypatch.setattr(propagation.propagate, "_HTTP_TEXT_FORMAT", textmap)
        headers: dict[str, Any] = {}
        with trace.use_span(remote(CLIENT_TRACE)), propagation.sending(None, headers):
            pass
        assert headers["x-custom"] == "1"


def test_a_send_carries_the_callers_baggage_with_the_default_propagators():
    token = otel_context.attach(baggage.set_baggage("tenant", "a b", trace.set_span_in_context(remote(CLIENT_TRACE))))
    try:
        headers: dict[str, Any] = {}
        with propagation.sending(None, headers):
            pass
    finally:
        otel_context.detach(token)
    assert trace_id_of(headers["traceparent"]) == CLIENT_TRACE and "tenant" in headers["baggage"]


def test_a_creation_outside_any_trace_stores_nothing():
    with propagation.creating("report") as stored:
        assert stored is None


def test_a_failed_creation_still_raises_through_its_span():
    with pytest.raises(RuntimeError, match="row cap"), propagation.creating("report"):
        raise RuntimeError("row cap")


@pytest.fixture
def memory_celery() -> Iterator[tuple[Celery, str]]:
    app = Celery(f"tracing-{uuid.uuid4().hex[:6]}", broker="memory://")
    queue = f"q-{uuid.uuid4().hex[:8]}"
    app.conf.task_default_queue = queue
    yield app, queue
    app.close()


def _sent_headers(app: Celery, queue: str) -> dict[str, Any]:
    with app.connection_for_read() as connection:
        inbox = connection.SimpleQueue(queue)
        try:
            message = inbox.get(timeout=5)
            message.ack()
            return dict(message.headers)
        finally:
            inbox.close()


def test_every_send_carries_the_tasks_own_context_in_the_message_headers(memory_celery: tuple[Celery, str]):
    """A resend after `tasks/update` runs inside that request's span: the message still names the task's trace."""
    app, queue = memory_celery
    tools = {"report": SimpleNamespace(name="report", celery_name="jobs.report", terminate=False)}
    dispatcher = CeleryDispatcher(app, tools)  # type: ignore[arg-type]
    with trace.use_span(remote(CLIENT_TRACE)), propagation.creating("report") as stored:
        pass
    task = replace(record(key="ab" * 32, tool="report", dispatches=2), trace_context=stored)
    with trace.use_span(remote(OTHER_TRACE)):  # the answering request's own trace
        dispatcher.send(task)
    headers = _sent_headers(app, queue)
    assert trace_id_of(headers["traceparent"]) == CLIENT_TRACE
    assert headers["mcp_task_key"] == task.key and headers["mcp_task_dispatch"] == 2
    assert trace_id_of(propagation.current_traceparent()) is None  # the send's context was detached after it


def test_a_row_without_a_context_sends_in_the_callers(memory_celery: tuple[Celery, str]):
    app, queue = memory_celery
    tools = {"report": SimpleNamespace(name="report", celery_name="jobs.report", terminate=False)}
    with trace.use_span(remote(OTHER_TRACE)):
        CeleryDispatcher(app, tools).send(record(key="cd" * 32, tool="report", dispatches=1))  # type: ignore[arg-type]
    assert trace_id_of(_sent_headers(app, queue)["traceparent"]) == OTHER_TRACE


def test_a_worker_reads_the_context_from_a_request_like_celery_builds_it():
    """Message headers become request attributes; a retry's copy keeps them in `request.headers`."""
    from celery.app.task import Context

    traceparent = f"00-{CLIENT_TRACE:032x}-00f067aa0ba902b7-01"
    for request in (Context(traceparent=traceparent), Context(headers={"traceparent": traceparent})):
        found = trace.get_current_span(propagate.extract(request, getter=tracing._GETTER)).get_span_context()
        assert found.trace_id == CLIENT_TRACE


def test_a_status_change_becomes_an_event_on_the_current_span_only_when_it_records():
    events = tracing.Tracing()
    before = record(key="ef" * 32)
    events.task_changed(None, before)  # a non-recording span: nothing to do, nothing raised
    with trace.use_span(remote(CLIENT_TRACE)):
        events.task_changed(before, replace(before, version=2))


# -- the extra ---------------------------------------------------------------------------------------


def test_a_mode_without_its_extra_says_which_pip_install(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setitem(sys.modules, "opentelemetry.sdk", None)  # as if opentelemetry-sdk were not installed
    for mode in ("otlp", "console"):
        with pytest.raises(
            ConfigError, match=r"MCP_TASKS_TRACING=\w+ needs the otel extra .*pip install 'celery-mcp-tasks\[otel\]'"
        ):
            tracing.require_extra(mode)


def test_the_otlp_mode_needs_the_exporter_too(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setitem(sys.modules, "opentelemetry.exporter.otlp.proto.http", None)
    tracing.require_extra("console")
    with pytest.raises(ConfigError, match=r"opentelemetry\.exporter\.otlp\.proto\.http is missing"):
        tracing.require_extra("otlp")


def test_installing_tracing_without_the_extra_is_a_config_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    from celery_mcp_tasks import McpTasks

    tasks = McpTasks("extra-check", settings=Settings(data_dir=tmp_path))
    monkeypatch.setitem(sys.modules, "opentelemetry.sdk", None)
    with pytest.raises(ConfigError, match=r"^MCP_TASKS_TRACING=console needs the otel extra"):
        tracing.Tracing(exporter="console").setup(tasks)


def test_an_app_asking_for_traces_without_the_extra_stops_with_one_line(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
):
    from celery_mcp_tasks import McpTasks

    monkeypatch.setitem(sys.modules, "opentelemetry.sdk", None)
    with pytest.raises(SystemExit) as stopped:
        McpTasks("no-extra", settings=Settings(data_dir=tmp_path, tracing="otlp"))
    message = str(stopped.value)
    assert message.startswith("celery-mcp-tasks: configuration error: MCP_TASKS_TRACING=otlp") and "\n" not in message


def test_tracing_off_needs_nothing_more(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    from celery_mcp_tasks import McpTasks

    monkeypatch.setitem(sys.modules, "opentelemetry.sdk", None)
    assert not internals(
        McpTasks("off", settings=Settings(data_dir=tmp_path))
    ).observers  # no plugin: no observer at all
    on = McpTasks("on", settings=Settings(data_dir=tmp_path, tracing="on"))  # spans to the application's provider
    assert [type(plugin) for plugin in internals(on).plugins] == [tracing.Tracing]
    assert list(internals(on).observers) == internals(on).plugins
    assert isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)  # no provider of ours, ever


# -- the providers (each its own, never the global one) -------------------------------------------------


def test_the_console_exporter_writes_one_json_span_a_line_on_the_real_stdout(capfd: pytest.CaptureFixture[str]):
    provider = tracing._provider("console", "console-test")
    span = provider.get_tracer("t").start_span("tasks create report", attributes={propagation.TOOL: "report"})
    span.end()
    provider.shutdown()
    lines = [line for line in capfd.readouterr().out.splitlines() if line.startswith("{")]
    assert len(lines) == 1
    exported = json.loads(lines[0])
    assert exported["name"] == "tasks create report" and exported["attributes"] == {propagation.TOOL: "report"}
    assert exported["resource"]["attributes"]["service.name"] == "console-test"


@pytest.fixture
def silent_collector() -> Iterator[str]:
    """A port that accepts connections (the kernel's backlog) and never answers: each export waits its timeout."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    yield f"http://127.0.0.1:{server.getsockname()[1]}"
    server.close()


def test_an_unreachable_collector_never_holds_the_caller(monkeypatch: pytest.MonkeyPatch, silent_collector: str):
    """Spans end at once while the exporter waits behind them, and the last flush at exit is bounded by ours.

    The flush it leaves behind ends (each export gives up after its 0.5 s timeout, too soon to
    retry) and is joined here: no exporter thread outlives the test to log into later ones.
    """
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", silent_collector)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "0.5")
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "10")
    monkeypatch.setenv("OTEL_BSP_MAX_QUEUE_SIZE", "128")
    monkeypatch.setenv("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "64")
    before = set(threading.enumerate())
    provider = tracing._provider("otlp", "down-test")
    tracer = provider.get_tracer("t")
    started = time.monotonic()
    for n in range(3000):  # far more than the queue holds: the rest is dropped, not waited for
        tracer.start_span(f"span {n}").end()
    assert time.monotonic() - started < 2.0
    monkeypatch.setattr(tracing._process, "provider", provider)
    monkeypatch.setattr(tracing, "_STOP_S", 0.2)
    started = time.monotonic()
    tracing.shutdown()
    assert time.monotonic() - started < 0.6  # our bound: what is still queued takes the exporter >= 1 s
    left = [thread for thread in threading.enumerate() if thread not in before]
    assert left  # the flush, still waiting on the collector
    for thread in left:
        thread.join(10)
    assert not [thread.name for thread in left if thread.is_alive()]


# -- which pools fork -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pool", "forks"),
    [
        ("prefork", True),
        ("processes", True),  # Celery's compat alias for the same billiard pool
        ("celery.concurrency.prefork:TaskPool", True),
        ("solo", False),
        ("threads", False),
        ("no.such.pool:Pool", False),
    ],
)
def test_a_pool_forks_when_it_resolves_to_the_prefork_pool(pool: str, forks: bool):
    assert tracing._forks(pool) is forks


def test_pool_classes_are_judged_by_what_they_are_not_where_they_live():
    from celery.concurrency.prefork import TaskPool
    from celery.concurrency.solo import TaskPool as SoloPool

    subclass = type("MyPrefork", (TaskPool,), {"__module__": "myapp.pools"})
    assert tracing._forks(TaskPool) and tracing._forks(subclass) and not tracing._forks(SoloPool)


def test_a_worker_with_a_processes_pool_leaves_the_provider_to_its_children(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
):
    from celery_mcp_tasks import McpTasks

    tasks = McpTasks("pools", settings=Settings(data_dir=tmp_path))
    configured: list[str] = []
    monkeypatch.setattr(tracing, "configure", lambda mode, name: configured.append(mode))
    _receivers = tracing._install_worker_provider(tasks.celery, tasks.name, "console")  # weak: kept here

    class Worker:  # what `worker_init` sends: the WorkController, its pool still a name (`app.Worker(pool=...)`)
        def __init__(self, pool: str) -> None:
            self.app, self.pool_cls = tasks.celery, pool

    for pool in ("processes", "prefork", "solo"):
        signals.worker_init.send(sender=Worker(pool))
    assert configured == ["console"]  # solo only: the jobs run in that very process; prefork children build theirs


# -- a missing extra, for the processes users start ------------------------------------------------------


@pytest.mark.integration
@pytest.mark.parametrize(
    "argv",
    [
        ["-m", "celery", "-A", "tests.apps.runtime_app", "worker", "--pool", "solo"],
        ["-m", "celery_mcp_tasks.cli", "serve", "tests.apps.runtime_app", "--port", "0"],
    ],
    ids=["celery-worker", "serve"],
)
def test_a_process_asking_for_traces_without_the_extra_stops_with_one_line(argv: list[str], tmp_path: Path):
    """`celery -A` would wrap a plain exception in its "Unable to load celery application" traceback."""
    hidden = tmp_path / "no_otel_sdk"
    hidden.mkdir()
    (hidden / "sitecustomize.py").write_text("import sys\nsys.modules['opentelemetry.sdk'] = None  # not installed\n")
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("MCP_TASKS_", "CELERY_"))},
        "PYTHONPATH": f"{hidden}:{ROOT / 'src'}:{ROOT}",
        "MCP_TASKS_DATA_DIR": str(tmp_path / "data"),
        "MCP_TASKS_TRACING": "otlp",
    }
    done = subprocess.run([sys.executable, *argv], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert done.stderr.strip().splitlines() == [
        "celery-mcp-tasks: configuration error: MCP_TASKS_TRACING=otlp needs the otel extra "
        "(opentelemetry.sdk is missing): pip install 'celery-mcp-tasks[otel]'"
    ], done.stderr
