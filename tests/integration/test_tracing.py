"""One trace per task, with real processes: `serve` and a prefork `celery worker` export OTLP/HTTP to a
collector in the test, on PostgreSQL + Redis, driven by the official SDK client over real HTTP.

Proven: the SDK's `tools/call` server span, which carries the creation (the tool, the row key prefix,
the status), and every run of the job (a Celery retry, and the runs after each `tasks/update` answer)
share one trace, each run a child of that span with its final write inside it; no span carries a task id; with
opentelemetry-instrumentation-celery active its publish and run spans take the place of ours (no
duplicates, same trace); a collector that is down costs no request and no job, nor does a user's
tracer provider whose sampler raises for our spans.
"""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client
from opentelemetry import trace
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

from celery_mcp_tasks.client import TasksClient
from celery_mcp_tasks.testing import ScriptedAnswers
from tests.support import POSTGRES_URL, REDIS_URL, Backend, Deployment, free_port, fresh_postgres_database, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.postgres, pytest.mark.redis]

APP = "tests.apps.runtime_app"
SERVICE = "runtime-tests"  # the app's McpTasks name: the default service.name
CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"


@dataclass(frozen=True)
class Span:
    trace_id: str
    span_id: str
    parent_id: str
    name: str
    kind: int
    attributes: dict[str, Any]
    events: tuple[tuple[str, dict[str, Any]], ...]
    service: str

    def text(self) -> str:
        """Everything the span says, for a search (names, attribute values, events)."""
        return repr((self.name, self.attributes, self.events, self.service))


def _value(any_value: Any) -> Any:
    kind = any_value.WhichOneof("value")
    return None if kind is None else getattr(any_value, kind)


def _attributes(pairs: Any) -> dict[str, Any]:
    return {pair.key: _value(pair.value) for pair in pairs}


class Collector:
    """A minimal OTLP/HTTP (protobuf) trace receiver on 127.0.0.1: stores every span it is sent."""

    def __init__(self) -> None:
        self.spans: list[Span] = []
        self.lock = threading.Lock()
        collector = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                collector.receive(ExportTraceServiceRequest.FromString(body))
                reply = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *_: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def receive(self, request: ExportTraceServiceRequest) -> None:
        found = []
        for resource_spans in request.resource_spans:
            service = str(_attributes(resource_spans.resource.attributes).get("service.name"))
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    events = tuple((event.name, _attributes(event.attributes)) for event in span.events)
                    found.append(
                        Span(
                            span.trace_id.hex(),
                            span.span_id.hex(),
                            span.parent_span_id.hex(),
                            span.name,
                            span.kind,
                            _attributes(span.attributes),
                            events,
                            service,
                        )
                    )
        with self.lock:
            self.spans.extend(found)

    def all(self) -> list[Span]:
        with self.lock:
            return list(self.spans)

    def of_task(self, task_id: str) -> list[Span]:
        """The spans that name the task's row key prefix (ours, and the instrumentor's runs we annotate)."""
        prefix = hashlib.sha256(task_id.encode()).hexdigest()[:8]
        return [span for span in self.all() if span.attributes.get("mcp_task.key_prefix") == prefix]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def backend() -> Iterator[Backend]:
    if not (POSTGRES_URL and REDIS_URL):
        pytest.skip("set MCP_TASKS_TEST_POSTGRES_URL and MCP_TASKS_TEST_REDIS_URL to run")
    with fresh_postgres_database(POSTGRES_URL) as url:
        yield Backend("pg_redis", {"MCP_TASKS_DATABASE_URL": url, "CELERY_BROKER_URL": REDIS_URL})


@pytest.fixture
def collector() -> Iterator[Collector]:
    collector = Collector()
    yield collector
    collector.close()


def _otlp(endpoint: str, **extra: str) -> dict[str, str]:
    return {
        "MCP_TASKS_TRACING": "otlp",
        "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
        "OTEL_BSP_SCHEDULE_DELAY": "100",  # export within 0.1 s (default 5 s)
        **extra,
    }


@contextmanager
def served(backend: Backend, log_dir: Path, env: dict[str, str]) -> Iterator[Deployment]:
    """`serve` and a prefork worker (two children: each builds its provider after the fork), both with `env`."""
    with Deployment(APP, backend, log_dir) as deployment:
        deployment.web(**env)
        deployment.worker(env=env)
        yield deployment


def _text(result: Any) -> str:
    return str(result.content[0].text)


def drive(url: str) -> tuple[str, str, float]:
    """With the official SDK client: a task retried once by Celery, and one answered twice via tasks/update.

    The second `tools/call` is made inside a caller's trace (CLIENT_TRACE, a remote parent made current),
    so the SDK's client puts its `traceparent` in the request's `_meta`, whether or not this test process
    has a tracer provider (with one, the SDK's own client span sits between: an explicit `_meta`
    traceparent would be replaced by that span's). Returns both task ids and the longest of the two
    `tools/call` round trips.
    """
    answers = ScriptedAnswers().when("name", {"name": "Ada"}).when("colour", {"colour": "teal"})
    tasks = TasksClient()

    async def scenario() -> tuple[str, str, float]:
        async with Client(url, extensions=[tasks], elicitation_callback=answers) as client:
            with anyio.fail_after(90):
                started = time.monotonic()
                retried = await tasks.start(client, "flaky", {"failures": 1})
                created_in = time.monotonic() - started
                caller = SpanContext(
                    int(CLIENT_TRACE, 16),
                    int(CALLER_SPAN, 16),
                    is_remote=True,
                    trace_flags=TraceFlags(TraceFlags.SAMPLED),
                )
                started = time.monotonic()
                with trace.use_span(NonRecordingSpan(caller)):
                    asked = await tasks.start(client, "two_rounds", {})
                created_in = max(created_in, time.monotonic() - started)
                assert _text(await retried.result()) == "succeeded on attempt 2"
                assert _text(await asked.result()).startswith("Ada likes teal")
                assert retried.id is not None and asked.id is not None
                return retried.id, asked.id, created_in

    return anyio.run(scenario)


def _one(spans: list[Span], what: str) -> Span:
    assert len(spans) == 1, f"expected one {what}, got {[span.name for span in spans]}"
    return spans[0]


def _runs(spans: list[Span], prefix: str) -> list[Span]:
    runs = [span for span in spans if span.name.startswith(prefix)]
    return sorted(runs, key=lambda span: (span.attributes["mcp_task.dispatch"], span.attributes["mcp_task.attempt"]))


def traced(collector: Collector, task_id: str, tool: str, run_prefix: str, runs: int) -> tuple[Span, list[Span]]:
    """(the SDK's tools/call span, which carries the creation, and the run spans) of one task, once all
    were exported."""

    def exported() -> list[Span] | None:
        """All of them, and the parent of each run (the exporters send in batches: in no particular order)."""
        spans = collector.of_task(task_id)
        calls = [span for span in spans if span.name == f"tools/call {tool}"]
        found = _runs(spans, run_prefix)
        known = {span.span_id for span in collector.all()}
        return spans if calls and len(found) >= runs and all(run.parent_id in known for run in found) else None

    spans = wait_until(exported, 30, f"the spans of the {tool} task")
    call = _one([span for span in spans if span.name == f"tools/call {tool}"], "tools/call span")
    assert call.kind == 2  # SERVER: the SDK's own span, no span of ours beside it
    assert call.attributes["mcp_task.tool"] == tool and call.attributes["mcp_task.status"] == "working"
    assert call.service == SERVICE
    assert not [span for span in collector.all() if span.name == f"tasks create {tool}"]  # one span per creation
    found = _runs(spans, run_prefix)
    assert len(found) == runs and all(run.trace_id == call.trace_id for run in found)
    assert all(run.attributes["mcp_task.tool"] == tool and run.service == SERVICE for run in found)
    return call, found


def statuses(span: Span) -> list[str]:
    return [attributes["mcp_task.status"] for name, attributes in span.events if name == "mcp_task.status"]


def assert_no_task_id(collector: Collector, *task_ids: str) -> None:
    spans = collector.all()
    assert spans
    for span in spans:
        for task_id in task_ids:
            assert task_id not in span.text(), span


def test_every_run_of_a_task_is_in_the_trace_of_its_tools_call(
    backend: Backend, collector: Collector, tmp_path: Path
) -> None:
    with served(backend, tmp_path, _otlp(collector.endpoint)) as deployment:
        retried, asked, _ = drive(deployment.url)

        call, runs = traced(collector, retried, "flaky", "mcp_task run flaky", runs=2)
        # No caller context: the trace starts at the SDK's server span. (Once in CI it had a parent that no
        # process here exported, a context from the test process's side; a server-side parent would show.)
        above = [span.name for span in collector.all() if span.span_id == call.parent_id]
        assert call.parent_id == "" or not above, above
        assert [(run.attributes["mcp_task.dispatch"], run.attributes["mcp_task.attempt"]) for run in runs] == [
            (1, 1),
            (1, 2),
        ]
        assert all(run.parent_id == call.span_id and run.kind == 5 for run in runs)  # CONSUMER, from the headers
        assert [name for name, _ in runs[0].events] == ["mcp_task.retry"]
        assert statuses(runs[1]) == ["completed"]  # the bridge's final write, inside the run's span

        call, runs = traced(collector, asked, "two_rounds", "mcp_task run two_rounds", runs=3)
        assert call.trace_id == CLIENT_TRACE and call.parent_id  # the caller's trace
        # its parent: the caller's span, or the SDK client's span under it (a provider in this process)
        assert call.parent_id == CALLER_SPAN or call.parent_id not in {span.span_id for span in collector.all()}
        assert [run.attributes["mcp_task.dispatch"] for run in runs] == [1, 2, 3]
        assert all(run.parent_id == call.span_id for run in runs)  # sent after tasks/update: still the task's
        assert [statuses(run) for run in runs] == [["input_required"], ["input_required"], ["completed"]]
        assert [run.attributes.get("mcp_task.run_end") for run in runs] == ["waiting for input"] * 2 + [None]
        updates = wait_until(
            lambda: len(found := [span for span in collector.all() if span.name == "tasks/update"]) == 2 and found,
            10,
            "the two tasks/update spans",
        )
        assert all(span.trace_id != CLIENT_TRACE for span in updates)  # requests of their own

    assert_no_task_id(collector, retried, asked)


def _auto_instrumentation() -> str:
    """The directory `opentelemetry-instrument` puts first on PYTHONPATH (its sitecustomize instruments)."""
    spec = importlib.util.find_spec("opentelemetry.instrumentation.auto_instrumentation")
    assert spec is not None and spec.submodule_search_locations
    return str(next(iter(spec.submodule_search_locations)))


def test_with_the_celery_instrumentor_its_spans_are_the_messages_and_the_trace_is_still_one(
    backend: Backend, collector: Collector, tmp_path: Path
) -> None:
    """Web and worker run as under `opentelemetry-instrument` (opentelemetry-instrumentation-celery active)."""
    env = _otlp(collector.endpoint, PYTHONPATH=_auto_instrumentation())
    with served(backend, tmp_path, env) as deployment:
        retried, asked, _ = drive(deployment.url)
        for task_id, tool, runs in ((retried, "flaky", 2), (asked, "two_rounds", 3)):
            call, found = traced(collector, task_id, tool, "run/", runs)
            spans = {span.span_id: span for span in collector.all() if span.trace_id == call.trace_id}
            for run in found:  # the instrumentor's CONSUMER span, with our attributes; its parent: a publish
                publish = spans[run.parent_id]
                assert run.kind == 5 and publish.name.startswith("apply_async/") and publish.kind == 4
                assert publish.parent_id in (call.span_id, *(other.span_id for other in found))
            assert statuses(found[-1]) == ["completed"]
    assert not [span for span in collector.all() if span.name.startswith("mcp_task run")]  # no duplicates
    assert_no_task_id(collector, retried, asked)


def test_spans_still_buffered_at_shutdown_are_flushed_on_the_way_out(
    backend: Backend, collector: Collector, tmp_path: Path
) -> None:
    """A batch due in a minute: only the exit flush (lifespan end, each pool child's exit) can send it."""
    with served(backend, tmp_path, _otlp(collector.endpoint, OTEL_BSP_SCHEDULE_DELAY="60000")) as deployment:
        retried, asked, _ = drive(deployment.url)
        assert not collector.of_task(retried)
    names = {span.name for span in collector.of_task(retried) + collector.of_task(asked)}
    runs = {"tools/call flaky", "mcp_task run flaky", "tools/call two_rounds", "mcp_task run two_rounds"}
    assert names == runs | {"tasks/update"}  # the answer's request names the task it resumed (its own trace)


def test_a_collector_that_is_down_fails_no_request_and_no_job(backend: Backend, tmp_path: Path) -> None:
    closed = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    with served(backend, tmp_path, _otlp(closed)) as deployment:
        _, _, created_in = drive(deployment.url)  # both tasks complete, their answers included
        assert created_in < 2.0
        procs = list(deployment.procs)
    for proc in procs:  # each stopped by itself on SIGTERM (the exit flush is bounded), none killed
        assert proc.popen.returncode not in (None, -signal.SIGKILL), proc.text()
    assert "exporting spans batch" in "\n".join(proc.text() for proc in procs)  # OTel's own log line says it


BROKEN_SAMPLER = """
\"\"\"As a user's own tracing setup might be: a provider whose sampler raises for this package's spans.\"\"\"
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.sampling import ALWAYS_ON, Sampler


class Raising(Sampler):
    def should_sample(self, parent_context, trace_id, name, *args, **kwargs):
        if name.startswith(("tasks create", "mcp_task run")):
            raise RuntimeError("this sampler is broken")
        return ALWAYS_ON.should_sample(parent_context, trace_id, name, *args, **kwargs)

    def get_description(self):
        return "raising"


trace.set_tracer_provider(TracerProvider(sampler=Raising()))
"""


def test_a_sampler_that_raises_fails_no_request_and_no_job(backend: Backend, tmp_path: Path) -> None:
    """The user's provider (set before the app loads, as `opentelemetry-instrument` would) is used as it is."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(BROKEN_SAMPLER)
    with served(backend, tmp_path, {"PYTHONPATH": str(site), "MCP_TASKS_TRACING": "on"}) as deployment:
        drive(deployment.url)  # both tasks complete: a retry, two tasks/update rounds
        logs = deployment.logs()
    said = logs.count("tracing: could not start a span")
    assert 1 <= said <= 3, logs  # once per process that tried: the web process and the worker's two children
    assert "this sampler is broken" in logs and "Signal handler" not in logs
