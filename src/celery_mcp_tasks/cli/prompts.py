"""Questions on the terminal: lines typed at the prompt, and the `Client`'s elicitation / sampling / roots callbacks.

A form elicitation is asked field by field (`forms.parse_form`); for sampling the
person answers as the model; roots is the current directory.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

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

from celery_mcp_tasks.cli.forms import FormField, Value, parse_form

if TYPE_CHECKING:
    from mcp.client.session import ClientRequestContext

__all__ = ["DECLINED_SAMPLING", "FdLines", "LineSource", "Prompter"]


DECLINED_SAMPLING = -1  # the spec's code for "the user rejected the sampling request"


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
