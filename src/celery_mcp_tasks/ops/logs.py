"""Structured logs: one JSON object a line for web, worker and beat, and the task lifecycle as log events.

Only the handlers this package or Celery set up are restyled, never one the application configured.
Whatever the format, a record never carries a task id (a bearer capability): our code logs at most
the row key's first 8 hex digits, and `RedactTaskIds` is the net under that on every handler styled.
"""

from __future__ import annotations

import copy
import functools
import json
import logging
import sys
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from opentelemetry import trace

from celery_mcp_tasks.model import TaskRecord, TaskStatus
from celery_mcp_tasks.ops.metrics import queued_at
from celery_mcp_tasks.ops.redaction import KEY_SHOWN, RedactTaskIds, record_message, redact
from celery_mcp_tasks.ops.root_handler import ROOT_HANDLER, plain_root_logging
from celery_mcp_tasks.plugin import Plugin, Runtime
from celery_mcp_tasks.worker.celery_internals import TRACE_LOGGER

LIFECYCLE_LOGGER = "celery_mcp_tasks.tasks"
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime", "taskName"}
# Extras never rendered: Celery's `data` (a job's arguments and result), uvicorn's colour copy, any task id.
_DROPPED = frozenset({"data", "color_message", "task_id", "task_name", "taskId"})
_FIRST = ("tool", "key", "status", "duration_ms")


class JsonFormatter(logging.Formatter):
    """One JSON object a line: time (ISO-8601 UTC), level, logger, event, message, then what is known.

    Known fields: the record's scalar `extra` values (`event`, `tool`, `key` (cut to 8 hex digits),
    `status`, `duration_ms`, ...), the tool and key of the MCP job running in this thread (worker),
    `trace_id` / `span_id` of the current OpenTelemetry span when one is valid, and `exception` for
    errors. Every string is passed through `redact`. Usable from `logging.config`:
    `{"()": "celery_mcp_tasks.ops.logs.JsonFormatter"}`; format strings are ignored.
    """

    def __init__(self, *_args: Any, **_kwargs: Any) -> None:
        super().__init__()

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC)
            .isoformat(timespec="milliseconds")
            .replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "event": _event(record),
            "message": redact(record_message(record)),
        }
        fields = {**_job_fields(), **_access_fields(record), **_extras(record)}
        for name in _FIRST:
            if name in fields:
                line[name] = fields.pop(name)
        for name, value in fields.items():
            line.setdefault(name, value)  # an extra never overwrites the time, level, logger or message
        span = trace.get_current_span().get_span_context()
        if span.is_valid:
            line["trace_id"], line["span_id"] = format(span.trace_id, "032x"), format(span.span_id, "016x")
        if record.exc_info:
            line["error_type"] = getattr(record.exc_info[0], "__name__", None)
        exception = record.exc_text or (self.formatException(record.exc_info) if record.exc_info else None)
        if exception:
            line["exception"] = redact(exception)
        if record.stack_info:
            line["stack"] = redact(record.stack_info)
        return json.dumps(line, ensure_ascii=False, default=str)


def _extras(record: logging.LogRecord) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for name, value in vars(record).items():
        if name in _STANDARD or name in _DROPPED or name.startswith("_") or name == "event":
            continue
        if isinstance(value, str):
            found[name] = value[:KEY_SHOWN] if name == "key" else redact(value)
        elif value is None or isinstance(value, (bool, int, float)):
            found[name] = value
    return found


@functools.cache
def _celery_events() -> dict[str, str]:
    """Celery's trace-line templates (and the ones `worker.tracelog` swaps in for our jobs) to event names."""
    from celery_mcp_tasks.worker import tracelog
    from celery_mcp_tasks.worker.celery_internals import trace_templates

    events = {template: f"celery.task.{said}" for said, template in trace_templates().items()}
    events[tracelog.SUCCEEDED] = "celery.task.succeeded"
    events[tracelog.ENDED] = "celery.task.run_ended"
    return events


def _event(record: logging.LogRecord) -> str:
    explicit = record.__dict__.get("event")
    if explicit is not None:
        return str(explicit)
    if record.name.startswith("celery.") and TRACE_LOGGER in sys.modules:  # the trace logger: its module's name
        template = record.__dict__.get("_mcp_template", record.msg)
        if isinstance(template, str) and template in _celery_events():
            return _celery_events()[template]
    if record.name == "uvicorn.access":
        return "http.request"
    return "log"


def _access_fields(record: logging.LogRecord) -> dict[str, Any]:
    """uvicorn's access line as fields (client, method, path, HTTP version, status are its arguments)."""
    if record.name != "uvicorn.access" or not isinstance(record.args, tuple) or len(record.args) != 5:
        return {}
    _client, method, path, _version, status = record.args
    return {"http_method": str(method), "http_path": redact(str(path)), "http_status": status}


def _job_fields() -> dict[str, str]:
    """The tool and key prefix of the MCP job this thread runs (a worker), so its own lines name their task."""
    if "celery" not in sys.modules:  # no job runs in a process that never loaded Celery
        return {}
    from celery import current_task  # a proxy: None outside a task, so no `mcp_tool`

    task: Any = current_task
    tool = getattr(task, "mcp_tool", None)
    if tool is None:
        return {}
    from celery_mcp_tasks.worker.job import row_key

    key = row_key(task.request)
    fields = {"tool": str(tool.name)}
    if key:
        fields["key"] = key[:KEY_SHOWN]
    return fields


class LifecycleLog:
    """An `Observer` that logs each task's creation, starts, questions and end, with fields, never content:
    `task.finished` is INFO, the rest DEBUG (`logging.getLogger("celery_mcp_tasks.tasks").setLevel("DEBUG")`)."""

    def __init__(self) -> None:
        self.logger = logging.getLogger(LIFECYCLE_LOGGER)

    def task_changed(self, before: TaskRecord | None, after: TaskRecord) -> None:
        for event, level, fields in lifecycle_events(before, after):
            if self.logger.isEnabledFor(level):
                detail = "".join(f" {name}={value}" for name, value in fields.items())
                self.logger.log(
                    level,
                    "%s tool=%s key=%s%s",
                    event,
                    after.tool,
                    after.key[:KEY_SHOWN],
                    detail,
                    extra={"event": event, "tool": after.tool, "key": after.key[:KEY_SHOWN], **fields},
                )


def lifecycle_events(before: TaskRecord | None, after: TaskRecord) -> list[tuple[str, int, dict[str, Any]]]:
    """The events one committed change makes: (name, level, fields)."""
    events: list[tuple[str, int, dict[str, Any]]] = []
    if before is None:
        events.append(("task.created", logging.DEBUG, {"status": after.status.value}))
    if after.started_at is not None and (before is None or before.started_at != after.started_at):
        sent_at = after.created_at
        if before is not None and before.started_at is None:
            sent_at = queued_at(before)  # the send (or a retry's due time) this run answers, as the metrics
        wait = max(after.started_at - sent_at, 0)
        events.append(("task.started", logging.DEBUG, {"queue_wait_ms": wait, "attempt": after.attempt + 1}))
    if after.status is TaskStatus.INPUT_REQUIRED and (before is None or before.status is not after.status):
        events.append(("task.input_required", logging.DEBUG, {"inputs": len(after.input_requests)}))
    if after.terminal and (before is None or not before.terminal):
        duration = max(after.updated_at - after.created_at, 0)
        events.append(("task.finished", logging.INFO, {"status": after.status.value, "duration_ms": duration}))
    return events


def style_handler(handler: logging.Handler, json_format: bool) -> None:
    """Redaction always; the JSON formatter in json mode. Idempotent."""
    if not any(isinstance(f, RedactTaskIds) for f in handler.filters):
        handler.addFilter(RedactTaskIds())
    if json_format and not isinstance(handler.formatter, JsonFormatter):
        handler.setFormatter(JsonFormatter())


def style_web_root(json_format: bool) -> bool:
    """Style the root handler `plain_root_logging` installed, if it is there; True when it was."""
    ours = [h for h in logging.getLogger().handlers if h.get_name() == ROOT_HANDLER]
    for handler in ours:
        style_handler(handler, json_format)
    if ours and json_format:
        logging.captureWarnings(True)  # a warning is one JSON line too, not a bare line on stderr
    return bool(ours)


def uvicorn_log_config(plugins: Iterable[object]) -> dict[str, Any] | None:
    """The `log_config` for uvicorn, for an app with these `plugins`: when its `Logs` plugin writes JSON (given
    in code, or by MCP_TASKS_LOG_FORMAT=json) none, so uvicorn's loggers propagate to the root handler, access
    lines included; else a copy of uvicorn's own default with `RedactTaskIds` on each of its handlers."""
    if any(isinstance(plugin, Logs) and plugin.json for plugin in plugins):
        return None
    from uvicorn.config import LOGGING_CONFIG

    config = copy.deepcopy(LOGGING_CONFIG)
    config.setdefault("filters", {})["redact"] = {"()": RedactTaskIds}
    for handler in config["handlers"].values():
        handler["filters"] = [*handler.get("filters", []), "redact"]
    return config


_celery = {"json": False, "connected": False}


def _celery_styled(handlers: list[logging.Handler]) -> None:
    from celery.utils.log import ColorFormatter

    for handler in handlers:
        if isinstance(handler.formatter, (ColorFormatter, JsonFormatter)) or handler.get_name() == ROOT_HANDLER:
            style_handler(handler, _celery["json"])


def _after_setup_logger(sender: Any = None, logger: logging.Logger | None = None, **_: Any) -> None:
    """Celery configured the root (and multiprocessing) logger of a worker or beat: restyle what it made."""
    from celery.utils.log import get_multiprocessing_logger

    for target in (logger, get_multiprocessing_logger()):
        if target is not None:
            _celery_styled(list(target.handlers))


def _after_setup_task_logger(sender: Any = None, logger: logging.Logger | None = None, **_: Any) -> None:
    if logger is not None:
        _celery_styled(list(logger.handlers))


def _connect_celery(json_format: bool) -> None:
    """Once per process; the format is the last installed app's (a worker or beat serves one app)."""
    from celery import signals

    _celery["json"] = json_format
    if not _celery["connected"]:
        signals.after_setup_logger.connect(_after_setup_logger, weak=False)
        signals.after_setup_task_logger.connect(_after_setup_task_logger, weak=False)
        _celery["connected"] = True


class Logs(Plugin):
    """The logs plugin: the task lifecycle as log events, task-id redaction on the handlers this package
    or Celery made (the web root handler, a worker's and beat's), and with `json=True` one JSON object
    a line on them (MCP_TASKS_LOG_FORMAT=json turns it on with JSON)."""

    def __init__(self, *, json: bool = False) -> None:
        self.json = json
        self._lifecycle = LifecycleLog()

    def setup(self, runtime: Runtime) -> None:
        # Turned on, the plugin is the application asking for these lines: a process that configured no
        # logging (a worker before Celery sets its own up, a web process) gets the package's root handler.
        plain_root_logging()
        style_web_root(self.json)
        _connect_celery(self.json)

    def task_changed(self, before: TaskRecord | None, after: TaskRecord) -> None:
        self._lifecycle.task_changed(before, after)
