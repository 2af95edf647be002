"""Questions on the terminal: the `Client`'s elicitation (a form asked field by field), sampling (the person
answers as the model) and roots (the current directory) callbacks, and the lines typed to answer them."""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from datetime import date, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol
from urllib.parse import urlparse

import anyio
from mcp_types import (
    CreateMessageRequestParams,
    CreateMessageResult,
    ElicitRequestFormParams,
    ElicitRequestParams,
    ElicitResult,
    ErrorData,
    ListRootsResult,
    TextContent,
)
from rich.console import Console
from rich.markup import escape
from rich.text import Text

from celery_mcp_tasks.cli.shared import printable

if TYPE_CHECKING:
    from mcp.client.session import ClientRequestContext

DECLINED_SAMPLING = -1  # the spec's code for "the user rejected the sampling request"


class LineSource(Protocol):
    echoed: bool
    """Whether a line read shows on the screen with its newline (typed at a terminal); a piped one does not."""

    async def readline(self) -> str | None:
        """The next line typed (without its newline), None at the end of input."""
        ...


class FdLines:
    """Lines from a file descriptor (stdin), read without a thread: Ctrl-C can always interrupt the wait."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self.echoed = os.isatty(fd)
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


class _EndOfInput(Exception):
    """Nothing more can be typed (stdin closed): the question is dismissed."""


Action = Literal["accept", "decline", "cancel"]
_ACTIONS: dict[str, Action] = {"": "accept", "a": "accept", "accept": "accept", "d": "decline", "decline": "decline"}
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

    async def _elicit(self, params: ElicitRequestParams) -> ElicitResult:
        self.console.print(
            Text.assemble(("? ", "bold yellow"), ("The task asks: ", "bold"), printable(params.message, lines=True))
        )
        if not isinstance(params, ElicitRequestFormParams):  # URL mode: accepting is consenting to go there
            self.console.print(Text.assemble("  it asks you to open ", (printable(params.url), "underline")))
            action = await self._action("  Open it? [a]ccept / [d]ecline / [c]ancel (a): ")
            if action == "accept":
                self.console.print("  [dim]open it in your browser: what you do there goes to that site, not here[/]")
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

    async def _action(self, prompt: str) -> Action:
        while (action := _ACTIONS.get((await self._ask(prompt)).strip().lower())) is None:
            self.console.print("  [red]type a, d or c[/]")
        return action

    async def _field(self, form_field: FormField) -> Value | None:
        if form_field.description:
            self.console.print(f"  [dim]{escape(printable(form_field.description, lines=True))}[/]")
        for number, (_, label) in enumerate(form_field.choices, 1):
            self.console.print(f"    {number}) {escape(printable(label))}")
        hint = form_field.hint()
        prompt = f"  {printable(form_field.label)}{' *' if form_field.required else ''}{f' ({hint})' if hint else ''}: "
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
            self.console.print(Text.assemble(("  system: ", "dim"), printable(params.system_prompt, lines=True)))
        for message in params.messages:
            contents = message.content if isinstance(message.content, list) else [message.content]
            for content in contents:
                shown = content.text if isinstance(content, TextContent) else f"[{content.type}]"
                self.console.print(Text.assemble((f"  {message.role}: ", "dim"), printable(shown, lines=True)))
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
        if line is None or not self.lines.echoed:
            self.console.print()  # what follows the prompt starts on its own line, as after a typed answer
        if line is None:
            raise _EndOfInput
        return line


# -- elicitation forms: a `requestedSchema` as fields to ask, the typed answers read and checked --

FieldKind = Literal["string", "integer", "number", "boolean", "choice", "choices"]
Choice = str | int | float | bool
"""An `enum`/`const` value as the schema gives it: the answer carries it unchanged (an integer stays one)."""
Value = Choice | list[str]  # a multi-select answers strings (its items are `{"type": "string", "enum": ...}`)


@dataclass(frozen=True)
class FormField:
    """One property of an elicitation's `requestedSchema`, as the prompt asks it."""

    name: str
    kind: FieldKind
    title: str | None = None
    description: str | None = None
    required: bool = False
    default: Value | None = None
    choices: tuple[tuple[Choice, str], ...] = ()  # (value, label)
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
        labels = {str(value): label for value, label in self.choices}
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
        if self.kind in ("integer", "number"):
            try:
                number: int | float = int(text)
            except ValueError:
                if self.kind == "integer":
                    raise ValueError("type a whole number") from None
                try:
                    number = float(text)
                except ValueError:
                    raise ValueError("type a number") from None
                if not math.isfinite(number):
                    raise ValueError("type a finite number") from None
            if (self.minimum is not None and number < self.minimum) or (
                self.maximum is not None and number > self.maximum
            ):
                raise ValueError(f"type a number {_bounds(self.minimum, self.maximum)}")
            return number
        if self.kind == "choice":
            return self._choice(text)
        if self.kind == "choices":
            picked: list[str] = []
            for part in (item for item in text.split(",") if item.strip()):
                value = str(self._choice(part.strip()))
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

    def _choice(self, text: str) -> Choice:
        if text.isdigit() and 1 <= int(text) <= len(self.choices):
            return self.choices[int(text) - 1][0]
        for value, label in self.choices:
            if text == str(value) or text.lower() == label.lower():
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


def _titled(options: Any) -> tuple[tuple[Choice, str], ...] | None:
    """`oneOf`/`anyOf` of `{"const": ..., "title": ...}`: titled choices."""
    if not isinstance(options, list) or not options:
        return None
    found: list[tuple[Choice, str]] = []
    for option in options:
        if not isinstance(option, dict) or not isinstance(option.get("const"), Choice):
            return None
        found.append((option["const"], str(option.get("title") or option["const"])))
    return tuple(found)


def _enum(prop: Mapping[str, Any]) -> tuple[tuple[Choice, str], ...] | None:
    values = prop.get("enum")
    if isinstance(values, list) and values and all(isinstance(value, Choice) for value in values):
        names = prop.get("enumNames")
        labels = names if isinstance(names, list) and len(names) == len(values) else values
        return tuple((value, str(label)) for value, label in zip(values, labels, strict=True))
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
