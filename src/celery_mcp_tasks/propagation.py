"""Trace propagation for the adapters: the span around a creation, the context in every job's headers.

The only tracing module `mcp/` and `worker/` import: opentelemetry-api alone (a no-op that still
propagates), neither Celery nor the SDK. Tracing never fails the call it observes: a sampler, a
processor or a propagator that raises costs that span (one warning per process).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping, MutableMapping
from contextlib import contextmanager
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

logger = logging.getLogger("celery_mcp_tasks.ops")

TRACER = trace.get_tracer("celery_mcp_tasks")
TOOL = "mcp_task.tool"
_W3C = TraceContextTextMapPropagator()
_warned: set[str] = set()


def warn_once(what: str, error: BaseException) -> None:
    """Log `what` failed, with its traceback, the first time in this process: a broken exporter setup
    fails the same way on every call, and one line says it as well as a thousand."""
    if what in _warned:
        return
    _warned.add(what)
    logger.warning("tracing: %s; going on without it (said once per process)", what, exc_info=error)


def current_traceparent() -> str | None:
    """The W3C `traceparent` of the current span (what the row stores), or None when there is no valid one."""
    if not trace.get_current_span().get_span_context().is_valid:
        return None
    carrier: dict[str, str] = {}
    _W3C.inject(carrier)
    return carrier.get("traceparent")


def start_span(
    name: str,
    attributes: Mapping[str, Any],
    *,
    parent: otel_context.Context | None = None,
    kind: SpanKind = SpanKind.INTERNAL,
) -> tuple[trace.Span, object] | None:
    """Start `name` as the current span (a child of `parent`, else of the current context): the span and its
    context token for `end_span`, or None when the sampler or a processor raised (go on without a span)."""
    try:
        span = TRACER.start_span(name, context=parent, kind=kind, attributes=attributes)
    except Exception as error:  # noqa: BLE001 - a span we cannot start is one we do without
        warn_once("could not start a span", error)
        return None
    try:
        token = otel_context.attach(trace.set_span_in_context(span, parent))
    except Exception as error:  # noqa: BLE001 - attach only stores a context; should it fail, no span either
        warn_once("could not make a span current", error)
        end_span(span, None)
        return None
    return span, token


def _no_provider() -> bool:
    return isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)


def _quietly(what: str, action: Callable[[], object]) -> None:
    try:
        action()
    except Exception as error:  # noqa: BLE001 - the span loses it, the call it measured does not
        warn_once(f"could not {what}", error)


def end_span(span: trace.Span, token: object | None) -> None:
    """Detach `token` and end `span`; a processor that raises in `on_end` is logged once, never raised."""
    try:
        if token is not None:
            otel_context.detach(token)  # type: ignore[arg-type]
    finally:
        _quietly("end a span", span.end)


def mark_failed(span: trace.Span, exc: BaseException | None) -> None:
    """The span's status is ERROR with the exception's type name only: its message may quote arguments."""
    _quietly(
        "set a span's status",
        lambda: span.set_status(Status(StatusCode.ERROR, None if exc is None else type(exc).__name__)),
    )


@contextmanager
def creating(tool: str) -> Iterator[str | None]:
    """The span of one creation and its first send; yields what the row stores.

    The SDK's `tools/call` span when it is recording (one span per creation, not two: a span costs
    ~35 us with its export; `Tracing.task_changed` gives it the attributes with the row); else
    "tasks create <tool>", started here. None without a provider (a span would only be its parent
    again, ~20 us), nor where the sampler left the call out: under the default ParentBased sampler
    ours would be left out too, and the row keeps the unsampled context, so the task's runs follow it.
    """
    current = None if _no_provider() else trace.get_current_span()
    started = None
    if current is not None and not current.is_recording():
        context = current.get_span_context()
        if not (context.is_valid and not context.trace_flags.sampled):
            started = start_span(f"tasks create {tool}", {TOOL: tool})
    if started is None:  # no span of ours: the current context (if any) is what the row keeps and every send carries
        try:
            yield current_traceparent()
        except Exception:
            if current is not None and current.is_recording():  # no row, so no attributes from the observer
                _quietly("set a span's attribute", lambda: current.set_attribute(TOOL, tool))
            raise
        return
    span, token = started
    try:
        yield current_traceparent()
    except Exception as exc:
        mark_failed(span, exc)
        raise
    finally:
        end_span(span, token)


@contextmanager
def sending(trace_context: str | None, headers: MutableMapping[str, Any]) -> Iterator[None]:
    """One send of a task's job: the task's stored context (else the caller's) is current, and written into the
    message `headers`: a resend by the reaper or after `tasks/update` belongs to the task's trace."""
    token = None
    try:
        if trace_context and trace_context != current_traceparent():  # not the first send, in `creating`
            token = otel_context.attach(_W3C.extract({"traceparent": trace_context}))
        propagate.inject(headers)
    except Exception as error:  # noqa: BLE001 - a broken propagator costs the trace, never the job
        warn_once("could not put the trace context in a job's headers", error)
    try:
        yield
    finally:
        if token is not None:
            otel_context.detach(token)
