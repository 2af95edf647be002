"""`celery-mcp-tasks call` on a terminal: the tasks client, a status line, and answers typed at the prompt.

    run_call(CallOptions(url="http://127.0.0.1:8000/mcp", tool="write_report", arguments='{"topic": "tides"}'))

Everything that talks to the server is the SDK's `Client` with `TasksClient`
(`start`, `attach`, `TaskHandle.updates/result/cancel`); this module only
renders and asks:

- on a terminal, a live status line (rich): status, statusMessage, elapsed
  time, and a progress bar when the job reports numbers;
- otherwise plain lines, one per change of status or statusMessage, then the
  result text (what the README's first command shows; no times, deterministic);
- `--json`: only the final result, as JSON.

Questions from the job reach the `Client`'s callbacks (elicitation: a form
asked field by field from `requestedSchema`; sampling: the person answers as
the model; roots: the current directory), so `TaskHandle.result()` answers
them. Ctrl-C cancels the task (`tasks/cancel`), a second Ctrl-C leaves at once.
The task id is shown to the person (it is their handle for `--resume`), never
written to a log line.
"""

from __future__ import annotations

import json
import math
import os
import signal
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, asynccontextmanager, contextmanager, nullcontext
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Literal, Protocol
from urllib.parse import urlparse

import anyio
import anyio.abc
from mcp.shared.exceptions import MCPError
from mcp_types import (
    CallToolResult,
    CreateMessageRequestParams,
    CreateMessageResult,
    ElicitRequestFormParams,
    ElicitRequestParams,
    ElicitResult,
    ErrorData,
    ListRootsResult,
    TextContent,
)
from rich.console import Console, RenderableType
from rich.live import Live
from rich.markup import escape
from rich.progress_bar import ProgressBar
from rich.spinner import Spinner
from rich.table import Table
from rich.text import Text

from celery_mcp_tasks.client.extension import TaskCancelled, TaskHandle, TaskNotFound, TasksClient
from celery_mcp_tasks.client.models import TaskState

if TYPE_CHECKING:
    from mcp.client.client import Client
    from mcp.client.session import ClientRequestContext

__all__ = [
    "EXIT_CANCELLED",
    "EXIT_FAILED",
    "EXIT_OK",
    "EXIT_TIMEOUT",
    "EXIT_USAGE",
    "CallError",
    "CallIo",
    "CallOptions",
    "FdLines",
    "FormField",
    "JsonView",
    "LineSource",
    "LiveView",
    "PlainView",
    "Prompter",
    "exit_code",
    "parse_arguments",
    "parse_form",
    "result_text",
    "run_call",
]

PROG = "celery-mcp-tasks call"
EXIT_OK = 0
EXIT_FAILED = 1  # failed, a result with isError, the server unreachable or refusing
EXIT_USAGE = 2  # ARGS not JSON / not an object, TOOL and --resume both or neither
EXIT_TIMEOUT = 124  # --timeout expired: the task keeps running (resume it), like timeout(1)
EXIT_CANCELLED = 130  # the task ended cancelled (Ctrl-C, a declined question, another client)

DECLINED_SAMPLING = -1  # the spec's code for "the user rejected the sampling request"


class CallError(Exception):
    """One line for stderr, and the exit status that goes with it."""

    def __init__(self, message: str, code: int = EXIT_FAILED) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class CallOptions:
    url: str
    tool: str | None = None
    arguments: str | None = None  # the JSON text as typed
    resume: str | None = None  # a task id to attach to instead of calling a tool
    token: str | None = None  # bearer token (None: $MCP_TASKS_TOKEN)
    json_output: bool = False
    no_wait: bool = False
    timeout: float | None = None  # seconds to wait for the end; None: as long as it runs


def exit_code(status: str | None, *, is_error: bool = False) -> int:
    """The exit status for a task's final status (None: it never ended here)."""
    if status == "completed":
        return EXIT_FAILED if is_error else EXIT_OK
    if status == "cancelled":
        return EXIT_CANCELLED
    return EXIT_FAILED


def parse_arguments(text: str | None) -> dict[str, Any]:
    """ARGS as typed -> the tool's arguments (a JSON object); `CallError` with one line otherwise."""
    if text is None or not text.strip():
        return {}
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CallError(f"ARGS is not JSON: {exc}", EXIT_USAGE) from None
    if not isinstance(parsed, dict):
        raise CallError('ARGS must be a JSON object, e.g. \'{"topic": "tides"}\'', EXIT_USAGE)
    return parsed


# -- answers typed at the prompt ------------------------------------------------------------


class LineSource(Protocol):
    async def readline(self) -> str | None:
        """The next line typed (without its newline), None at the end of input."""
        ...


class FdLines:
    """Lines from a file descriptor (stdin), read without a thread: Ctrl-C can always interrupt the wait."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._buffer = b""
        self._eof = False

    async def readline(self) -> str | None:
        while b"\n" not in self._buffer and not self._eof:
            try:
                await anyio.wait_readable(self._fd)
            except (OSError, ValueError):
                pass  # a regular file (epoll refuses it) is always readable
            try:
                chunk = os.read(self._fd, 65536)
            except OSError:
                chunk = b""  # closed, or the terminal hung up
            if not chunk:
                self._eof = True
            self._buffer += chunk
        if b"\n" in self._buffer:
            line, _, self._buffer = self._buffer.partition(b"\n")
        elif self._buffer:
            line, self._buffer = self._buffer, b""
        else:
            return None
        return line.decode(errors="replace").rstrip("\r")


FieldKind = Literal["string", "integer", "number", "boolean", "choice", "choices"]
Value = str | int | float | bool | list[str]


@dataclass(frozen=True)
class FormField:
    """One property of an elicitation's `requestedSchema`, as the prompt asks it."""

    name: str
    kind: FieldKind
    title: str | None = None
    description: str | None = None
    required: bool = False
    default: Value | None = None
    choices: tuple[tuple[str, str], ...] = ()  # (value, label)
    minimum: float | None = None
    maximum: float | None = None
    min_length: int | None = None
    max_length: int | None = None
    min_items: int | None = None
    max_items: int | None = None
    format: str | None = None

    @property
    def label(self) -> str:
        if self.title and self.title != self.name:
            return f"{self.title} ({self.name})"
        return self.name

    def hint(self) -> str:
        """What may be typed, and what Enter gives."""
        parts: list[str] = []
        if self.kind == "boolean":
            parts.append("Y/n" if self.default is True else "y/N" if self.default is False else "y/n")
        elif self.kind in ("integer", "number"):
            bounds = _bounds(self.minimum, self.maximum)
            parts.append(f"{self.kind}{' ' + bounds if bounds else ''}")
        elif self.kind == "choice":
            parts.append(f"1-{len(self.choices)}")
        elif self.kind == "choices":
            parts.append(f"numbers 1-{len(self.choices)}, comma-separated")
        elif self.format:
            parts.append(self.format)
        text = ", ".join(parts)
        if self.default is not None and self.kind != "boolean":
            shown = self._shown(self.default)
            text = f"{text}, Enter: {shown}" if text else f"Enter: {shown}"
        return text

    def _shown(self, value: Value) -> str:
        labels = dict(self.choices)
        if isinstance(value, list):
            return ", ".join(labels.get(str(item), str(item)) for item in value)
        if isinstance(value, bool):
            return "yes" if value else "no"
        return labels.get(str(value), str(value))

    def parse(self, text: str) -> Value:
        """The typed text as this field's value; `ValueError` with what to type instead."""
        text = text.strip()
        if self.kind == "boolean":
            lowered = text.lower()
            if lowered in ("y", "yes", "true", "1"):
                return True
            if lowered in ("n", "no", "false", "0"):
                return False
            raise ValueError("type y or n")
        if self.kind == "integer":
            try:
                number: int | float = int(text)
            except ValueError:
                raise ValueError("type a whole number") from None
            return self._in_bounds(number)
        if self.kind == "number":
            try:
                number = int(text)
            except ValueError:
                try:
                    number = float(text)
                except ValueError:
                    raise ValueError("type a number") from None
                if not math.isfinite(number):
                    raise ValueError("type a finite number") from None
            return self._in_bounds(number)
        if self.kind == "choice":
            return self._choice(text)
        if self.kind == "choices":
            picked: list[str] = []
            for part in (item for item in text.split(",") if item.strip()):
                value = self._choice(part.strip())
                if value not in picked:
                    picked.append(value)
            if self.min_items is not None and len(picked) < self.min_items:
                raise ValueError(f"pick at least {self.min_items}")
            if self.max_items is not None and len(picked) > self.max_items:
                raise ValueError(f"pick at most {self.max_items}")
            return picked
        if self.min_length is not None and len(text) < self.min_length:
            raise ValueError(f"at least {self.min_length} characters")
        if self.max_length is not None and len(text) > self.max_length:
            raise ValueError(f"at most {self.max_length} characters")
        _check_format(self.format, text)
        return text

    def _in_bounds(self, number: int | float) -> int | float:
        if (self.minimum is not None and number < self.minimum) or (self.maximum is not None and number > self.maximum):
            raise ValueError(f"type a number {_bounds(self.minimum, self.maximum)}")
        return number

    def _choice(self, text: str) -> str:
        if text.isdigit() and 1 <= int(text) <= len(self.choices):
            return self.choices[int(text) - 1][0]
        for value, label in self.choices:
            if text == value or text.lower() == label.lower():
                return value
        raise ValueError(f"type a number from 1 to {len(self.choices)}")


def _bounds(low: float | None, high: float | None) -> str:
    if low is not None and high is not None:
        return f"{low:g}..{high:g}"
    if low is not None:
        return f">= {low:g}"
    if high is not None:
        return f"<= {high:g}"
    return ""


def _check_format(fmt: str | None, text: str) -> None:
    if fmt == "email" and ("@" not in text or text.startswith("@") or text.endswith("@")):
        raise ValueError("type an email address")
    if fmt == "uri" and not urlparse(text).scheme:
        raise ValueError("type a URI with a scheme, e.g. https://...")
    if fmt == "date":
        try:
            date.fromisoformat(text)
        except ValueError:
            raise ValueError("type a date as YYYY-MM-DD") from None
    if fmt == "date-time":
        try:
            datetime.fromisoformat(text.replace("Z", "+00:00"))
        except ValueError:
            raise ValueError("type a date and time as YYYY-MM-DDTHH:MM:SS") from None


def _titled(options: Any) -> tuple[tuple[str, str], ...] | None:
    """`oneOf`/`anyOf` of `{"const": ..., "title": ...}`: titled choices."""
    if not isinstance(options, list) or not options:
        return None
    found: list[tuple[str, str]] = []
    for option in options:
        if not isinstance(option, dict) or "const" not in option:
            return None
        found.append((str(option["const"]), str(option.get("title") or option["const"])))
    return tuple(found)


def _enum(prop: Mapping[str, Any]) -> tuple[tuple[str, str], ...] | None:
    values = prop.get("enum")
    if isinstance(values, list) and values:
        names = prop.get("enumNames")
        labels = names if isinstance(names, list) and len(names) == len(values) else values
        return tuple((str(value), str(label)) for value, label in zip(values, labels, strict=True))
    return _titled(prop.get("oneOf")) or _titled(prop.get("anyOf"))


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def parse_form(schema: Mapping[str, Any]) -> list[FormField]:
    """The fields of a form elicitation's `requestedSchema`, in its order."""
    properties = schema.get("properties")
    if not isinstance(properties, dict):
        return []
    required = set(schema.get("required") or [])
    fields: list[FormField] = []
    for name, prop in properties.items():
        if not isinstance(prop, dict):
            continue
        kind: FieldKind
        choices = _enum(prop)
        declared = prop.get("type")
        if declared == "array":
            items = prop.get("items")
            choices = (_enum(items) if isinstance(items, dict) else None) or ()
            kind = "choices"
        elif choices:
            kind = "choice"
        elif declared in ("integer", "number", "boolean"):
            kind = declared
        else:
            kind = "string"
        default = prop.get("default")
        if not isinstance(default, str | int | float | bool | list):
            default = None
        fields.append(
            FormField(
                name=str(name),
                kind=kind,
                title=prop.get("title") if isinstance(prop.get("title"), str) else None,
                description=prop.get("description") if isinstance(prop.get("description"), str) else None,
                required=name in required,
                default=default,
                choices=choices or (),
                minimum=_number(prop.get("minimum")),
                maximum=_number(prop.get("maximum")),
                min_length=_int(prop.get("minLength")),
                max_length=_int(prop.get("maxLength")),
                min_items=_int(prop.get("minItems")),
                max_items=_int(prop.get("maxItems")),
                format=prop.get("format") if isinstance(prop.get("format"), str) else None,
            )
        )
    return fields


class _EndOfInput(Exception):
    """Nothing more can be typed (stdin closed): the question is dismissed."""


_ACTIONS = {"": "accept", "a": "accept", "accept": "accept", "d": "decline", "decline": "decline"}
_ACTIONS |= {"c": "cancel", "cancel": "cancel"}


@dataclass
class Prompter:
    """The `Client`'s elicitation / sampling / roots callbacks, asked on `console`, answered from `lines`.

    One question at a time (a job may ask several in one round); `pause` stops the
    status line while a question is on screen.
    """

    console: Console
    lines: LineSource
    pause: Callable[[], AbstractContextManager[Any]] = field(default=nullcontext)
    _lock: anyio.Lock = field(default_factory=anyio.Lock)

    async def elicit(self, context: ClientRequestContext, params: ElicitRequestParams) -> ElicitResult | ErrorData:
        async with self._lock:
            with self.pause():
                try:
                    return await self._elicit(params)
                except _EndOfInput:
                    self.console.print("[yellow]no more input: the question was dismissed (cancel)[/]")
                    return ElicitResult(action="cancel")

    async def sample(
        self, context: ClientRequestContext, params: CreateMessageRequestParams
    ) -> CreateMessageResult | ErrorData:
        async with self._lock:
            with self.pause():
                try:
                    return await self._sample(params)
                except _EndOfInput:
                    return ErrorData(code=DECLINED_SAMPLING, message="No one was there to answer the sampling request")

    async def roots(self, context: ClientRequestContext) -> ListRootsResult | ErrorData:
        cwd = Path.cwd()
        return ListRootsResult.model_validate({"roots": [{"uri": cwd.as_uri(), "name": cwd.name or str(cwd)}]})

    # -- the questions ------------------------------------------------------------------------

    async def _elicit(self, params: ElicitRequestParams) -> ElicitResult:
        self.console.print(Text.assemble(("? ", "bold yellow"), ("The task asks: ", "bold"), params.message))
        if not isinstance(params, ElicitRequestFormParams):
            self.console.print(Text.assemble("  open ", (params.url, "underline"), " and come back"))
            action = await self._action("  Done there? [a]ccept / [d]ecline / [c]ancel (a): ")
            return ElicitResult(action=action)
        fields = parse_form(params.requested_schema)
        action = await self._action("  Answer? [a]ccept / [d]ecline / [c]ancel (a): ")
        if action != "accept":
            return ElicitResult(action=action)
        if any(f.required for f in fields):
            self.console.print("  [dim]* required[/]")
        content: dict[str, Value | None] = {}
        for form_field in fields:
            value = await self._field(form_field)
            if value is not None:
                content[form_field.name] = value
        return ElicitResult(action="accept", content=content)

    async def _action(self, prompt: str) -> Literal["accept", "decline", "cancel"]:
        while True:
            typed = (await self._ask(prompt)).strip().lower()
            action = _ACTIONS.get(typed)
            if action == "accept":
                return "accept"
            if action == "decline":
                return "decline"
            if action == "cancel":
                return "cancel"
            self.console.print("  [red]type a, d or c[/]")

    async def _field(self, form_field: FormField) -> Value | None:
        if form_field.description:
            self.console.print(f"  [dim]{escape(form_field.description)}[/]")
        for number, (_, label) in enumerate(form_field.choices, 1):
            self.console.print(f"    {number}) {escape(label)}")
        hint = form_field.hint()
        prompt = f"  {form_field.label}{' *' if form_field.required else ''}{f' ({hint})' if hint else ''}: "
        while True:
            typed = await self._ask(prompt)
            if not typed.strip():
                if form_field.default is not None:
                    return form_field.default
                if not form_field.required:
                    return None
                self.console.print("  [red]required: type a value[/]")
                continue
            try:
                return form_field.parse(typed)
            except ValueError as exc:
                self.console.print(f"  [red]{escape(str(exc))}[/]")

    async def _sample(self, params: CreateMessageRequestParams) -> CreateMessageResult | ErrorData:
        self.console.print(
            Text.assemble(("? ", "bold yellow"), ("The task asks a model; you answer as the model", "bold"))
        )
        if params.system_prompt:
            self.console.print(Text.assemble(("  system: ", "dim"), params.system_prompt))
        for message in params.messages:
            contents = message.content if isinstance(message.content, list) else [message.content]
            for content in contents:
                shown = content.text if isinstance(content, TextContent) else f"[{content.type}]"
                self.console.print(Text.assemble((f"  {message.role}: ", "dim"), shown))
        self.console.print(f"  [dim](up to {params.max_tokens} tokens)[/]")
        typed = await self._ask("  Your answer (Enter on an empty line declines): ")
        if not typed.strip():
            return ErrorData(code=DECLINED_SAMPLING, message="The user declined the sampling request")
        return CreateMessageResult(
            role="assistant", content=TextContent(type="text", text=typed), model="human", stop_reason="endTurn"
        )

    async def _ask(self, prompt: str) -> str:
        self.console.print(prompt, end="", markup=False, highlight=False)
        self.console.file.flush()
        try:
            line = await self.lines.readline()
        except anyio.get_cancelled_exc_class():
            self.console.print()  # Ctrl-C or --timeout mid-answer: what follows starts on its own line
            raise
        if line is None:
            self.console.print()
            raise _EndOfInput
        return line


# -- what the person sees -------------------------------------------------------------------


def _since(created_at: str) -> float:
    """Seconds since `created_at` (an ISO timestamp), 0 when it cannot be read."""
    try:
        created = datetime.fromisoformat(created_at.replace("Z", "+00:00"))
    except ValueError:
        return 0.0
    if created.tzinfo is None:
        created = created.replace(tzinfo=UTC)
    return max(0.0, (datetime.now(UTC) - created).total_seconds())


def _duration(seconds: float) -> str:
    whole = int(seconds)
    hours, rest = divmod(whole, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


def result_text(result: CallToolResult) -> str:
    """Text content as text (what a person wants to read); a result without text as JSON."""
    texts = [item.text for item in result.content if isinstance(item, TextContent)]
    if texts:
        return "\n".join(texts)
    return json.dumps(_result_json(result), indent=2)


def _result_json(result: CallToolResult) -> dict[str, Any]:
    shown = result.model_dump(by_alias=True, mode="json", exclude_none=True)
    shown.pop("resultType", None)
    return shown


def _line(state: TaskState) -> str:
    return f"status={state.status}{f'  ({state.status_message})' if state.status_message else ''}"


class View(Protocol):
    def created(self, state: TaskState, *, attached: bool, task_id: str) -> None: ...
    def update(self, state: TaskState) -> None: ...
    def pause(self) -> AbstractContextManager[None]: ...
    def note(self, message: str) -> None: ...
    def result(self, result: CallToolResult) -> None: ...
    def failed(self, error: ErrorData) -> None: ...
    def stopped(self) -> None: ...
    def close(self) -> None: ...


class PlainView:
    """One line per change of (status, statusMessage), then the result: for pipes, files and CI."""

    def __init__(self, out: IO[str], err: IO[str]) -> None:
        self._out = out
        self._err = err
        self._last: tuple[str, str | None] | None = None

    def _print(self, text: str) -> None:
        self._out.write(text + "\n")
        self._out.flush()

    def created(self, state: TaskState, *, attached: bool, task_id: str) -> None:
        self._print(f"{'following' if attached else 'created'} task: status={state.status}")

    def update(self, state: TaskState) -> None:
        seen = (state.status, state.status_message)
        if seen != self._last:
            self._last = seen
            self._print(_line(state))

    @contextmanager
    def pause(self) -> Iterator[None]:
        yield

    def note(self, message: str) -> None:
        self._err.write(message + "\n")
        self._err.flush()

    def result(self, result: CallToolResult) -> None:
        self._print(result_text(result))

    def failed(self, error: ErrorData) -> None:
        self._print(f"error {error.code}: {error.message}")

    def stopped(self) -> None:
        pass  # cancelled: its status line says so

    def close(self) -> None:
        pass


class JsonView(PlainView):
    """`--json`: nothing but the final result, as JSON, on stdout."""

    def created(self, state: TaskState, *, attached: bool, task_id: str) -> None:
        pass

    def update(self, state: TaskState) -> None:
        pass

    def result(self, result: CallToolResult) -> None:
        self._print(json.dumps(_result_json(result), indent=2))

    def failed(self, error: ErrorData) -> None:
        self.note(f"{PROG}: error {error.code}: {error.message}")

    def stopped(self) -> None:
        self.note(f"{PROG}: the task was cancelled")


_STYLES = {
    "working": "cyan",
    "input_required": "bold yellow",
    "completed": "bold green",
    "failed": "bold red",
    "cancelled": "bold magenta",
}


_MARKS = {"input_required": "?", "completed": "✔", "failed": "✘", "cancelled": "■"}


class _StatusLine:
    """The live line: spinner, status, statusMessage, a bar when the job reports numbers, elapsed time."""

    def __init__(self) -> None:
        self.state: TaskState | None = None
        self.spinner = Spinner("dots", style="cyan")
        self._origin = time.monotonic()

    def set(self, state: TaskState) -> None:
        if self.state is None:
            self._origin = time.monotonic() - _since(state.created_at)
        self.state = state

    def elapsed(self) -> str:
        return _duration(time.monotonic() - self._origin)

    def __rich__(self) -> RenderableType:
        state = self.state
        if state is None:
            return Text("")
        grid = Table.grid(padding=(0, 1))
        cells: list[RenderableType] = [
            self.spinner
            if state.status == "working"
            else Text(_MARKS.get(state.status, "·"), style=_STYLES.get(state.status, "")),
            Text(state.status, style=_STYLES.get(state.status, "")),
        ]
        if state.status_message:
            cells.append(Text(state.status_message, overflow="ellipsis", no_wrap=True))
        progress = state.progress()
        if progress is not None:
            current, total = progress
            if total:
                cells.append(ProgressBar(total=total, completed=min(current, total), width=24))
                cells.append(Text(f"{current:g}/{total:g}", style="dim"))
            else:
                cells.append(Text(f"{current:g}", style="dim"))
        cells.append(Text(self.elapsed(), style="dim"))
        grid.add_row(*cells)
        return grid


class LiveView:
    """A terminal: one live status line (rich), paused while a question is asked."""

    def __init__(self, console: Console, err: Console) -> None:
        self._console = console
        self._err = err
        self._line = _StatusLine()
        self._live = Live(self._line, console=console, refresh_per_second=8, transient=True)
        self._started = False

    def created(self, state: TaskState, *, attached: bool, task_id: str) -> None:
        verb = "following" if attached else "started"
        self._console.print(Text.assemble((f"{verb} task ", "dim"), (task_id, "bold")), highlight=False)
        self._line.set(state)
        self._live.start(refresh=True)
        self._started = True

    def update(self, state: TaskState) -> None:
        self._line.set(state)
        if self._started:
            self._live.refresh()

    @contextmanager
    def pause(self) -> Iterator[None]:
        running = self._live.is_started
        if running:
            self._live.stop()
        try:
            yield
        finally:
            if running and self._started:
                self._live.start(refresh=True)

    def note(self, message: str) -> None:
        self._err.print(Text(message, style="yellow"), highlight=False, soft_wrap=True)

    def _final(self, extra: str = "") -> None:
        self.close()
        state = self._line.state
        if state is None:
            return
        mark = _MARKS.get(state.status, "·")
        parts: list[tuple[str, str] | str] = [(f"{mark} {state.status}", _STYLES.get(state.status, ""))]
        if state.status_message:
            parts.append(f"  {state.status_message}")
        parts.append((f"  {self._line.elapsed()}", "dim"))
        self._console.print(Text.assemble(*parts), highlight=False)
        if extra:
            self._console.print(Text(extra, style="red"), highlight=False)

    def result(self, result: CallToolResult) -> None:
        if self._line.state is not None:
            self._final()
        self._console.print(result_text(result), markup=False, highlight=False, soft_wrap=True)

    def failed(self, error: ErrorData) -> None:
        self._final(f"error {error.code}: {error.message}")

    def stopped(self) -> None:
        self._final()

    def close(self) -> None:
        self._started = False
        self._live.stop()


# -- the run --------------------------------------------------------------------------------


class _Interrupts:
    """Ctrl-C (and dev's abort): the first one ends the current step, another one everything."""

    def __init__(self, outer: anyio.CancelScope) -> None:
        self.outer = outer
        self.step: anyio.CancelScope | None = None
        self.count = 0
        self.forced: int | None = None
        self.message: str | None = None

    def interrupt(self) -> None:
        self.count += 1
        if self.count == 1 and self.step is not None:
            self.step.cancel()
        elif self.count == 1:
            self.leave(EXIT_CANCELLED, "interrupted")
        else:
            self.leave(EXIT_CANCELLED, "interrupted again: leaving now (the task may still be running)")

    def leave(self, code: int, message: str | None = None) -> None:
        if self.forced is None:
            self.forced = code
            self.message = message
        self.outer.cancel()

    @contextmanager
    def stage(self) -> Iterator[anyio.CancelScope]:
        """A step that one Ctrl-C ends (the caller then decides what comes next)."""
        with anyio.CancelScope() as scope:
            self.step = scope
            try:
                yield scope
            finally:
                self.step = None


async def _watch_signals(interrupts: _Interrupts, *, task_status: anyio.abc.TaskStatus[None]) -> None:
    with anyio.open_signal_receiver(signal.SIGINT) as received:
        task_status.started()
        async for _ in received:
            interrupts.interrupt()


async def _watch_abort(abort: Callable[[], bool], interrupts: _Interrupts) -> None:
    while not abort():  # noqa: ASYNC110 - a plain callable from dev's thread, not an event
        await anyio.sleep(0.1)
    interrupts.leave(EXIT_FAILED)


@dataclass
class CallIo:
    """Where a run shows things and reads answers (tests pass their own)."""

    view: View
    prompter: Prompter
    out: IO[str]
    err: IO[str]


def _make_io(options: CallOptions, stdin_fd: int | None) -> CallIo:
    console = Console(file=sys.stdout)
    err_console = Console(stderr=True)
    view: View
    if options.json_output:
        view = JsonView(sys.stdout, sys.stderr)
    elif console.is_terminal and not console.is_dumb_terminal:
        view = LiveView(console, err_console)
    else:
        view = PlainView(sys.stdout, sys.stderr)
    asking = console if isinstance(view, LiveView) else err_console  # never mix questions into piped output
    lines: LineSource = FdLines(stdin_fd) if stdin_fd is not None else _NoLines()
    return CallIo(view=view, prompter=Prompter(asking, lines, pause=view.pause), out=sys.stdout, err=sys.stderr)


class _NoLines:
    async def readline(self) -> str | None:
        return None


def run_call(
    options: CallOptions,
    *,
    abort: Callable[[], bool] | None = None,
    io: CallIo | None = None,
) -> int:
    """Call (or resume) and follow one task; print as `options` say; return the exit status."""
    if io is None:
        try:
            stdin_fd: int | None = sys.stdin.fileno() if sys.stdin is not None else None
        except (OSError, ValueError):
            stdin_fd = None
        io = _make_io(options, stdin_fd)
    try:
        return anyio.run(_run, options, io, abort)
    except CallError as exc:
        io.view.close()
        io.err.write(f"{PROG}: {exc}\n")
        io.err.flush()
        return exc.code
    except KeyboardInterrupt:  # before the signal receiver was listening
        io.view.close()
        return EXIT_CANCELLED


async def _run(options: CallOptions, io: CallIo, abort: Callable[[], bool] | None) -> int:
    if (options.tool is None) == (options.resume is None):
        raise CallError("give a TOOL to call, or --resume TASK_ID to follow a task (not both)", EXIT_USAGE)
    if options.resume is not None and (options.arguments is not None or options.no_wait):
        raise CallError("--resume follows an existing task: it takes no ARGS and no --no-wait", EXIT_USAGE)
    if options.timeout is not None and options.timeout <= 0:
        raise CallError("--timeout must be a positive number of seconds", EXIT_USAGE)
    arguments = parse_arguments(options.arguments)
    outer = anyio.CancelScope()
    interrupts = _Interrupts(outer)
    code = EXIT_FAILED
    with outer:
        async with anyio.create_task_group() as group:
            if threading.current_thread() is threading.main_thread():
                await group.start(_watch_signals, interrupts)
            if abort is not None:
                group.start_soon(_watch_abort, abort, interrupts)
            try:
                code = await _session(options, arguments, io, interrupts)
            except CallError as exc:
                io.view.close()
                io.view.note(f"{PROG}: {exc}")
                code = exc.code
            finally:
                group.cancel_scope.cancel()
    if interrupts.forced is not None and outer.cancelled_caught:
        io.view.close()
        if interrupts.message:
            io.view.note(interrupts.message)
        return interrupts.forced
    return code


@asynccontextmanager
async def _connect(options: CallOptions, tasks: TasksClient, prompter: Prompter) -> AsyncIterator[Client]:
    """The SDK's `Client` over Streamable HTTP, with the bearer token (if any) on every request."""
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    token = options.token if options.token is not None else os.environ.get("MCP_TASKS_TOKEN")
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    refused: list[int] = []

    async def note_refusal(response: httpx2.Response) -> None:
        if response.status_code in (401, 403):
            refused.append(response.status_code)

    http = httpx2.AsyncClient(
        headers=headers,
        timeout=httpx2.Timeout(30, read=300),  # the SDK's own defaults: a response stream may stay open
        event_hooks={"response": [note_refusal]},
    )
    try:
        async with http:
            client = Client(
                streamable_http_client(options.url, http_client=http),
                extensions=[tasks],
                elicitation_callback=prompter.elicit,
                sampling_callback=prompter.sample,
                list_roots_callback=prompter.roots,
            )
            async with client:
                yield client
    except Exception as exc:  # noqa: BLE001 - an ExceptionGroup from the SDK's task groups, or one error: one line
        raise _one_line(exc, options, refused, bool(token)) from None


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in _leaves(inner)]
    return [exc]


def _one_line(exc: BaseException, options: CallOptions, refused: Sequence[int], has_token: bool) -> BaseException:
    """Whatever escaped the connection, as the one line a person needs (or itself, when it is not ours)."""
    import httpx2

    leaves = _leaves(exc)
    for leaf in leaves:
        if isinstance(leaf, CallError):
            return leaf
    if refused:
        if has_token:
            return CallError(f"the server refused the token (HTTP {refused[-1]})")
        return CallError(f"the server requires a token (HTTP {refused[-1]}): pass --token or set MCP_TASKS_TOKEN")
    for leaf in leaves:
        if isinstance(leaf, httpx2.TransportError | OSError):
            return CallError(f"cannot reach {options.url}: {type(leaf).__name__}")
        if isinstance(leaf, httpx2.HTTPError):
            return CallError(f"HTTP error talking to {options.url}: {type(leaf).__name__}")
        if isinstance(leaf, MCPError):
            return CallError(f"{options.url}: {leaf.message}")
    if isinstance(exc, BaseExceptionGroup) and len(leaves) == 1:
        return leaves[0]
    return exc


async def _session(options: CallOptions, arguments: dict[str, Any], io: CallIo, interrupts: _Interrupts) -> int:
    tasks = TasksClient()
    async with _connect(options, tasks, io.prompter) as client:
        with interrupts.stage() as starting:
            handle = await _open(options, arguments, tasks, client)
        if starting.cancelled_caught:
            io.view.note("interrupted")
            return EXIT_CANCELLED
        assert handle is not None
        try:
            return await _follow(options, io, interrupts, handle)
        finally:
            handle.close()


async def _open(
    options: CallOptions, arguments: dict[str, Any], tasks: TasksClient, client: Client
) -> TaskHandle | None:
    try:
        if options.resume is not None:
            return await tasks.attach(client, options.resume)
        assert options.tool is not None
        return await tasks.start(client, options.tool, arguments)
    except TaskNotFound:
        raise CallError("no such task: it expired, or it belongs to another user") from None
    except MCPError as exc:
        raise CallError(exc.message) from None


async def _follow(options: CallOptions, io: CallIo, interrupts: _Interrupts, handle: TaskHandle) -> int:
    view = io.view
    if handle.id is None:  # the tool answered at once: there is no task
        answer = await handle.result()
        if options.no_wait:
            view.note(f"{PROG}: the tool answered at once; there is no task to follow")
        view.result(answer)
        return exit_code("completed", is_error=bool(answer.is_error))
    task_id = handle.id
    if options.no_wait:
        io.out.write(task_id + "\n")
        io.out.flush()
        return EXIT_OK
    assert handle.state is not None
    view.created(handle.state, attached=options.resume is not None, task_id=task_id)

    view.update(handle.state)  # the state the call created: always its own line

    async def watch() -> None:
        try:
            async for state in handle.updates():
                view.update(state)
        except MCPError:
            pass  # the task is gone or the connection lost: result() says so

    result: CallToolResult | None = None
    timed_out = False
    problem: MCPError | None = None
    with interrupts.stage() as following:
        async with anyio.create_task_group() as group:
            group.start_soon(watch)
            try:
                with anyio.fail_after(options.timeout):
                    result = await handle.result()
            except TaskCancelled:
                pass
            except TimeoutError:
                timed_out = True
            except MCPError as exc:  # failed (the task's error), gone, or the connection lost
                problem = exc
            group.cancel_scope.cancel()
    if following.cancelled_caught:
        return await _cancel(io, interrupts, handle)
    state = handle.state
    assert state is not None
    view.update(state)
    if timed_out:
        view.close()
        view.note(
            f"{PROG}: still {state.status} after {options.timeout:g}s; the task keeps running. "
            f"Follow it with: celery-mcp-tasks call {options.url} --resume={task_id}"
        )
        return EXIT_TIMEOUT
    if result is not None:
        view.result(result)
        return exit_code("completed", is_error=bool(result.is_error))
    if state.status == "failed":
        view.failed(state.error_data())
        return EXIT_FAILED
    if state.status == "cancelled":
        view.stopped()
        if problem is not None:  # e.g. a question this client could not answer
            view.note(f"{PROG}: {problem.message}")
        return EXIT_CANCELLED
    view.close()
    message = problem.message if problem is not None else "the task ended without an outcome"
    view.note(f"{PROG}: {message}")
    if not isinstance(problem, TaskNotFound):
        view.note(f"{PROG}: the task may still be running: celery-mcp-tasks call {options.url} --resume={task_id}")
    return EXIT_FAILED


async def _cancel(io: CallIo, interrupts: _Interrupts, handle: TaskHandle) -> int:
    """The first Ctrl-C: `tasks/cancel`, then report how the task ended."""
    view = io.view
    view.note("interrupted: cancelling the task (Ctrl-C again to leave at once)")
    try:
        with anyio.fail_after(10):
            await handle.cancel()
            if not handle.finished:
                await handle.wait(answer_input=False)
    except TaskNotFound:
        view.close()
        view.note(f"{PROG}: the task is gone (expired)")
        return EXIT_FAILED
    except (MCPError, TimeoutError) as exc:
        view.close()
        reason = exc.message if isinstance(exc, MCPError) else "no answer within 10s"
        view.note(f"{PROG}: could not cancel the task: {reason}")
        return EXIT_FAILED
    state = handle.state
    assert state is not None
    view.update(state)
    if state.status == "completed":  # it finished before the cancel arrived
        result = state.call_tool_result()
        view.result(result)
        return exit_code("completed", is_error=bool(result.is_error))
    if state.status == "failed":
        view.failed(state.error_data())
        return EXIT_FAILED
    if state.status == "cancelled":
        view.stopped()
        return EXIT_CANCELLED
    view.close()
    view.note(f"{PROG}: the cancel was sent; the task is still {state.status}")
    return EXIT_CANCELLED
