"""OTLP/HTTP span export with an encoder of our own: the official exporter's sending, our bytes.

The official `OTLPSpanExporter` builds one protobuf object per field of every span (the
span, each attribute's KeyValue and AnyValue, each event) and then serializes them: about
400 000 instructions a span on the serve process, in the export thread, which takes them
from the event loop under the GIL (bench/bench_ops_instructions.py counted it at 7 % of a
creation). `encode` writes the same `ExportTraceServiceRequest` straight to protobuf wire
bytes, caching what repeats from span to span (the resource and scope, each attribute's
key, the common key/value pairs): ~83 000 instructions for the SDK's `tools/call` span.
Tests decode its output with the official message classes and hold it equal to the official
encoder's, field by field and byte for byte, for every kind of value the SDK lets a span carry.

`LeanOTLPSpanExporter` is the official exporter (endpoint, headers, TLS, compression,
timeout and retries from the standard OTEL_EXPORTER_OTLP_* variables; its own metrics) with
`export` encoding here. It reaches the official client through private attributes, all in
`_HOOKS`, checked when the exporter is made: on a version without them the official
`export` runs, unchanged (and `ops.tracing` uses the official exporter if the private names
imported below have moved). An attribute whose value it cannot write (a type or an int the
official encoder drops too) is dropped, as officially, with a line naming its type, never its
value; a span it cannot write at all goes to the official encoder with its batch. Either way
the collector gets the request the official exporter would have sent.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Mapping, Sequence
from typing import Any

from opentelemetry.exporter.otlp.proto.common._internal import _encode_instrumentation_scope, _encode_resource
from opentelemetry.exporter.otlp.proto.http._common import RequestPayloadTooLargeError
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExportResult
from opentelemetry.semconv.attributes.http_attributes import HTTP_RESPONSE_STATUS_CODE
from opentelemetry.trace import SpanContext, SpanKind

__all__ = ["LeanOTLPSpanExporter", "encode"]

logger = logging.getLogger("celery_mcp_tasks.ops")

_HOOKS = ("_client", "_metrics", "_shutdown", "_max_request_size")
"""The official exporter's private attributes `export` uses (opentelemetry-exporter-otlp-proto-http 1.45)."""

_VARINT1 = [bytes((n,)) for n in range(128)]
_FIXED64 = struct.Struct("<Q").pack
_DOUBLE = struct.Struct("<d").pack
_FIXED32 = struct.Struct("<I").pack
_KIND = {
    SpanKind.INTERNAL: b"\x30\x01",
    SpanKind.SERVER: b"\x30\x02",
    SpanKind.CLIENT: b"\x30\x03",
    SpanKind.PRODUCER: b"\x30\x04",
    SpanKind.CONSUMER: b"\x30\x05",
}
_KIND_BY_ID = {id(kind): encoded for kind, encoded in _KIND.items()}  # an enum member's hash is a Python call
_FLAGS_LOCAL = b"\x85\x01" + _FIXED32(0x100)  # Span.flags (16, fixed32): SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE_MASK
_FLAGS_REMOTE = b"\x85\x01" + _FIXED32(0x300)  # ... | SPAN_FLAGS_CONTEXT_IS_REMOTE_MASK
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_CACHE_MAX = 4096
"""Cached encodings (attribute keys, key/value pairs): cleared when full, so ids in values cannot grow it."""
_CACHED_LEN = 64
"""Longer strings (a stack trace, a statement) are encoded each time, never kept."""


def _varint(value: int) -> bytes:
    if 0 <= value < 0x80:
        return _VARINT1[value]
    if value < 0:
        raise _Unencodable("a negative count")
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _field(tag: bytes, payload: bytes) -> bytes:
    """A length-delimited field: its tag, the payload's length, the payload."""
    return tag + _varint(len(payload)) + payload


def _string(tag: bytes, text: str) -> bytes:
    return _field(tag, text.encode("utf-8"))


class _Unencodable(Exception):
    """A value outside what `encode` writes: the batch goes to the official encoder."""


def _any_value(value: Any) -> bytes:
    """An AnyValue message's payload, as the official `_encode_value` builds it (None is an empty one)."""
    if value is None:
        return b""
    if isinstance(value, bool):
        return b"\x10\x01" if value else b"\x10\x00"
    if isinstance(value, str):
        return _string(b"\x0a", value)
    if isinstance(value, int):
        if not _INT64_MIN <= value <= _INT64_MAX:
            raise _Unencodable("an int outside int64")
        return b"\x18" + _varint(value & 0xFFFFFFFFFFFFFFFF)
    if isinstance(value, float):
        return b"\x21" + _DOUBLE(value)
    if isinstance(value, bytes):
        return _field(b"\x3a", value)
    if isinstance(value, Sequence):
        return _field(b"\x2a", b"".join([_field(b"\x0a", _any_value(item)) for item in value]))
    if isinstance(value, Mapping):
        return _field(b"\x32", b"".join([_field(b"\x0a", _key_value(str(k), v)) for k, v in value.items()]))
    raise _Unencodable(f"a value of type {type(value).__name__}")


_keys: dict[str, bytes] = {}
_pairs: dict[tuple[str, type, Any], bytes] = {}


def _key_value(key: str, value: Any) -> bytes:
    """A KeyValue message's payload."""
    tag = _keys.get(key)
    if tag is None:
        if len(_keys) >= _CACHE_MAX:
            _keys.clear()
        tag = _keys[key] = _string(b"\x0a", key)
    return tag + _field(b"\x12", _any_value(value))


def _attributes(tag: bytes, attributes: Mapping[str, Any] | None) -> bytes:
    """Each attribute as a repeated KeyValue field `tag`; a str, bool or int pair is encoded once and kept."""
    if not attributes:
        return b""
    parts = []
    for key, value in _items(attributes):
        kind = type(value)
        if kind is bool or kind is int or (kind is str and len(value) <= _CACHED_LEN):
            cached = _pairs.get((key, kind, value))
            if cached is None:
                key_tag = _keys.get(key)
                if kind is str and key_tag is not None:  # a value seen first (an id's prefix): written in line
                    raw = value.encode("utf-8")
                    if len(key_tag) + len(raw) < 124:  # every length below a single varint byte
                        payload = key_tag + b"\x12" + _VARINT1[len(raw) + 2] + b"\x0a" + _VARINT1[len(raw)] + raw
                        cached = _VARINT1[len(payload)] + payload
                if cached is None:
                    try:
                        payload = _key_value(key, value)
                    except _Unencodable as error:
                        _dropped(error)
                        continue
                    cached = _varint(len(payload)) + payload
                if len(_pairs) >= _CACHE_MAX:
                    _pairs.clear()
                _pairs[(key, kind, value)] = cached
            parts.append(tag + cached)
        else:
            try:
                parts.append(_field(tag, _key_value(key, value)))
            except _Unencodable as error:
                _dropped(error)
    return b"".join(parts)


def _items(attributes: Mapping[str, Any]) -> Any:
    """`attributes.items()`, through a dict copy where the mapping makes one in C: a span's attributes are
    `BoundedAttributes` (read from the SDK's `ReadableSpan` field) or a `MappingProxyType` over them, whose
    items view is a Python generator over `__getitem__` (~2 000 instructions an attribute, counted)."""
    if type(attributes) is not dict:
        copy = getattr(attributes, "copy", None)
        if copy is not None:
            copied = copy()
            if type(copied) is dict:
                return copied.items()
    return attributes.items()


_said: set[str] = set()


def _dropped(error: _Unencodable) -> None:
    """The official encoder drops such an attribute too (logging its value); here, once per kind, without it."""
    if str(error) not in _said:
        _said.add(str(error))
        logger.warning("tracing: dropped a span attribute holding %s (it cannot be exported); said once", error)


def _span(span: ReadableSpan) -> bytes:
    """A Span message's payload, field by field as the official `_encode_span` sets it (zeros left out)."""
    if type(span) is ReadableSpan and _PLAIN_FIELDS:  # the SDK's copy at end(): its fields, not a property each
        context, parent, name, kind = span._context, span._parent, span._name, span._kind
        start, end, attributes, status = span._start_time, span._end_time, span._attributes, span._status
    else:
        context, parent, name, kind = span.context, span.parent, span.name, span.kind
        start, end, attributes, status = span.start_time, span.end_time, span.attributes, span.status
    if context is None:
        raise _Unencodable("a span without a context")
    if type(context) is SpanContext:  # a tuple: (trace id, span id, remote, flags, state, valid)
        trace_id, span_id, _, _, state, _ = context
    else:
        trace_id, span_id, state = context.trace_id, context.span_id, context.trace_state
    parts = [b"\x0a\x10", trace_id.to_bytes(16, "big"), b"\x12\x08", span_id.to_bytes(8, "big")]
    if state:
        parts.append(_string(b"\x1a", ",".join([f"{key}={value}" for key, value in state.items()])))
    if parent:
        parts += (b"\x22\x08", parent.span_id.to_bytes(8, "big"))
    if name:
        parts.append(_string(b"\x2a", name))
    parts.append(_KIND_BY_ID[id(kind)])
    if start:
        parts += (b"\x39", _FIXED64(start))
    if end:
        parts += (b"\x41", _FIXED64(end))
    if attributes:
        parts.append(_attributes(b"\x4a", attributes))
    dropped = span.dropped_attributes
    if dropped:
        parts += (b"\x50", _varint(dropped))
    for event in span.events:
        fields = b"\x09" + _FIXED64(event.timestamp) if event.timestamp else b""
        if event.name:
            fields += _string(b"\x12", event.name)
        fields += _attributes(b"\x1a", event.attributes)
        if event.dropped_attributes:
            fields += b"\x20" + _varint(event.dropped_attributes)
        parts.append(_field(b"\x5a", fields))
    dropped = span.dropped_events
    if dropped:
        parts += (b"\x60", _varint(dropped))
    for link in span.links:
        linked = link.context
        fields = b"\x0a\x10" + linked.trace_id.to_bytes(16, "big") + b"\x12\x08" + linked.span_id.to_bytes(8, "big")
        fields += _attributes(b"\x22", link.attributes)
        if link.dropped_attributes:
            fields += b"\x28" + _varint(link.dropped_attributes)
        fields += b"\x35" + _FIXED32(0x300 if linked.is_remote else 0x100)
        parts.append(_field(b"\x6a", fields))
    dropped = span.dropped_links
    if dropped:
        parts += (b"\x70", _varint(dropped))
    if status is not None:  # present even when unset, as the official encoder makes it
        code = status.status_code.value
        if status.description:
            fields = _string(b"\x12", status.description)
            parts.append(_field(b"\x7a", fields + b"\x18" + _varint(code) if code else fields))
        else:
            parts.append(_STATUS[code] if code < len(_STATUS) else _field(b"\x7a", b"\x18" + _varint(code)))
    parts.append(_FLAGS_REMOTE if parent is not None and parent.is_remote else _FLAGS_LOCAL)
    return b"".join(parts)


_PLAIN_FIELDS = set(vars(ReadableSpan("x", resource=Resource.get_empty()))) >= {
    "_context", "_parent", "_name", "_kind", "_start_time", "_end_time", "_attributes", "_status"
}  # fmt: skip
"""The SDK's `ReadableSpan` keeps what its properties return in these fields (opentelemetry-sdk 1.45)."""
_STATUS = [b"\x7a\x00", b"\x7a\x02\x18\x01", b"\x7a\x02\x18\x02"]  # UNSET, OK, ERROR without a description
_resources: dict[int, tuple[Any, bytes]] = {}
_scopes: dict[int, tuple[Any, bytes]] = {}


def _once(cache: dict[int, tuple[Any, bytes]], held: Any, message: Any, bound: int) -> bytes:
    """Field 1 (`ResourceSpans.resource`, `ScopeSpans.scope`) for `held`, encoded by the official
    `message` function once and kept by identity (a `Resource`'s hash is a JSON dump of its
    attributes, each time); one resource per process, one scope per tracer."""
    found = cache.get(id(held))
    if found is None or found[0] is not held:
        if len(cache) >= bound:
            cache.clear()
        found = cache[id(held)] = (held, _field(b"\x0a", message(held).SerializeToString()))
    return found[1]


def encode(spans: Sequence[ReadableSpan]) -> bytes:
    """The serialized `ExportTraceServiceRequest` of `spans`, grouped by resource, then by scope, in order.

    Raises for a span it cannot write (a value outside what the SDK lets a span hold); the exporter
    then hands the batch to the official encoder."""
    grouped: dict[Any, dict[Any, list[bytes]]] = {}  # equal resources (and scopes) are one group, as officially
    by_id: dict[tuple[int, int], list[bytes]] = {}  # the group's list, found without hashing a Resource
    for span in spans:
        resource, scope = span.resource, span.instrumentation_scope or None
        group = by_id.get((id(resource), id(scope)))
        if group is None:
            group = by_id[(id(resource), id(scope))] = grouped.setdefault(resource, {}).setdefault(scope, [])
        group.append(_span(span))
    out = []
    for resource, scopes in grouped.items():
        fields = [_once(_resources, resource, _encode_resource, 64)]
        for scope, encoded_spans in scopes.items():
            scope_fields = [_once(_scopes, scope, _encode_instrumentation_scope, 256)]
            for one in encoded_spans:
                scope_fields += (b"\x12", _varint(len(one)), one)
            if scope is not None and scope.schema_url:
                scope_fields.append(_string(b"\x1a", scope.schema_url))
            fields.append(_field(b"\x12", b"".join(scope_fields)))
        if resource.schema_url:
            fields.append(_string(b"\x1a", resource.schema_url))
        out.append(_field(b"\x0a", b"".join(fields)))
    return b"".join(out)


class LeanOTLPSpanExporter(OTLPSpanExporter):
    """The official OTLP/HTTP span exporter, encoding with `encode` (the official encoder as a fallback)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._lean = all(hasattr(self, name) for name in _HOOKS) and hasattr(self._client, "export")
        if not self._lean:
            logger.info("tracing: this opentelemetry-exporter-otlp-proto-http has no %s; its own export runs", _HOOKS)
        self._fallback_said = False

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if not self._lean or self._shutdown:
            return super().export(spans)
        try:
            data = encode(spans)
        except Exception as error:  # noqa: BLE001 - the official encoder decides what such a batch becomes
            if not self._fallback_said:
                self._fallback_said = True
                why = str(error) if isinstance(error, _Unencodable) else type(error).__name__  # never a value's text
                logger.info("tracing: a span batch needs the official encoder (%s); said once", why)
            return super().export(spans)
        return self._send(data, len(spans))

    def _send(self, data: bytes, count: int) -> SpanExportResult:
        """What the official `export` does with its bytes: the size check, the client's export, its metrics."""
        with self._metrics.export_operation(count) as result:
            if 0 < self._max_request_size < len(data):
                logger.warning("tracing: dropped a span batch of %d bytes (over max_request_size)", len(data))
                result.error = RequestPayloadTooLargeError(
                    f"{len(data)} bytes exceed max_request_size {self._max_request_size}"
                )
                return SpanExportResult.FAILURE
            sent = self._client.export(data)
            if not sent.success:
                result.error = sent.error
                if sent.status_code is not None:
                    result.error_attrs = {HTTP_RESPONSE_STATUS_CODE: sent.status_code}
                return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS
