"""Structured logs: the JSON line, the lifecycle events and where they are installed (redaction: test_redaction)."""

from __future__ import annotations

import io
import json
import logging
import logging.config
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from celery.app import trace as celery_trace
from celery.utils.log import ColorFormatter
from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

from celery_mcp_tasks.app import internals
from celery_mcp_tasks.config import Settings
from celery_mcp_tasks.model import Run, new_task_id, task_key
from celery_mcp_tasks.ops import logs
from celery_mcp_tasks.ops.logs import (
    JsonFormatter,
    LifecycleLog,
    Logs,
    RedactTaskIds,
    lifecycle_events,
    uvicorn_log_config,
)
from celery_mcp_tasks.ops.redaction import REDACTED
from celery_mcp_tasks.ops.root_handler import ROOT_HANDLER
from celery_mcp_tasks.worker.janitor import METRIC
from tests.builders import record


def _record(
    msg: Any = "hello", *args: Any, level: int = logging.INFO, name: str = "x", **extra: Any
) -> logging.LogRecord:
    made = logging.LogRecord(name, level, __file__, 1, msg, args or None, None)
    made.__dict__.update(extra)
    return made


def _line(made: logging.LogRecord) -> dict[str, Any]:
    text = JsonFormatter().format(made)
    assert "\n" not in text
    parsed: dict[str, Any] = json.loads(text)
    return parsed


# -- redaction -----------------------------------------------------------------------------


def test_redacting_an_argument_keeps_the_template_and_the_arguments_shape() -> None:
    """uvicorn's access formatter unpacks `args`: an id in the path must not turn into a logging error."""
    from uvicorn.logging import AccessFormatter

    task_id = new_task_id()
    made = _record('%s - "%s %s HTTP/%s" %d', "127.0.0.1:5", "GET", f"/t/{task_id}", "1.1", 404, name="uvicorn.access")
    RedactTaskIds().filter(made)
    assert made.args == ("127.0.0.1:5", "GET", f"/t/{REDACTED}", "1.1", 404)
    text = AccessFormatter("%(client_addr)s - %(request_line)s %(status_code)s", use_colors=False).format(made)
    assert text == f"127.0.0.1:5 - GET /t/{REDACTED} HTTP/1.1 404 Not Found"
    assert _line(made)["http_path"] == f"/t/{REDACTED}"


def test_a_redacted_celery_line_keeps_its_event_name() -> None:
    made = _record(celery_trace.LOG_SUCCESS, name="celery.app.trace")
    made.args = {"name": "t", "id": "1", "runtime": 0.1, "return_value": new_task_id()}
    RedactTaskIds().filter(made)
    line = _line(made)
    assert line["event"] == "celery.task.succeeded" and REDACTED in line["message"]


# -- the JSON line ---------------------------------------------------------------------------


def test_a_line_has_the_common_fields_in_utc() -> None:
    made = _record("%s and %d", "this", 3, name="celery_mcp_tasks.mcp")
    made.created = 1_700_000_000.25
    line = _line(made)
    assert list(line)[:5] == ["time", "level", "logger", "event", "message"]
    assert line == {
        "time": "2023-11-14T22:13:20.250Z",
        "level": "INFO",
        "logger": "celery_mcp_tasks.mcp",
        "event": "log",
        "message": "this and 3",
    }


def test_extras_are_rendered_scalars_only_and_the_key_is_cut_to_its_prefix() -> None:
    key = task_key(new_task_id())
    line = _line(
        _record(
            event=METRIC,
            tool="report",
            key=key,
            status="completed",
            duration_ms=12,
            removed=3,
            ratio=0.5,
            data={"args": "secret"},  # Celery's copy of a task's arguments
            task_id="celery-or-not",
            arguments={"a": 1},
            time="not the time",
        )
    )
    assert line["event"] == METRIC and line["key"] == key[:8] and line["tool"] == "report"
    assert line["status"] == "completed" and line["duration_ms"] == 12 and line["removed"] == 3
    assert line["ratio"] == 0.5 and line["time"] != "not the time"
    assert not {"data", "task_id", "arguments"} & set(line)


def test_string_extras_are_redacted_too() -> None:
    task_id = new_task_id()
    assert task_id not in json.dumps(_line(_record(detail=f"for {task_id}")))


def test_an_error_carries_its_exception_text_and_type() -> None:
    try:
        raise ValueError("broken")
    except ValueError:
        made = logging.LogRecord("x", logging.ERROR, __file__, 1, "failed", None, sys.exc_info())
    line = _line(made)
    assert line["level"] == "ERROR" and line["error_type"] == "ValueError"
    assert "Traceback" in line["exception"] and "ValueError: broken" in line["exception"]


def test_bad_arguments_still_make_a_line() -> None:
    line = _line(_record("%d items", "not a number"))
    assert line["message"] == "%d items (unformattable arguments)"


def test_the_current_span_gives_trace_and_span_ids() -> None:
    context = SpanContext(
        trace_id=0x0AF7651916CD43DD8448EB211C80319C,
        span_id=0x00F067AA0BA902B7,
        is_remote=False,
        trace_flags=TraceFlags(TraceFlags.SAMPLED),
    )
    with trace.use_span(NonRecordingSpan(context)):
        line = _line(_record())
    assert line["trace_id"] == "0af7651916cd43dd8448eb211c80319c" and line["span_id"] == "00f067aa0ba902b7"
    assert "trace_id" not in _line(_record())  # no valid span: no ids


def test_celery_and_uvicorn_lines_get_event_names_and_fields() -> None:
    received = _record(celery_trace.LOG_RECEIVED, name="celery.worker.strategy")
    received.args = {"name": "report", "id": str(uuid.uuid4())}
    assert _line(received)["event"] == "celery.task.received"
    access = _record('%s - "%s %s HTTP/%s" %d', "127.0.0.1:5", "POST", "/mcp", "1.1", 202, name="uvicorn.access")
    line = _line(access)
    assert line["event"] == "http.request"
    assert (line["http_method"], line["http_path"], line["http_status"]) == ("POST", "/mcp", 202)


def test_the_formatter_is_usable_from_dict_config() -> None:
    logging.config.dictConfig(
        {
            "version": 1,
            "disable_existing_loggers": False,
            "formatters": {"json": {"()": "celery_mcp_tasks.ops.logs.JsonFormatter", "format": "%(message)s"}},
            "handlers": {"h": {"class": "logging.NullHandler", "formatter": "json"}},
            "loggers": {"tests.logs.dictconfig": {"handlers": ["h"]}},
        }
    )
    handler = logging.getLogger("tests.logs.dictconfig").handlers[0]
    assert isinstance(handler.formatter, JsonFormatter)


# -- lifecycle events ------------------------------------------------------------------------


def test_a_task_run_makes_created_started_and_finished() -> None:
    created = record(key=task_key(new_task_id()), tool="report", created_at=1_000, updated_at=1_000)
    sent = created.dispatched(1_010)
    began = sent.began(Run(1), 1_250, stale_before_ms=0)
    done = began.completed({"content": []}, 1_900)
    assert [(e, lvl, f) for e, lvl, f in lifecycle_events(None, created)] == [
        ("task.created", logging.DEBUG, {"status": "working"})
    ]
    assert lifecycle_events(created, sent) == []
    assert lifecycle_events(sent, began) == [("task.started", logging.DEBUG, {"queue_wait_ms": 240, "attempt": 1})]
    assert lifecycle_events(began, done) == [
        ("task.finished", logging.INFO, {"status": "completed", "duration_ms": 900})
    ]


def test_a_question_and_a_cancel_are_events_once() -> None:
    asking = record(key="ab" * 32).requiring_input({"q": {"method": "elicitation/create"}}, 2_000)
    assert lifecycle_events(record(key="ab" * 32), asking) == [("task.input_required", logging.DEBUG, {"inputs": 1})]
    cancelled = asking.cancelled(3_000)
    assert [e for e, _, _ in lifecycle_events(asking, cancelled)] == ["task.finished"]
    assert lifecycle_events(cancelled, cancelled) == []


def test_the_observer_logs_fields_and_never_content(caplog: pytest.LogCaptureFixture) -> None:
    key = task_key(new_task_id())
    working = record(key=key, tool="report", arguments={"topic": "the secret argument"})
    done = working.completed({"content": [{"type": "text", "text": "the secret result"}]}, 5_000)
    with caplog.at_level(logging.INFO, logger=logs.LIFECYCLE_LOGGER):
        LifecycleLog().task_changed(None, working)  # DEBUG: not at INFO
        LifecycleLog().task_changed(working, done)
    assert [r.message for r in caplog.records] == [
        f"task.finished tool=report key={key[:8]} status=completed duration_ms=4000"
    ]
    line = _line(caplog.records[0])
    assert line["event"] == "task.finished" and line["key"] == key[:8] and line["status"] == "completed"
    assert "secret" not in json.dumps(line)


# -- installing ------------------------------------------------------------------------------


@pytest.fixture
def celery_format() -> Iterator[None]:
    """The process-wide format for Celery's handlers, as it was."""
    saved = dict(logs._celery)
    yield
    logs._celery.update(saved)


def test_json_mode_styles_our_root_handler_and_no_other(celery_format: None) -> None:
    root = logging.getLogger()
    ours, theirs = logging.StreamHandler(io.StringIO()), logging.StreamHandler(io.StringIO())
    ours.set_name(ROOT_HANDLER)
    theirs.setFormatter(logging.Formatter("%(message)s"))
    root.addHandler(ours)
    root.addHandler(theirs)
    try:
        assert logs.style_web_root(json_format=True)
    finally:
        root.removeHandler(ours)
        root.removeHandler(theirs)
        logging.captureWarnings(False)
    assert isinstance(ours.formatter, JsonFormatter) and any(isinstance(f, RedactTaskIds) for f in ours.filters)
    assert not isinstance(theirs.formatter, JsonFormatter) and not theirs.filters


def test_celerys_handlers_become_json_after_its_logging_setup(celery_format: None) -> None:
    from celery import signals

    logs._connect_celery(True)
    logger = logging.getLogger("tests.logs.celery")
    celerys, users = logging.StreamHandler(io.StringIO()), logging.StreamHandler(io.StringIO())
    celerys.setFormatter(ColorFormatter("%(message)s", use_color=False))
    users.setFormatter(logging.Formatter("%(message)s"))
    logger.handlers = [celerys, users]
    try:
        signals.after_setup_logger.send(
            sender=None, logger=logger, loglevel=20, logfile=None, format="", colorize=False
        )
        signals.after_setup_task_logger.send(sender=None, logger=logger, loglevel=20, logfile=None, format="")
    finally:
        logger.handlers = []
    assert isinstance(celerys.formatter, JsonFormatter) and not isinstance(users.formatter, JsonFormatter)


def test_text_mode_keeps_celerys_format_and_adds_redaction(celery_format: None) -> None:
    logs._connect_celery(False)
    handler = logging.StreamHandler(io.StringIO())
    handler.setFormatter(ColorFormatter("%(message)s", use_color=False))
    logs._celery_styled([handler])
    assert isinstance(handler.formatter, ColorFormatter) and any(isinstance(f, RedactTaskIds) for f in handler.filters)


def test_the_logs_plugin_is_the_lifecycle_observer_only_when_turned_on(tmp_path: Path, celery_format: None) -> None:
    from celery_mcp_tasks.app import McpTasks
    from celery_mcp_tasks.ops.logs import Logs

    assert not internals(McpTasks("logs", settings=Settings(data_dir=tmp_path))).observers
    tasks = McpTasks("logs", settings=Settings(data_dir=tmp_path, log_format="json"))
    assert [type(o) for o in internals(tasks).observers] == [Logs] and internals(tasks).plugins[0].json is True  # type: ignore[attr-defined]
    assert isinstance(Logs()._lifecycle, LifecycleLog)


@pytest.fixture
def uvicorn_loggers() -> Iterator[None]:
    """uvicorn's loggers as they were: `dictConfig` below configures them for the whole process."""
    names = ("uvicorn", "uvicorn.error", "uvicorn.access")
    saved = {name: (logging.getLogger(name).handlers[:], logging.getLogger(name).propagate) for name in names}
    yield
    for name, (handlers, propagate) in saved.items():
        logging.getLogger(name).handlers, logging.getLogger(name).propagate = handlers, propagate


def test_uvicorn_keeps_its_own_lines_in_text_mode_with_redaction_and_none_in_json(
    capsys: pytest.CaptureFixture[str], uvicorn_loggers: None
) -> None:
    from uvicorn.config import LOGGING_CONFIG

    pristine = json.dumps(LOGGING_CONFIG, default=str)
    config = uvicorn_log_config([Logs()])
    assert config is not None and json.dumps(LOGGING_CONFIG, default=str) == pristine  # a copy: uvicorn's is untouched
    assert config["formatters"] == LOGGING_CONFIG["formatters"]
    logging.config.dictConfig(config)  # as uvicorn applies it
    for name in ("uvicorn", "uvicorn.access"):
        assert all(any(isinstance(f, RedactTaskIds) for f in h.filters) for h in logging.getLogger(name).handlers)
    task_id = new_task_id()
    logging.getLogger("uvicorn.error").warning("Invalid request for %s", task_id)
    logging.getLogger("uvicorn.access").info(
        '%s - "%s %s HTTP/%s" %d', "127.0.0.1:5", "GET", f"/mcp?taskId={task_id}", "1.1", 200
    )
    out, err = capsys.readouterr()
    assert task_id not in out + err
    assert f"Invalid request for {REDACTED}" in err and f'"GET /mcp?taskId={REDACTED} HTTP/1.1" 200 OK' in out
    assert uvicorn_log_config([Logs(json=True)]) is None
