"""The OpenTelemetry SDK's tracer provider, with a shorter way to start a span under the default samplers.

The SDK's `Tracer.start_as_current_span` costs ~190 000 instructions a span on the serve
process (counted under callgrind): a sampler call and its result object, `BoundedAttributes`
cleaning every value through four `isinstance` checks, two generator-based context managers,
a copy of the span for the processors. For the MCP SDK's `tools/call` span, that is 3 % of a
task's creation, paid by every traced call. `LeanTracerProvider` is the SDK's
`TracerProvider` (resource, processors, limits, shutdown, flush, fork handling: all the
SDK's); its tracers start spans that are the SDK's `Span` class, built with fewer steps:

- the sampling decision is made here only for `parentbased_always_on` (the default) and
  `always_on`, whose answers need no call; every other sampler, a span with links, a tracer a
  configurator disabled and the SDK's own span metrics go through the SDK's `start_span`;
- attribute values of the plain types (`str`, `bool`, `int`, `float`) within the limits are
  stored as given, in the SDK's order; any other value, a key already set, or a full
  span is cleaned and counted by the SDK's `BoundedAttributes`;
- `start_as_current_span` is one small context manager (and decorator) with `use_span`'s
  behaviour: the span current inside, an escaping `Exception` recorded and set as the status as
  asked, the span ended on exit.

Everything after the start (attributes, events, links, status, exceptions, `end` and the
processors) is the SDK's own code on the SDK's own fields. The fields a span is built with are
the SDK's private ones; `compatible()` compares them with a span the SDK built, once per
process, and on any difference (an SDK release that moved them) every tracer is the SDK's,
unchanged. Tests hold the spans of both equal, id for id, for each path here.
"""

from __future__ import annotations

import functools
import inspect
import logging
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from types import TracebackType
from typing import Any, TypeVar

from opentelemetry import context as context_api
from opentelemetry import trace as trace_api
from opentelemetry.attributes import BoundedAttributes
from opentelemetry.metrics import NoOpMeterProvider
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Span, Tracer, TracerProvider, sampling
from opentelemetry.sdk.util import BoundedList
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags

__all__ = ["LeanTracerProvider", "compatible"]

logger = logging.getLogger("celery_mcp_tasks.ops")

_F = TypeVar("_F", bound=Callable[..., Any])
_PLAIN = frozenset((str, bool, int, float))
_UNSET = Status(StatusCode.UNSET)
_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_SAMPLED_RANDOM = TraceFlags(TraceFlags.SAMPLED | TraceFlags.RANDOM_TRACE_ID)


class _Attributes(BoundedAttributes):
    """`BoundedAttributes` whose plain values (and a dict of them, in one call) are stored without cleaning."""

    def __init__(self, maxlen: int | None, max_value_len: int | None, attributes: Mapping[str, Any] | None) -> None:
        self._dict: dict[str, Any] = {}
        self.maxlen = maxlen
        self.dropped = 0
        self.max_value_len = max_value_len
        self._lock = threading.Lock()
        self._immutable = False
        if attributes:
            self._set_items(attributes)

    def _set_items(self, attributes: Mapping[str, Any]) -> None:
        """As the SDK's, which keeps the order of a plain dict of new keys as given: stored in one update."""
        if self._immutable or type(attributes) is not dict or not self._dict.keys().isdisjoint(attributes):
            super()._set_items(attributes)  # a key set again moves to the end there; a frozen one raises
            return
        limit = self.max_value_len
        for key, value in attributes.items():
            kind = type(value)
            if (
                kind not in _PLAIN
                or type(key) is not str
                or not key
                or (kind is str and limit is not None and len(value) > limit)
            ):
                super()._set_items(attributes)
                return
        with self._lock:
            if self.maxlen is not None and len(self._dict) + len(attributes) > self.maxlen:
                fits = False  # the SDK drops the oldest, and counts them
            else:
                self._dict.update(attributes)
                fits = True
        if not fits:
            super()._set_items(attributes)


class _LeanSpan(Span):
    """The SDK's `Span`, its fields set directly (the same fields, `compatible()` checks), from its
    SDK tracer's. Assigned one by one: `__dict__.update` would make CPython 3.11 give up the
    object's inline attribute values."""

    def __init__(
        self,
        tracer: Tracer,
        name: str,
        context: SpanContext,
        parent: SpanContext | None,
        attributes: Mapping[str, Any] | None,
        kind: SpanKind,
        record_exception: bool,
        set_status_on_exception: bool,
    ) -> None:
        limits = tracer._span_limits
        self._instrumentation_info = tracer.instrumentation_info
        self._instrumentation_scope = tracer._instrumentation_scope
        self._resource = tracer.resource  # the provider's, a process's merged in after a fork
        self._sampler = tracer.sampler
        self._span_processor = tracer.span_processor
        self._limits = limits
        self._start_time: int | None = None
        self._end_time: int | None = None
        self._status = _UNSET
        self._trace_config = None
        self._record_end_metrics = None
        self._name = name
        self._context = context
        self._kind = kind
        self._parent = parent
        self._record_exception = record_exception
        self._set_status_on_exception = set_status_on_exception
        self._lock = threading.Lock()
        self._attributes = _Attributes(limits.max_span_attributes, limits.max_span_attribute_length, attributes)
        self._events = BoundedList(limits.max_events)
        self._links = BoundedList(limits.max_links)


class _Current:
    """`start_as_current_span`'s context manager: `use_span(start_span(...), end_on_exit)`, in one object.

    As a decorator (sync or async function), each call starts its own span, as the SDK's does."""

    __slots__ = ("_args", "_entered", "_span", "_token", "_tracer")

    def __init__(self, tracer: _LeanTracer, args: tuple[Any, ...]) -> None:
        self._tracer = tracer
        self._args = args
        self._entered = False
        self._span: trace_api.Span | None = None
        self._token: object = None

    def __enter__(self) -> trace_api.Span:
        if self._entered:  # as the SDK's: one `with` per call (a decorator makes one per call of its function)
            raise RuntimeError("a start_as_current_span context manager is entered once")
        self._entered = True
        name, context, kind, attributes, links, start_time, record_exception, set_status, _ = self._args
        span = self._tracer.start_span(name, context, kind, attributes, links, start_time, record_exception, set_status)
        self._token = context_api.attach(trace_api.set_span_in_context(span))
        self._span = span
        return span

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        span, token = self._span, self._token
        self._span = self._token = None
        if span is None:
            return
        *_, record_exception, set_status, end_on_exit = self._args
        try:
            context_api.detach(token)  # type: ignore[arg-type]
            if isinstance(error, Exception) and isinstance(span, trace_api.Span) and span.is_recording():
                if record_exception:
                    span.record_exception(error)
                if set_status:
                    span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"))
        finally:
            if end_on_exit:
                span.end()

    def __call__(self, func: _F) -> _F:
        tracer, args = self._tracer, self._args
        if inspect.iscoroutinefunction(func):

            @functools.wraps(func)
            async def traced_async(*a: Any, **k: Any) -> Any:
                with _Current(tracer, args):
                    return await func(*a, **k)

            return traced_async  # type: ignore[return-value]

        @functools.wraps(func)
        def traced(*a: Any, **k: Any) -> Any:
            with _Current(tracer, args):
                return func(*a, **k)

        return traced  # type: ignore[return-value]


class _LeanTracer(trace_api.Tracer):
    """An SDK `Tracer`'s spans, started here under `always_on` / `parentbased_always_on`, by it otherwise."""

    def __init__(self, sdk: Tracer) -> None:
        self._sdk = sdk
        self._metered = type(getattr(sdk, "_tracer_metrics", None)).__name__ != "NoOpTracerMetrics"

    def start_span(
        self,
        name: str,
        context: context_api.Context | None = None,
        kind: SpanKind = SpanKind.INTERNAL,
        attributes: Mapping[str, Any] | None = None,
        links: Sequence[trace_api.Link] | None = (),
        start_time: int | None = None,
        record_exception: bool = True,
        set_status_on_exception: bool = True,
    ) -> trace_api.Span:
        sdk = self._sdk
        sampler = sdk.sampler
        always = sampler is sampling.ALWAYS_ON
        parent: SpanContext | None = trace_api.get_current_span(context).get_span_context()
        valid = parent is not None and parent.is_valid
        if (
            links
            or self._metered
            or not (always or sampler is sampling.DEFAULT_ON)
            or (valid and not always and not parent.trace_flags.sampled)  # type: ignore[union-attr]  # ParentBased's "no"
            or not sdk._is_enabled()
        ):
            return sdk.start_span(
                name, context, kind, attributes, links, start_time, record_exception, set_status_on_exception
            )
        ids = sdk.id_generator
        if parent is not None and valid:
            flags = _SAMPLED_RANDOM if parent.trace_flags.random_trace_id else _SAMPLED
            span_context = SpanContext(parent.trace_id, ids.generate_span_id(), False, flags, parent.trace_state)
        else:
            parent = None
            trace_id = ids.generate_trace_id()
            flags = _SAMPLED_RANDOM if ids.is_trace_id_random() else _SAMPLED
            span_context = SpanContext(trace_id, ids.generate_span_id(), False, flags, None)
        span = _LeanSpan(sdk, name, span_context, parent, attributes, kind, record_exception, set_status_on_exception)
        span.start(start_time=start_time, parent_context=context)
        return span

    def start_as_current_span(  # type: ignore[override]  # a context manager and decorator, as the API's
        self,
        name: str,
        context: context_api.Context | None = None,
        kind: SpanKind = SpanKind.INTERNAL,
        attributes: Mapping[str, Any] | None = None,
        links: Sequence[trace_api.Link] | None = (),
        start_time: int | None = None,
        record_exception: bool = True,
        set_status_on_exception: bool = True,
        end_on_exit: bool = True,
    ) -> Iterator[trace_api.Span]:
        args = (
            name,
            context,
            kind,
            attributes,
            links,
            start_time,
            record_exception,
            set_status_on_exception,
            end_on_exit,
        )
        return _Current(self, args)  # type: ignore[return-value]

    def __getattr__(self, name: str) -> Any:  # anything else an SDK tracer has (its resource, its sampler...)
        if name == "_sdk":
            raise AttributeError(name)
        return getattr(self._sdk, name)


class LeanTracerProvider(TracerProvider):
    """The SDK's `TracerProvider`; its tracers start spans with `_LeanTracer` when `compatible()`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._wrapped: dict[Tracer, _LeanTracer] = {}

    def get_tracer(self, *args: Any, **kwargs: Any) -> trace_api.Tracer:
        tracer = super().get_tracer(*args, **kwargs)  # the SDK's, one per scope (a no-op one when disabled)
        if type(tracer) is not Tracer or not compatible():
            return tracer
        wrapped = self._wrapped.get(tracer)
        if wrapped is None:
            wrapped = self._wrapped.setdefault(tracer, _LeanTracer(tracer))
        return wrapped


@functools.cache
def compatible() -> bool:
    """A span and its attributes built here have exactly the fields of ones the SDK builds.

    Checked once per process, on a span of a provider of its own (its sampler, resource and meter
    given, so neither the environment's settings nor its resource detectors play a part)."""
    try:
        provider = TracerProvider(
            sampler=sampling.ALWAYS_ON,
            resource=Resource.get_empty(),
            shutdown_on_exit=False,
            meter_provider=NoOpMeterProvider(),
        )
        tracer = provider.get_tracer("celery_mcp_tasks.fields")
        if not isinstance(tracer, Tracer):
            return False
        official = tracer.start_span("fields", attributes={"a": 1})
        official.end()
        ours = _LeanSpan(tracer, "fields", official.get_span_context(), None, {"a": 1}, SpanKind.INTERNAL, True, True)
        official_attributes = getattr(official, "_attributes", None)
        same = (
            isinstance(official, Span)
            and vars(official).keys() == vars(ours).keys()
            and isinstance(official_attributes, BoundedAttributes)
            and vars(official_attributes).keys() == vars(ours._attributes).keys()
            and all(hasattr(tracer, name) for name in ("_span_limits", "_instrumentation_scope", "_is_enabled"))
        )
    except Exception as error:  # noqa: BLE001 - any surprise means: the SDK's own tracers
        logger.info(
            "tracing: could not compare span fields with the SDK's (%s); its own tracers start spans",
            type(error).__name__,
        )
        return False
    if not same:
        logger.info("tracing: this opentelemetry-sdk's spans have other fields; its own tracers start them")
    return same
