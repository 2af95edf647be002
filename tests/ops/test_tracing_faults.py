"""A broken sampler, span processor or propagator costs a span (one warning a process), never the call.

Real SDK providers of the tests' own, given to our spans as `propagation.TRACER` (no test sets
the global one); the run-span receivers called as Celery's signals call them, on a real McpJob.
With real processes: tests/integration/test_tracing.py (a sampler that raises for our spans).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_ON, Sampler, SamplingResult
from opentelemetry.trace import Link, NonRecordingSpan, SpanContext, SpanKind, StatusCode, TraceFlags
from opentelemetry.util.types import Attributes

from celery_mcp_tasks import propagation
from celery_mcp_tasks.config import Settings
from celery_mcp_tasks.model import TaskStatus, new_task_id, task_key
from celery_mcp_tasks.ops import tracing
from celery_mcp_tasks.worker.job import DISPATCH_HEADER, KEY_HEADER
from tests.builders import record

CLIENT_TRACE = 0x4BF92F3577B34DA6A3CE929D0E0E4736


def remote(trace_id: int) -> NonRecordingSpan:
    """A span context as a caller's `traceparent` brings it (sampled)."""
    flags = TraceFlags(TraceFlags.SAMPLED)
    return NonRecordingSpan(SpanContext(trace_id, 0x00F067AA0BA902B7, is_remote=True, trace_flags=flags))


def trace_id_of(traceparent: str | None) -> int | None:
    return None if traceparent is None else int(traceparent.split("-")[1], 16)


class RaisingSampler(Sampler):
    def should_sample(
        self,
        parent_context: Context | None,
        trace_id: int,
        name: str,
        kind: SpanKind | None = None,
        attributes: Attributes = None,
        links: Sequence[Link] | None = None,
        trace_state: Any = None,
    ) -> SamplingResult:
        raise RuntimeError("sampler broken")

    def get_description(self) -> str:
        return "raising"


class BrokenProcessor(SpanProcessor):
    def __init__(self, at: str) -> None:
        self.at = at

    def on_start(self, span: Any, parent_context: Context | None = None) -> None:
        if self.at == "start":
            raise RuntimeError("processor broken at start")

    def on_end(self, span: ReadableSpan) -> None:
        if self.at == "end":
            raise RuntimeError("processor broken at end")


def broken_provider(broken: str) -> TracerProvider:
    if broken == "sampler":
        return TracerProvider(sampler=RaisingSampler())
    provider = TracerProvider()
    provider.add_span_processor(BrokenProcessor(broken))
    return provider


def use_provider(monkeypatch: pytest.MonkeyPatch, provider: TracerProvider) -> None:
    """Our spans come from `provider`, as if it were the global one (which a test must never set)."""
    monkeypatch.setattr(propagation, "TRACER", provider.get_tracer("celery_mcp_tasks"))
    monkeypatch.setattr(propagation, "_no_provider", lambda: False)
    monkeypatch.setattr(propagation, "_warned", set())


def tracing_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


@pytest.mark.parametrize("broken", ["sampler", "start", "end"])
def test_a_broken_sampler_or_processor_costs_a_creation_its_span_never_the_call(
    broken: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
):
    use_provider(monkeypatch, broken_provider(broken))
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            with trace.use_span(remote(CLIENT_TRACE)), propagation.creating("report") as stored:
                assert trace_id_of(stored) == CLIENT_TRACE  # the row still joins the caller's trace
            assert propagation.current_traceparent() is None  # nothing left attached
    warned = tracing_warnings(caplog)
    assert len(warned) == 1 and warned[0].startswith("tracing: could not"), warned  # once per process


def test_a_failed_creation_marks_its_span_with_the_exception_type_only(monkeypatch: pytest.MonkeyPatch):
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    use_provider(monkeypatch, provider)
    with pytest.raises(RuntimeError, match="row cap"), propagation.creating("report"):
        raise RuntimeError("row cap, said with an argument")
    (span,) = exporter.get_finished_spans()
    assert span.name == "tasks create report" and span.status.status_code is StatusCode.ERROR
    assert span.status.description == "RuntimeError" and not span.events  # no exception event with its message


def test_a_call_the_sampler_left_out_gets_no_span_of_ours_and_its_task_stays_out(monkeypatch: pytest.MonkeyPatch):
    exporter = InMemorySpanExporter()
    provider = TracerProvider(sampler=ALWAYS_ON)  # would record a span of ours: only our check keeps it out
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    use_provider(monkeypatch, provider)
    unsampled = NonRecordingSpan(SpanContext(CLIENT_TRACE, 0x00F067AA0BA902B7, is_remote=False))
    with trace.use_span(unsampled), propagation.creating("report") as stored:
        pass
    assert stored == f"00-{CLIENT_TRACE:032x}-00f067aa0ba902b7-00"  # the unsampled context, as the runs will see it
    assert exporter.get_finished_spans() == ()
    with trace.use_span(remote(CLIENT_TRACE)), propagation.creating("report"):  # a sampled caller: our span
        pass
    assert [span.name for span in exporter.get_finished_spans()] == ["tasks create report"]


def test_a_broken_propagator_costs_a_send_its_context_never_the_send(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
):
    class Broken(propagation._W3C.__class__):
        def inject(self, *_: Any, **__: Any) -> None:
            raise RuntimeError("propagator broken")

    monkeypatch.setattr(propagation.propagate, "_HTTP_TEXT_FORMAT", Broken())  # the global propagator
    monkeypatch.setattr(propagation, "_warned", set())
    headers: dict[str, Any] = {}
    with caplog.at_level(logging.WARNING):
        for _ in range(2):
            with propagation.sending(f"00-{CLIENT_TRACE:032x}-00f067aa0ba902b7-01", headers):
                assert trace_id_of(propagation.current_traceparent()) == CLIENT_TRACE
    assert "traceparent" not in headers and propagation.current_traceparent() is None
    assert len(tracing_warnings(caplog)) == 1


@pytest.fixture
def job(tmp_path: Path) -> Iterator[Any]:
    """A real McpJob, its request as a worker builds it from our message headers."""
    from celery_mcp_tasks import McpTasks

    tasks = McpTasks("run-spans", settings=Settings(data_dir=tmp_path))

    @tasks.mcp_task(shared=False)
    def report() -> str:
        return "done"

    report.push_request(**{KEY_HEADER: task_key(new_task_id()), DISPATCH_HEADER: 1}, retries=0)
    yield report
    report.pop_request()
    tasks.celery.close()


@pytest.mark.parametrize("broken", ["sampler", "start", "end"])
def test_a_broken_sampler_or_processor_costs_a_run_its_span_never_the_job(
    broken: str, job: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
):
    """Our receivers, called as Celery's signals call them: none raises (Celery would log each with a traceback)."""
    use_provider(monkeypatch, broken_provider(broken))
    run = {"task_id": "celery-1", "task": job, "args": (), "kwargs": {}}
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            tracing._on_prerun(sender=job, **run)
            tracing._on_failure(sender=job, task_id="celery-1", exception=ValueError("x"))
            tracing._on_postrun(sender=job, retval=None, state="FAILURE", **run)
            assert propagation.current_traceparent() is None
    warned = tracing_warnings(caplog)
    assert len(warned) == 1 and warned[0].startswith("tracing: could not"), warned


def test_a_creation_that_fails_before_its_row_still_names_the_tool_on_the_call(monkeypatch: pytest.MonkeyPatch):
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    use_provider(monkeypatch, provider)
    call = provider.get_tracer("sdk").start_as_current_span("tools/call report")
    with call, pytest.raises(RuntimeError, match="row cap"), propagation.creating("report"):
        raise RuntimeError("row cap")
    (span,) = exporter.get_finished_spans()
    assert dict(span.attributes or {}) == {propagation.TOOL: "report"}


def test_inside_a_recording_span_a_creation_adds_its_attributes_not_a_span(monkeypatch: pytest.MonkeyPatch):
    """The SDK's `tools/call` span is the creation's: one span per creation, with the tool, the key
    prefix and the status on it (set with the row, by the observer), and no event."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    use_provider(monkeypatch, provider)
    sdk = provider.get_tracer("sdk")
    with sdk.start_as_current_span("tools/call report") as call, propagation.creating("report") as stored:
        assert trace_id_of(stored) == call.get_span_context().trace_id
        assert stored is not None and f"{call.get_span_context().span_id:016x}" in stored  # runs hang off it
        tracing.Tracing().task_changed(None, record(key="ab12cd34" * 8, tool="report"))
    (span,) = exporter.get_finished_spans()
    assert span.name == "tools/call report" and not span.events
    assert dict(span.attributes or {}) == {
        propagation.TOOL: "report",
        tracing.KEY_PREFIX: "ab12cd34",
        tracing.STATUS: "working",
    }


def test_a_status_set_by_a_tasks_request_names_its_task_on_that_requests_span(monkeypatch: pytest.MonkeyPatch):
    """`tasks/cancel` runs in the caller's trace, not the task's: its span says which task (tool, key prefix)
    it changed, with the status event, never the id."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    use_provider(monkeypatch, provider)
    working = record(key="ab12cd34" * 8, tool="report")
    with provider.get_tracer("sdk").start_as_current_span("tasks/cancel"):
        tracing.Tracing().task_changed(working, replace(working, status=TaskStatus.CANCELLED, version=2))
    (span,) = exporter.get_finished_spans()
    assert dict(span.attributes or {}) == {
        propagation.TOOL: "report",
        tracing.KEY_PREFIX: "ab12cd34",
        tracing.STATUS: "cancelled",
    }
    assert [(event.name, dict(event.attributes or {})) for event in span.events] == [
        ("mcp_task.status", {tracing.STATUS: "cancelled"})
    ]
