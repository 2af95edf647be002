"""What Celery's trace logs about a job's run, checked in process (`job.apply(headers=...)` runs the trace).

An MCP task's run never shows its result or its arguments, in the line or in the
record's `data` that custom handlers read; a run without an outcome says how it
ended. A user's plain Celery task, and a `.delay()` of a job, keep Celery's lines.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from mcp.server.mcpserver.exceptions import ResourceError, ToolError
from mcp.shared.exceptions import MCPError

from celery_mcp_tasks import McpTasks, TaskContext, elicit
from celery_mcp_tasks.app import internals
from celery_mcp_tasks.config import Settings
from celery_mcp_tasks.migrate import upgrade
from celery_mcp_tasks.model import task_key
from celery_mcp_tasks.worker import tracelog
from celery_mcp_tasks.worker.job import DISPATCH_HEADER, KEY_HEADER

SECRET = "attack-at-dawn"


@pytest.fixture(autouse=True)
def no_trace_filter_yet(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Each test starts as a fresh process does: the filter goes on at a job's first run, not before."""
    trace = logging.getLogger(tracelog.TRACE_LOGGER)
    kept = list(trace.filters)
    for found in kept:
        if isinstance(found, tracelog.JobTraceFilter):
            trace.removeFilter(found)
    monkeypatch.setattr(tracelog, "_installed", False)
    yield
    trace.filters[:] = kept


@pytest.fixture
def tasks(tmp_path: Path) -> McpTasks:
    settings = Settings(data_dir=tmp_path, janitor_interval_s=None)
    upgrade(settings.store_url)
    return McpTasks("trace-log", celery=Celery("trace-log"), settings=settings)


class TraceRecords:
    """The `celery.app.trace` records of the test so far (caplog's list is per phase: read it late)."""

    def __init__(self, caplog: pytest.LogCaptureFixture) -> None:
        self.caplog = caplog

    def __iter__(self) -> Iterator[logging.LogRecord]:
        return iter([r for r in self.caplog.records if r.name == "celery.app.trace"])


@pytest.fixture
def trace_records(caplog: pytest.LogCaptureFixture) -> TraceRecords:
    caplog.set_level(logging.INFO, logger="celery.app.trace")
    return TraceRecords(caplog)


def run_as_task(tasks: McpTasks, job: Any, tool: str, **arguments: Any) -> str:
    task_id, _ = internals(tasks).service().create(owner=None, tool=tool, arguments=arguments)
    job.apply(kwargs=arguments, headers={KEY_HEADER: task_key(task_id), DISPATCH_HEADER: 1})
    return task_id


def lines(records: TraceRecords, name: str) -> list[str]:
    """Lines about `name` (eager runs are not shadowed: the job's full Celery name ends in it)."""
    return [r.getMessage() for r in records if re.match(rf"Task (\S+\.)?{re.escape(name)}\[", r.getMessage())]


def assert_nothing_secret(records: TraceRecords) -> None:
    for record in records:
        assert SECRET not in record.getMessage()
        assert SECRET not in repr(getattr(record, "data", None))


def test_a_completed_run_logs_that_it_succeeded_but_not_its_result_or_arguments(
    tasks: McpTasks, trace_records: TraceRecords
) -> None:
    @tasks.mcp_task
    def secret_report(topic: str) -> str:
        return f"report on {topic}"

    run_as_task(tasks, secret_report, "secret_report", topic=SECRET)
    [line] = lines(trace_records, "secret_report")
    assert " succeeded in " in line and line.endswith("s")
    assert_nothing_secret(trace_records)
    data = next(r for r in trace_records if "secret_report" in r.getMessage()).data  # type: ignore[attr-defined]
    assert data["return_value"] == "<not logged>" and data["kwargs"] == "<tool arguments are not logged>"


def test_a_run_that_asks_for_input_is_not_logged_as_succeeded_none(
    tasks: McpTasks, trace_records: TraceRecords
) -> None:
    @tasks.mcp_task(needs=("elicitation",))
    def ask(topic: str, ctx: TaskContext) -> str:
        ctx.require_input({"ok": elicit(f"Write about {topic}?", {"ok": bool})})

    @tasks.mcp_task
    def elsewhere(ctx: TaskContext) -> str:
        ctx.hand_off("webhook", within_s=60)

    run_as_task(tasks, ask, "ask", topic=SECRET)
    run_as_task(tasks, elsewhere, "elsewhere")
    [asked] = lines(trace_records, "ask")
    [handed] = lines(trace_records, "elsewhere")
    assert " ended its run in " in asked and asked.endswith("s: waiting for input")
    assert handed.endswith("s: handed off")
    assert not [line for line in (asked, handed) if "succeeded" in line or "None" in line]
    assert_nothing_secret(trace_records)


def test_a_skipped_run_says_why(tasks: McpTasks, trace_records: TraceRecords) -> None:
    @tasks.mcp_task
    def late(topic: str) -> str:
        return topic

    task_id, _ = internals(tasks).service().create(owner=None, tool="late", arguments={"topic": SECRET})
    internals(tasks).service().cancel(task_id, None)
    late.apply(kwargs={"topic": SECRET}, headers={KEY_HEADER: task_key(task_id), DISPATCH_HEADER: 1})
    [line] = lines(trace_records, "late")
    assert line.endswith("s: skipped, its task is already final, or cannot be read in this process")


def test_failures_and_retries_carry_no_arguments(tasks: McpTasks, trace_records: TraceRecords) -> None:
    @tasks.mcp_task(autoretry_for=(RuntimeError,), max_retries=1, retry_kwargs={"countdown": 0}, retry_jitter=False)
    def grumpy(topic: str) -> str:
        raise RuntimeError("not today")

    run_as_task(tasks, grumpy, "grumpy", topic=SECRET)
    logged = lines(trace_records, "grumpy")
    assert any(" retry: " in line for line in logged) and any(" raised unexpected: " in line for line in logged)
    assert_nothing_secret(trace_records)


def test_plain_celery_tasks_and_a_delay_of_a_job_keep_celerys_own_lines(
    tasks: McpTasks, trace_records: TraceRecords
) -> None:
    @tasks.celery.task(name="plain_echo")
    def plain_echo(text: str) -> str:
        return f"echo {text}"

    @tasks.mcp_task
    def direct(text: str) -> str:
        return f"direct {text}"

    plain_echo.apply(kwargs={"text": "hello"})
    direct.apply(kwargs={"text": "hi"})  # no row-key header: a plain Celery call of the job
    [plain] = lines(trace_records, "plain_echo")
    [called] = lines(trace_records, "direct")
    assert plain.endswith(": 'echo hello'")
    assert called.endswith(": 'direct hi'")


def test_stored_arguments_that_no_longer_fit_fail_naming_the_field_not_its_value(
    tasks: McpTasks, trace_records: TraceRecords
) -> None:
    @tasks.mcp_task
    def count(n: int) -> str:
        return str(n)

    task_id = run_as_task(tasks, count, "count", n=SECRET)  # written past the web side's validation
    record = internals(tasks).service().record(task_key(task_id))
    assert record is not None and record.status.value == "failed"
    assert record.status_message == "Job failed: ValueError: stored arguments do not fit the tool: n"
    [line] = lines(trace_records, "count")  # the failure was logged (so the check below looked at something)
    assert " raised unexpected: ValueError" in line
    assert_nothing_secret(trace_records)


def test_a_result_that_does_not_fit_the_output_schema_fails_naming_the_field_not_the_value(
    tasks: McpTasks, trace_records: TraceRecords
) -> None:
    @tasks.mcp_task
    def count(topic: str) -> int:
        return topic  # type: ignore[return-value]  # the value returned is the secret: it must not be quoted

    task_id = run_as_task(tasks, count, "count", topic=SECRET)
    record = internals(tasks).service().record(task_key(task_id))
    assert record is not None and record.status.value == "failed"
    assert record.status_message == "Job failed: ValueError: the result does not fit the tool's output schema: result"
    assert SECRET not in repr(record.error)
    [line] = lines(trace_records, "count")
    assert " raised unexpected: ValueError" in line
    assert_nothing_secret(trace_records)


def test_tool_and_resource_errors_complete_the_task_with_is_error_as_the_sdk_words_them(tasks: McpTasks) -> None:
    @tasks.mcp_task
    def refuse(topic: str) -> str:
        raise ToolError(f"no {topic}")

    @tasks.mcp_task
    def unreadable(topic: str) -> str:
        raise ResourceError(f"cannot read {topic}")

    for name, job, text in [("refuse", refuse, "no x"), ("unreadable", unreadable, "cannot read x")]:
        record = internals(tasks).service().record(task_key(run_as_task(tasks, job, name, topic="x")))
        assert record is not None and record.status.value == "completed", name
        assert record.result is not None and record.result["isError"] is True
        assert record.result["content"] == [{"type": "text", "text": f"Error executing tool {name}: {text}"}]


def test_a_protocol_error_fails_the_task_with_its_own_code_message_and_data(tasks: McpTasks) -> None:
    @tasks.mcp_task
    def strict(topic: str) -> str:
        raise MCPError(-32602, f"unknown topic {topic}", data={"field": "topic"})

    record = internals(tasks).service().record(task_key(run_as_task(tasks, strict, "strict", topic="x")))
    assert record is not None and record.status.value == "failed"
    assert record.error == {"code": -32602, "message": "unknown topic x", "data": {"field": "topic"}}
    assert record.status_message == "Job failed: MCPError: unknown topic x"


def test_a_protocol_error_over_the_result_limits_keeps_its_code_and_its_message_start(tasks: McpTasks) -> None:
    """An error is the task's outcome as a result is: held to the same limits, by size and by depth."""

    @tasks.mcp_task(max_result_bytes=1_000)
    def wordy(topic: str) -> str:
        raise MCPError(-32000, "m" * 2_000, data="d" * 5_000)

    nested: Any = "leaf"
    for _ in range(150):
        nested = [nested]

    @tasks.mcp_task
    def deep(topic: str) -> str:
        raise MCPError(-32000, "too deep", data=nested)

    for name, job, start in [
        ("wordy", wordy, "m" * 500 + " (the rest was not stored: Error too large"),
        ("deep", deep, "too deep (the rest was not stored: Error nested too deeply"),
    ]:
        record = internals(tasks).service().record(task_key(run_as_task(tasks, job, name, topic="x")))
        assert record is not None and record.status.value == "failed" and record.error is not None, name
        assert set(record.error) == {"code", "message"} and record.error["code"] == -32000, name
        assert record.error["message"].startswith(start) and len(record.error["message"]) < 1_000, record.error


def test_a_failed_runs_line_shows_the_start_of_its_exception_not_its_data(
    tasks: McpTasks, trace_records: TraceRecords
) -> None:
    """An MCPError's repr carries its data (a URL elicitation's URLs, whatever the job attached) whole."""

    @tasks.mcp_task
    def refuse(topic: str) -> str:
        raise MCPError(-32042, "open the page", data={"pad": "x" * 2_000, "url": SECRET})

    run_as_task(tasks, refuse, "refuse", topic="x")
    [line] = lines(trace_records, "refuse")
    assert " raised unexpected: MCPError(-32042, 'open the page'" in line and line.endswith("…"), line
    assert len(line) < 1_000
    assert_nothing_secret(trace_records)


def test_a_self_retry_that_runs_out_fails_without_quoting_the_arguments(
    tasks: McpTasks, trace_records: TraceRecords
) -> None:
    """Celery's MaxRetriesExceededError quotes the job's args and kwargs; its text would be the task's error and
    the worker's ERROR line. An MCP run's says how many attempts were made instead."""

    @tasks.mcp_task(bind=True, max_retries=1)
    def stubborn(self: Any, topic: str) -> str:
        raise self.retry(countdown=0)

    task_id = run_as_task(tasks, stubborn, "stubborn", topic=SECRET)
    record = internals(tasks).service().record(task_key(task_id))
    assert record is not None and record.status.value == "failed"
    assert record.status_message == "Job failed: MaxRetriesExceededError: gave up after 2 attempts"
    assert any(" raised unexpected: MaxRetriesExceededError" in line for line in lines(trace_records, "stubborn"))
    assert_nothing_secret(trace_records)


class Unpicklable(Exception):
    """An exception Celery cannot pickle for its failure signal (nor any base class of it with its arguments)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason, threading.Lock())

    def __str__(self) -> str:
        return str(self.args[0])


def test_a_job_failing_with_an_exception_celery_cannot_pickle_names_that_exception(tasks: McpTasks) -> None:
    @tasks.mcp_task
    def brittle(topic: str) -> str:
        raise Unpicklable("the sensor went away")

    task_id = run_as_task(tasks, brittle, "brittle", topic="x")
    record = internals(tasks).service().record(task_key(task_id))
    assert record is not None and record.status_message == "Job failed: Unpicklable: the sensor went away"


def test_the_line_for_a_dropped_message_of_a_job_leaves_its_arguments_and_record_out() -> None:
    """The consumer's line for a message of a task the worker does not have (Celery's template and arguments:
    tests/worker/test_celery_internals.py), for one of our jobs and for any other task."""
    from celery_mcp_tasks.worker.celery_internals import unknown_task_template

    ours = {"id": "cid", "task": "app.added", "shadow": "added", KEY_HEADER: "k" * 64, "mcp_task_record": SECRET}
    theirs = {"id": "cid", "task": "app.other"}
    body = f"[[], {{'note': '{SECRET}'}}, {{}}] (40b)"
    lines = []
    for headers in (ours, theirs):
        record = logging.LogRecord(
            "celery.worker.consumer.consumer", logging.ERROR, __file__, 1, unknown_task_template(), None, None
        )
        record.args = (KeyError("app.added"), body, headers, {"routing_key": "q"})
        assert tracelog.DroppedJobFilter().filter(record)
        lines.append(record.getMessage())
    assert SECRET not in lines[0] and "<an MCP task's arguments are not logged>" in lines[0]
    assert "'shadow': 'added'" in lines[0] and "'routing_key': 'q'" in lines[0]  # what names the job stays
    assert SECRET in lines[1]  # another task's line is Celery's own
