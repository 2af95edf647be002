"""Our OTLP span encoder against the official one, and the exporter that sends its bytes.

Every check decodes our bytes with the official message classes and compares them with
the official encoder's message: the two must be the same request, field by field (protobuf
message equality, presence of empty sub-messages included). The spans are real SDK spans,
made by a real provider, with every kind of value the SDK lets a span, an event or a link
carry. The exporter is checked against a real HTTP endpoint: what it receives decodes to
the same request.
"""

from __future__ import annotations

import http.server
import logging
import threading
from collections.abc import Iterator
from typing import Any, ClassVar

import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.trace import Link, NonRecordingSpan, SpanContext, SpanKind, Status, StatusCode, TraceFlags
from opentelemetry.trace.span import TraceState

from celery_mcp_tasks.ops import otlp


class _Keep(SpanExporter):
    def __init__(self) -> None:
        self.spans: list[ReadableSpan] = []

    def export(self, spans: Any) -> SpanExportResult:
        self.spans.extend(spans)
        return SpanExportResult.SUCCESS


def _provider(resource: Resource) -> tuple[TracerProvider, _Keep]:
    kept = _Keep()
    provider = TracerProvider(resource=resource, shutdown_on_exit=False)
    provider.add_span_processor(SimpleSpanProcessor(kept))
    return provider, kept


@pytest.fixture(autouse=True)
def cold_caches() -> None:
    """Each test starts with the encoder's caches empty, so the first encoding of each pair is exercised."""
    for cache in (otlp._keys, otlp._pairs, otlp._resources, otlp._scopes):
        cache.clear()


def _same_as_official(spans: list[ReadableSpan]) -> ExportTraceServiceRequest:
    encoded = otlp.encode(spans)
    ours = ExportTraceServiceRequest.FromString(encoded)
    official = encode_spans(spans)
    assert ours == official, f"ours:\n{ours}\nofficial:\n{official}"
    assert encoded == official.SerializePartialToString()  # and byte for byte, field order included
    return ours


AWKWARD: dict[str, Any] = {
    "text": "tools/call",
    "empty": "",
    "unicode": "zürich ☃ \U0001f600",
    "yes": True,
    "no": False,
    "zero": 0,
    "one": 1,
    "negative": -1,
    "int64 max": 2**63 - 1,
    "int64 min": -(2**63),
    "big": 2**40 + 7,
    "float": 0.1 + 0.2,
    "tiny": 1e-300,
    "whole float": 3.0,
    "negative float": -2.5,
    "inf": float("inf"),
    "strings": ("a", "", "ü"),
    "bools": (True, False),
    "ints": (0, -5, 2**62),
    "floats": (1.5, -0.0),
    "empty list": (),
    "bytes": b"\x00\xffraw",
    "long": "x" * 500,  # longer than what the pair cache keeps
}


@pytest.fixture
def spans() -> Iterator[list[ReadableSpan]]:
    provider, kept = _provider(Resource.create({"service.name": "web", "deployment": "eu", "n": 3}))
    tracer = provider.get_tracer("mcp-python-sdk")
    other = provider.get_tracer("celery_mcp_tasks", "1.2.3", schema_url="https://opentelemetry.io/schemas/1.21.0")
    remote = SpanContext(
        0x4BF92F3577B34DA6A3CE929D0E0E4736,
        0x00F067AA0BA902B7,
        is_remote=True,
        trace_flags=TraceFlags(TraceFlags.SAMPLED),
        trace_state=TraceState([("vendor", "abc"), ("other", "x-1")]),
    )
    from opentelemetry import trace

    with tracer.start_as_current_span(
        "tools/call report",
        context=trace.set_span_in_context(NonRecordingSpan(remote)),
        kind=SpanKind.SERVER,
        attributes={"mcp.method.name": "tools/call", "jsonrpc.request.id": "17"},
    ) as span:
        span.set_attributes(AWKWARD)
        span.add_event("mcp_task.status", {"mcp_task.status": "working"})
        span.add_event("")
        span.add_event("no attributes", timestamp=1)
        with other.start_as_current_span(
            "",
            kind=SpanKind.PRODUCER,
            links=[Link(remote, {"why": "resend", "n": 2}), Link(span.get_span_context())],
        ) as child:
            child.set_status(Status(StatusCode.ERROR, "ValueError"))
        with tracer.start_as_current_span("ok", kind=SpanKind.CLIENT) as ok:
            ok.set_status(Status(StatusCode.OK))
    with tracer.start_as_current_span("root consumer", kind=SpanKind.CONSUMER):
        pass
    with other.start_as_current_span("root internal"):
        pass
    yield kept.spans
    provider.shutdown()


def test_a_batch_decodes_to_exactly_the_official_request(spans: list[ReadableSpan]):
    request = _same_as_official(spans)
    assert len(request.resource_spans) == 1
    assert sorted(len(scope.spans) for scope in request.resource_spans[0].scope_spans) == [2, 3]


def test_each_span_alone_and_the_cached_encodings_the_second_time(spans: list[ReadableSpan]):
    for span in spans:
        _same_as_official([span])
    _same_as_official(spans)  # every key/value pair and the resource now come from the caches
    _same_as_official(list(reversed(spans)))


def test_spans_of_two_resources_are_grouped_as_the_official_encoder_groups_them(spans: list[ReadableSpan]):
    provider, kept = _provider(Resource.create({"service.name": "worker"}, schema_url="https://example.com/s"))
    with provider.get_tracer("celery_mcp_tasks").start_as_current_span("mcp_task run report") as span:
        span.set_attribute("mcp_task.attempt", 2)
    mixed = [spans[0], kept.spans[0], spans[1], *spans[2:]]
    request = _same_as_official(mixed)
    assert len(request.resource_spans) == 2


def test_equal_resources_of_two_providers_are_one_group_in_the_official_order():
    first, kept_first = _provider(Resource.create({"service.name": "web"}))
    second, kept_second = _provider(Resource.create({"service.name": "web"}))
    for n in range(3):
        for provider in (first, second):
            with provider.get_tracer("t").start_as_current_span(f"span {n}"):
                pass
    interleaved = [span for pair in zip(kept_first.spans, kept_second.spans, strict=True) for span in pair]
    request = _same_as_official(interleaved)
    assert len(request.resource_spans) == 1


def test_an_empty_batch_is_an_empty_request():
    assert otlp.encode([]) == b""
    assert encode_spans([]).SerializePartialToString() == b""


def test_many_distinct_values_never_grow_the_caches_past_their_bound():
    provider, kept = _provider(Resource.create({"service.name": "web"}))
    tracer = provider.get_tracer("t")
    for n in range(otlp._CACHE_MAX + 10):
        with tracer.start_as_current_span("s", attributes={"jsonrpc.request.id": str(n), f"key {n}": n}):
            pass
    _same_as_official(kept.spans)
    assert len(otlp._pairs) <= otlp._CACHE_MAX and len(otlp._keys) <= otlp._CACHE_MAX
    assert not [key for key in otlp._pairs if isinstance(key[2], str) and len(key[2]) > otlp._CACHED_LEN]


@pytest.mark.parametrize("key", ["k", "k" * 40, "ключ" * 14])
def test_a_value_seen_first_under_a_known_key_is_written_as_officially(key: str, monkeypatch: pytest.MonkeyPatch):
    """The in-line path for a new string under a cached key: multi-byte UTF-8, empty, and lengths
    on both sides of the single-byte length bound (124 bytes with the key's field)."""
    provider, kept = _provider(Resource.create({"service.name": "web"}))
    tracer = provider.get_tracer("t")
    first = "first, so the key is known"
    values = [""] + [char * n for char in ("a", "é", "☃", "\U0001f600") for n in (1, 15, 16, 29, 30, 31, 41, 60, 64)]
    for value in [first, *values, *values]:  # each value first, then again from the cache
        with tracer.start_as_current_span("s", attributes={key: value}):
            pass
    slow: list[Any] = []
    official_key_value = otlp._key_value
    monkeypatch.setattr(otlp, "_key_value", lambda k, v: slow.append(v) or official_key_value(k, v))
    _same_as_official(kept.spans)
    key_field = len(otlp._string(b"\x0a", key))
    in_line = [v for v in values if len(v) <= otlp._CACHED_LEN and key_field + len(v.encode()) < 124]
    assert slow == [first] + [v for v in values if v not in in_line]  # each once: the cache has it after
    assert in_line, "no value took the in-line path"


def test_a_span_that_is_not_the_sdks_copy_is_read_through_its_properties(spans: list[ReadableSpan]):
    class Copied(ReadableSpan):  # a processor's own span class: not the SDK's `ReadableSpan` itself
        pass

    copies = []
    for span in spans:
        copy = Copied(span.name)
        copy.__dict__.update(vars(span))
        copies.append(copy)
    assert otlp.encode(copies) == otlp.encode(spans)
    _same_as_official(copies)


class _Unusual:
    """A value no SDK validation lets through: only a processor that writes attributes raw could carry one."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


def test_an_attribute_that_cannot_be_exported_is_dropped_as_officially_without_its_value(
    spans: list[ReadableSpan], caplog: pytest.LogCaptureFixture
):
    odd = next(span for span in spans if span.name == "tools/call report")
    secret = "do-not-log-me"
    odd._attributes = {  # type: ignore[attr-defined]
        **dict(odd.attributes or {}),
        "odd": _Unusual(secret),
        "huge": 2**70,
        "nested": ("ok", _Unusual(secret)),
    }
    caplog.set_level(logging.WARNING, "celery_mcp_tasks.ops")
    request = ExportTraceServiceRequest.FromString(otlp.encode([odd]))
    assert request == encode_spans([odd])  # the official encoder drops the three keys too
    (encoded,) = [one for scope in request.resource_spans[0].scope_spans for one in scope.spans if one.name == odd.name]
    keys = {kv.key for kv in encoded.attributes}
    assert {"odd", "huge", "nested"}.isdisjoint(keys) and "text" in keys
    ours = [r.getMessage() for r in caplog.records if r.name == "celery_mcp_tasks.ops"]
    assert ours and all(secret not in line and str(2**70) not in line for line in ours)


def test_a_span_our_encoder_cannot_write_goes_to_the_official_encoder(
    spans: list[ReadableSpan], monkeypatch: pytest.MonkeyPatch
):
    def cannot(span: ReadableSpan) -> bytes:
        raise otlp._Unencodable("a negative count")

    monkeypatch.setattr(otlp, "_span", cannot)
    received = _Collector.run(lambda endpoint: otlp.LeanOTLPSpanExporter(endpoint=endpoint).export(spans))
    assert received.result is SpanExportResult.SUCCESS
    assert received.requests == [encode_spans(spans)]


class _Collector(http.server.BaseHTTPRequestHandler):
    bodies: ClassVar[list[bytes]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        type(self).bodies.append(body)
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *_: object) -> None:
        pass

    class Run:
        result: SpanExportResult
        requests: list[ExportTraceServiceRequest]

    @classmethod
    def run(cls, export: Any) -> _Collector.Run:
        cls.bodies = []
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), cls)
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            run = cls.Run()
            run.result = export(f"http://127.0.0.1:{server.server_address[1]}/v1/traces")
            run.requests = [ExportTraceServiceRequest.FromString(body) for body in cls.bodies]
            return run
        finally:
            server.shutdown()
            server.server_close()


def test_the_exporter_posts_our_bytes_and_the_collector_reads_the_official_request(
    spans: list[ReadableSpan], monkeypatch: pytest.MonkeyPatch
):
    def official_unused(batch: Any) -> Any:
        raise AssertionError("the official encoder ran")

    monkeypatch.setattr("opentelemetry.exporter.otlp.proto.http.trace_exporter.encode_spans", official_unused)
    received = _Collector.run(lambda endpoint: otlp.LeanOTLPSpanExporter(endpoint=endpoint).export(spans))
    assert received.result is SpanExportResult.SUCCESS
    assert received.requests == [encode_spans(spans)]


def test_a_collector_that_refuses_is_a_failed_export_not_an_error(spans: list[ReadableSpan]):
    class Refusing(_Collector):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.send_response(400)
            self.send_header("Content-Length", "0")
            self.end_headers()

    received = Refusing.run(lambda endpoint: otlp.LeanOTLPSpanExporter(endpoint=endpoint).export(spans))
    assert received.result is SpanExportResult.FAILURE


def test_a_batch_over_the_size_limit_is_dropped_with_a_line(spans: list[ReadableSpan], caplog: Any):
    caplog.set_level(logging.WARNING, "celery_mcp_tasks.ops")
    received = _Collector.run(
        lambda endpoint: otlp.LeanOTLPSpanExporter(endpoint=endpoint, max_request_size=10).export(spans)
    )
    assert received.result is SpanExportResult.FAILURE and received.requests == []
    assert "max_request_size" in caplog.text


def test_the_private_hooks_are_there_in_opentelemetry_exporter_otlp_proto_http_1_45():
    """The exporter reads these attributes of the official one, and otlp.py imports two private
    encoder functions; when this fails after an upgrade, LeanOTLPSpanExporter runs the official
    export (see otlp._HOOKS), or ops.tracing uses the official exporter, until they are updated."""
    from opentelemetry.exporter.otlp.proto.common._internal import (  # noqa: F401
        _encode_instrumentation_scope,
        _encode_resource,
    )

    exporter = OTLPSpanExporter(endpoint="http://127.0.0.1:9/v1/traces")
    for name in otlp._HOOKS:
        assert hasattr(exporter, name), name
    assert callable(exporter._client.export)
    assert otlp.LeanOTLPSpanExporter(endpoint="http://127.0.0.1:9/v1/traces")._lean


def test_without_the_hooks_the_official_export_runs(spans: list[ReadableSpan], monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(otlp, "_HOOKS", ("_no_such_attribute",))
    calls: list[int] = []
    monkeypatch.setattr(otlp, "encode", lambda batch: calls.append(len(batch)) or b"")
    received = _Collector.run(lambda endpoint: otlp.LeanOTLPSpanExporter(endpoint=endpoint).export(spans))
    assert calls == [] and received.requests == [encode_spans(spans)]


def test_the_otlp_mode_builds_the_lean_exporter(monkeypatch: pytest.MonkeyPatch):
    from celery_mcp_tasks.ops import tracing

    built: list[otlp.LeanOTLPSpanExporter] = []

    class Recorded(otlp.LeanOTLPSpanExporter):
        def __init__(self) -> None:
            super().__init__()
            built.append(self)

    monkeypatch.setattr(otlp, "LeanOTLPSpanExporter", Recorded)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
    provider = tracing._provider("otlp", "web")
    provider.shutdown()
    assert len(built) == 1 and built[0]._lean
