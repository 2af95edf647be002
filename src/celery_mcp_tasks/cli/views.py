"""How a task is shown: a live status line on a terminal, plain lines otherwise, or only the result as JSON."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO, Any

from mcp_types import CallToolResult, ErrorData, TextContent
from rich.console import Console, RenderableType
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.spinner import Spinner
from rich.table import Table
from rich.text import Text

from celery_mcp_tasks.cli.shared import printable
from celery_mcp_tasks.client.following import moment
from celery_mcp_tasks.client.models import TaskState

PROG = "celery-mcp-tasks call"


def _since(created_at: str) -> float:
    """Seconds since `created_at` (an ISO timestamp), 0 when it cannot be read."""
    _, at = moment(created_at)
    return max(0.0, time.time() - at) if isinstance(at, float) else 0.0


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

    def answering(self, state: TaskState) -> None:
        """A tool answering without a task reported progress, shown as a task's state (`call._Answering`)."""
        self.update(state)

    def update(self, state: TaskState) -> None:
        seen = (state.status, state.status_message)
        if seen != self._last:
            self._last = seen
            said = f"  ({printable(state.status_message)})" if state.status_message else ""
            self._print(f"status={state.status}{said}")

    @contextmanager
    def pause(self) -> Iterator[None]:
        yield

    def note(self, message: str) -> None:
        self._err.write(message + "\n")
        self._err.flush()

    def result(self, result: CallToolResult) -> None:
        self._print(result_text(result))

    def failed(self, error: ErrorData) -> None:
        self._print(f"error {error.code}: {printable(error.message)}")

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
        self.note(f"{PROG}: error {error.code}: {printable(error.message)}")

    def stopped(self) -> None:
        self.note(f"{PROG}: the task was cancelled")


_STYLES = dict(
    working="cyan", input_required="bold yellow", completed="bold green", failed="bold red", cancelled="bold magenta"
)
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
            cells.append(Text(printable(state.status_message), overflow="ellipsis", no_wrap=True))
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

    def answering(self, state: TaskState) -> None:
        self._line.set(state)
        if not self._started:  # no task to announce: the live line alone
            self._live.start(refresh=True)
            self._started = True
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
        with self.pause():  # on a line of its own, not at the end of the live line (stderr is another console)
            self._err.print(Text(message, style="yellow"), highlight=False, soft_wrap=True)

    def _final(self, extra: str = "") -> None:
        self.close()
        state = self._line.state
        if state is None:
            return
        mark = _MARKS.get(state.status, "·")
        parts: list[tuple[str, str] | str] = [(f"{mark} {state.status}", _STYLES.get(state.status, ""))]
        if state.status_message and not extra.endswith(f": {printable(state.status_message)}"):  # said once
            parts.append(f"  {printable(state.status_message)}")
        parts.append((f"  {self._line.elapsed()}", "dim"))
        self._console.print(Text.assemble(*parts), highlight=False)
        if extra:
            self._console.print(Text(extra, style="red"), highlight=False)

    def result(self, result: CallToolResult) -> None:
        if self._line.state is not None:
            self._final()
        # A job's text, as every other line of its shown here: no escape sequence reaches the terminal
        text = printable(result_text(result).expandtabs(), lines=True)
        self._console.print(text, markup=False, highlight=False, soft_wrap=True)

    def failed(self, error: ErrorData) -> None:
        self._final(f"error {error.code}: {printable(error.message)}")

    def stopped(self) -> None:
        self._final()

    def close(self) -> None:
        self._started = False
        self._live.stop()


View = PlainView | LiveView  # JsonView is a PlainView
