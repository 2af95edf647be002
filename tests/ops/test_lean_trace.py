"""`LeanTracerProvider` against the SDK's `TracerProvider`: the same spans, id for id, on every path.

Each scenario runs twice, once on each provider, with the same counting id generator, so the
two runs must export the very same spans: names, ids, parents, flags, trace state, attributes
in order, dropped counts, events, links, statuses, scope and resource; only the clock's times
(and an exception's stack trace, whose frames name the two implementations) are left out.
A test about a path asserts which one it took (our span class, or the SDK's), so one that
silently fell back to the SDK would fail.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import subprocess
import sys
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from opentelemetry import context as context_api
from opentelemetry import trace
from opentelemetry.sdk import trace as sdk_trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanLimits, Tracer, TracerProvider, sampling
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.id_generator import IdGenerator
from opentelemetry.trace import Link, NonRecordingSpan, SpanContext, SpanKind, Status, StatusCode, TraceFlags
from opentelemetry.trace.span import TraceState

from celery_mcp_tasks.ops import lean_trace
from celery_mcp_tasks.ops.lean_trace import LeanTracerProvider


@pytest.fixture(autouse=True)
def fresh_check() -> Iterator[None]:
    """No test leaves the once-a-process check decided by what it patched."""
    yield
    lean_trace.compatible.cache_clear()


class _Counting(IdGenerator):
    def __init__(self) -> None:
        self.next = 0x1000

    def generate_span_id(self) -> int:
        self.next += 1
        return self.next

    def generate_trace_id(self) -> int:
        self.next += 1
        return self.next << 64


class _Keep(SpanExporter):
    def __init__(self) -> None:
        self.spans: list[ReadableSpan] = []

    def export(self, spans: Any) -> SpanExportResult:
        self.spans.extend(spans)
        return SpanExportResult.SUCCESS


class _Bang(BaseException):
    """Not an `Exception`: `use_span` neither records it nor sets the status."""


REMOTE_SAMPLED = SpanContext(
    0xABC << 64, 0xDEF, is_remote=True, trace_flags=TraceFlags(0x03), trace_state=TraceState([("k", "v")])
)
REMOTE_UNSAMPLED = SpanContext(0xABC << 64, 0xDEF, is_remote=True, trace_flags=TraceFlags(0x00))
LOCAL_NOT_RANDOM = SpanContext(0x123 << 64, 0x456, is_remote=False, trace_flags=TraceFlags(0x01))


def _view(span: ReadableSpan) -> dict[str, Any]:
    """Everything a span exports but its times (and an exception's stack trace)."""
    context = span.context
    assert context is not None and span.start_time and span.end_time
    return {
        "name": span.name,
        "context": (context.trace_id, context.span_id, int(context.trace_flags), context.is_remote),
        "trace state": list(context.trace_state.items()),
        "kind": span.kind,
        "parent": None if span.parent is None else (span.parent.trace_id, span.parent.span_id, span.parent.is_remote),
        "status": (span.status.status_code, span.status.description),
        "attributes": list((span.attributes or {}).items()),
        "events": [
            (event.name, [(k, v) for k, v in (event.attributes or {}).items() if k != "exception.stacktrace"])
            for event in span.events
        ],
        "links": [(link.context, list((link.attributes or {}).items())) for link in span.links],
        "dropped": (span.dropped_attributes, span.dropped_events, span.dropped_links),
        "resource": dict(span.resource.attributes),
        "scope": span.instrumentation_scope,
    }


Scenario = Callable[[trace.Tracer], list[Any]]


def _both(scenario: Scenario, **provider_args: Any) -> tuple[list[Any], list[Any]]:
    """Run `scenario` on the SDK's provider, then on ours; assert the same spans; return what each returned."""
    outcomes, exported = [], []
    for cls in (TracerProvider, LeanTracerProvider):
        kept = _Keep()
        provider = cls(
            id_generator=_Counting(), resource=Resource({"service.name": "t"}), shutdown_on_exit=False, **provider_args
        )
        provider.add_span_processor(SimpleSpanProcessor(kept))
        outcomes.append(scenario(provider.get_tracer("scope", "1.0", attributes={"a": "b"})))
        exported.append([_view(span) for span in kept.spans])
    assert exported[0], "the scenario exported nothing to compare"
    assert exported[1] == exported[0]
    return outcomes[0], outcomes[1]


def _kind(span: Any) -> str:
    return type(span).__name__


def test_the_fields_are_the_sdks_of_this_release() -> None:
    """Our spans set the SDK span's private fields: a release that changes them turns the fast path off.

    Written against opentelemetry-sdk 1.45; when this fails after an upgrade, compare `vars()` of
    an SDK span with `_LeanSpan.__init__`, and the tracer's fields."""
    assert importlib.metadata.version("opentelemetry-sdk").startswith("1.45.")
    assert lean_trace.compatible()
    assert isinstance(LeanTracerProvider().get_tracer("x"), lean_trace._LeanTracer)


def test_a_root_span_with_attributes_events_and_a_status_is_the_sdks() -> None:
    def scenario(tracer: trace.Tracer) -> list[Any]:
        attributes = {"mcp.method.name": "tools/call", "n": 1, "yes": True, "f": 0.5}
        with tracer.start_as_current_span("tools/call slow", kind=SpanKind.SERVER, attributes=attributes) as span:
            attributes["n"] = 2  # the span holds what it was given, not the caller's dict
            span.set_attributes({"mcp_task.tool": "slow", "mcp_task.status": "working"})
            span.set_attribute("later", "x")
            span.add_event("mcp_task.status", {"mcp_task.status": "working"})
            span.set_status(StatusCode.OK)
            inside = trace.get_current_span()
        return [_kind(span), inside is span, trace.get_current_span() is trace.INVALID_SPAN]

    sdk, ours = _both(scenario)
    assert ours == ["_LeanSpan", True, True] and sdk[1:] == ours[1:]


def test_a_start_time_given_is_the_spans() -> None:
    def scenario(tracer: trace.Tracer) -> list[Any]:
        span = tracer.start_span("timed", start_time=1_234)
        span.end(end_time=5_678)
        with tracer.start_as_current_span("timed current", start_time=4_321) as current:
            pass
        return [_kind(span), span.start_time, span.end_time, current.start_time]  # type: ignore[attr-defined]

    sdk, ours = _both(scenario)
    assert sdk[1:] == ours[1:] == [1_234, 5_678, 4_321] and ours[0] == "_LeanSpan"


def test_children_take_the_parents_trace_and_flags() -> None:
    def scenario(tracer: trace.Tracer) -> list[Any]:
        kinds = []
        with tracer.start_as_current_span("parent") as parent:
            with tracer.start_as_current_span("child", kind=SpanKind.CLIENT) as child:
                kinds.append(_kind(child))
            explicit = tracer.start_span("explicit", context=trace.set_span_in_context(parent))
            explicit.end()
        for remote in (REMOTE_SAMPLED, LOCAL_NOT_RANDOM):
            span = tracer.start_span("under", context=trace.set_span_in_context(NonRecordingSpan(remote)))
            span.end()
            kinds.append(_kind(span))
        return [*kinds, _kind(explicit)]

    _, ours = _both(scenario)
    assert ours == ["_LeanSpan"] * 4


def test_an_unsampled_parent_is_followed_by_the_default_sampler_and_overruled_by_always_on() -> None:
    def scenario(tracer: trace.Tracer) -> list[Any]:
        span = tracer.start_span("under", context=trace.set_span_in_context(NonRecordingSpan(REMOTE_UNSAMPLED)))
        span.end()
        root = tracer.start_span("root")
        root.end()
        return [_kind(span), span.is_recording(), span.get_span_context().trace_id, _kind(root)]

    sdk, ours = _both(scenario)
    assert sdk[:3] == ours[:3] and ours[0] == "NonRecordingSpan" and ours[3] == "_LeanSpan"
    sdk, ours = _both(scenario, sampler=sampling.ALWAYS_ON)
    assert sdk[1:3] == ours[1:3] and ours[0] == "_LeanSpan" and ours[2] == REMOTE_UNSAMPLED.trace_id


@pytest.mark.parametrize(
    "sampler",
    [sampling.ParentBasedTraceIdRatio(0.5), sampling.TraceIdRatioBased(1.0), sampling.ALWAYS_OFF],
    ids=["parentbased ratio", "ratio", "always off"],
)
def test_other_samplers_decide_through_the_sdk(sampler: sampling.Sampler) -> None:
    def scenario(tracer: trace.Tracer) -> list[Any]:
        spans = [tracer.start_span(f"s{i}", attributes={"i": i}) for i in range(8)]
        for span in spans:
            span.end()
        return [_kind(span) for span in spans]

    if sampler is sampling.ALWAYS_OFF:  # nothing exported to compare: both answer with unsampled spans
        for cls in (TracerProvider, LeanTracerProvider):
            provider = cls(sampler=sampler, id_generator=_Counting(), shutdown_on_exit=False)
            assert scenario(provider.get_tracer("x")) == ["NonRecordingSpan"] * 8
        return
    sdk, ours = _both(scenario, sampler=sampler)
    assert sdk == ours and "_LeanSpan" not in ours and "_Span" in ours


def test_links_go_through_the_sdk() -> None:
    def scenario(tracer: trace.Tracer) -> list[Any]:
        span = tracer.start_span("linked", links=[Link(REMOTE_SAMPLED, {"why": "batch"})])
        span.add_link(LOCAL_NOT_RANDOM, {"later": True})
        span.end()
        return [_kind(span)]

    sdk, ours = _both(scenario)
    assert sdk == ours == ["_Span"]


@pytest.mark.parametrize("record", [True, False])
@pytest.mark.parametrize("set_status", [True, False])
def test_an_escaping_exception_is_recorded_and_set_as_asked(record: bool, set_status: bool) -> None:
    def scenario(tracer: trace.Tracer) -> list[Any]:
        failing = tracer.start_as_current_span("fails", record_exception=record, set_status_on_exception=set_status)
        with pytest.raises(ValueError, match="no"), failing:
            raise ValueError("no")
        with pytest.raises(_Bang), tracer.start_as_current_span("interrupted"):
            raise _Bang
        return [trace.get_current_span() is trace.INVALID_SPAN]

    sdk, ours = _both(scenario)
    assert sdk == ours == [True]


def test_a_status_set_inside_is_kept_and_a_span_left_open_is_not_ended() -> None:
    def scenario(tracer: trace.Tracer) -> list[Any]:
        def ok_then_fail() -> None:
            with tracer.start_as_current_span("ok first") as span:
                span.set_status(Status(StatusCode.OK))
                raise RuntimeError("after")

        with pytest.raises(RuntimeError):
            ok_then_fail()
        with tracer.start_as_current_span("open", end_on_exit=False) as open_span:
            pass
        still = open_span.is_recording()
        open_span.end()
        return [still]

    sdk, ours = _both(scenario)
    assert sdk == ours == [True]


def test_as_a_decorator_each_call_is_its_own_span_sync_and_async() -> None:
    def scenario(tracer: trace.Tracer) -> list[Any]:
        @tracer.start_as_current_span("sync", attributes={"k": "v"})
        def work(n: int) -> int:
            return trace.get_current_span().get_span_context().span_id + n

        @tracer.start_as_current_span("async")
        async def later() -> int:
            await asyncio.sleep(0)
            return trace.get_current_span().get_span_context().span_id

        first, second = work(0), work(0)
        return [first != second, asyncio.run(later()) > 0, work.__name__, later.__name__]

    sdk, ours = _both(scenario)
    assert sdk == ours == [True, True, "work", "later"]


def test_attribute_values_the_sdk_cleans_are_cleaned_by_it() -> None:
    class Text(str):
        pass

    def scenario(tracer: trace.Tracer) -> list[Any]:
        kinds = []
        for attributes in (
            {"long": "x" * 20, "short": "y"},  # over max_span_attribute_length: truncated
            {"a": 1, "b": 2, "c": 3, "d": 4, "e": 5, "f": 6},  # over max_span_attributes: the oldest dropped
            {"": "empty key", "ok": 1},
            {"list": [1, 2], "tuple": ("a", "b"), "none": None, "bytes": b"\x00"},
            {"text subclass": Text("t"), "dict": {"in": 1}},
        ):
            span = tracer.start_span("cleaned", attributes=attributes)
            span.set_attributes({"ok": 9, "new": "n"})  # "ok" set again: moves to the end
            span.set_attributes({"m": 1})
            span.end()
            span.set_attributes({"after": "end"})  # ignored, with the SDK's warning
            kinds.append(_kind(span))
        moved = tracer.start_span("moved", attributes={"first": 1, "second": 2})
        moved.set_attributes({"first": 3})  # set again: after "second" now
        moved.end()
        kinds.append(_kind(moved))
        mapped = tracer.start_span("mapping")
        mapped.set_attributes(Resource({"r": "s"}).attributes)  # a mapping that is not a dict
        mapped.end()
        return kinds

    _, ours = _both(scenario, span_limits=SpanLimits(max_span_attributes=5, max_span_attribute_length=8))
    assert ours == ["_LeanSpan"] * 6


def test_a_resource_merged_after_a_fork_is_on_the_next_spans() -> None:
    kept = []
    for cls in (TracerProvider, LeanTracerProvider):
        spans = _Keep()
        provider = cls(id_generator=_Counting(), resource=Resource({"service.name": "t"}), shutdown_on_exit=False)
        provider.add_span_processor(SimpleSpanProcessor(spans))
        tracer = provider.get_tracer("scope")
        tracer.start_span("before").end()
        provider._update_resource(Resource({"process.pid": 42}))  # what the provider does after a fork
        tracer.start_span("after").end()
        provider.get_tracer("scope").start_span("again").end()
        kept.append([_view(span) for span in spans.spans])
    assert kept[1] == kept[0]
    assert kept[1][1]["resource"] == {"service.name": "t", "process.pid": 42}


def test_a_disabled_tracer_and_the_sdks_own_span_metrics_go_through_the_sdk(monkeypatch: pytest.MonkeyPatch) -> None:
    provider = LeanTracerProvider(shutdown_on_exit=False)
    tracer = provider.get_tracer("x")
    assert isinstance(tracer, lean_trace._LeanTracer)
    monkeypatch.setattr(tracer._sdk, "_is_enabled", lambda: False)
    assert _kind(tracer.start_span("off")) == "NonRecordingSpan"
    monkeypatch.setenv("OTEL_PYTHON_SDK_INTERNAL_METRICS_ENABLED", "true")
    metered = LeanTracerProvider(shutdown_on_exit=False).get_tracer("y")
    span = metered.start_span("counted")
    span.end()
    assert _kind(span) == "_Span"


def test_an_sdk_whose_spans_have_another_field_gets_its_own_tracers(monkeypatch: pytest.MonkeyPatch) -> None:
    """A release whose spans gained a field (as 1.45 gained `_record_end_metrics`): the SDK starts every span."""
    official_init = sdk_trace.Span.__init__

    def with_a_new_field(self: Any, *args: Any, **kwargs: Any) -> None:
        official_init(self, *args, **kwargs)
        self._new_in_a_later_release = None

    monkeypatch.setattr(sdk_trace.Span, "__init__", with_a_new_field)
    lean_trace.compatible.cache_clear()
    tracer = LeanTracerProvider(shutdown_on_exit=False).get_tracer("x")
    assert type(tracer) is Tracer
    span = tracer.start_span("official")
    span.end()
    assert _kind(span) == "_Span"
    monkeypatch.setattr(sdk_trace.Span, "__init__", official_init)
    lean_trace.compatible.cache_clear()  # and with the SDK as it is, the check passes
    assert lean_trace.compatible()


def test_the_check_does_not_depend_on_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Neither a sampler that drops everything, nor the SDK's own span metrics, nor a disabled SDK
    decide it: the check's provider has its own sampler, resource and meter."""
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "always_off")
    monkeypatch.setenv("OTEL_PYTHON_SDK_INTERNAL_METRICS_ENABLED", "true")
    lean_trace.compatible.cache_clear()
    assert lean_trace.compatible()
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    lean_trace.compatible.cache_clear()
    assert _kind(LeanTracerProvider(shutdown_on_exit=False).get_tracer("x")) == "NoOpTracer"
    assert lean_trace.compatible.cache_info().currsize == 0  # a disabled SDK has no spans to compare: not checked


def test_a_context_manager_is_entered_once_as_the_sdks() -> None:
    for provider in (TracerProvider(shutdown_on_exit=False), LeanTracerProvider(shutdown_on_exit=False)):
        current = provider.get_tracer("x").start_as_current_span("once")
        with current:
            pass
        with pytest.raises(RuntimeError if isinstance(provider, LeanTracerProvider) else AttributeError):
            current.__enter__()
    assert trace.get_current_span() is trace.INVALID_SPAN


@pytest.mark.integration  # it starts a process, which forks
def test_a_fork_after_a_span_does_not_hang_the_child() -> None:
    """The check's own provider must not import what registers a fork hook after the provider's
    (`Resource.create` does: the child would wait on a lock its parent held)."""
    script = """
import faulthandler, os, sys
os.register_at_fork(after_in_child=lambda: faulthandler.dump_traceback_later(10, exit=True))
from opentelemetry.sdk import trace as sdk_trace
from opentelemetry.sdk.resources import Resource
from celery_mcp_tasks.ops import otlp
from celery_mcp_tasks.ops.lean_trace import LeanTracerProvider
provider = LeanTracerProvider(resource=Resource({"service.name": "t"}), shutdown_on_exit=False)
provider.get_tracer("x").start_span("parent").end()
pid = os.fork()
if pid == 0:
    provider.get_tracer("x").start_span("child").end()
    os._exit(0)
sys.exit(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
"""
    done = subprocess.run([sys.executable, "-c", script], timeout=60, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_the_tracer_answers_for_the_sdk_tracers_fields_and_keeps_the_context_it_was_given() -> None:
    provider = LeanTracerProvider(shutdown_on_exit=False)
    tracer = provider.get_tracer("x")
    assert tracer.resource is provider.resource and tracer.sampler is provider.sampler
    token = context_api.attach(trace.set_span_in_context(NonRecordingSpan(REMOTE_SAMPLED)))
    try:
        with tracer.start_as_current_span("under the attached") as span:
            assert span.parent == REMOTE_SAMPLED
            assert span.get_span_context().trace_state == REMOTE_SAMPLED.trace_state
        assert trace.get_current_span().get_span_context() == REMOTE_SAMPLED
    finally:
        context_api.detach(token)
