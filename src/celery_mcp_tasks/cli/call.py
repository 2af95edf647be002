"""`celery-mcp-tasks call` on a terminal: the tasks client, a status line, and answers typed at the prompt.

    run_call(CallOptions(url="http://127.0.0.1:8000/mcp", tool="write_report", arguments='{"topic": "tides"}'))

Everything that talks to the server is the SDK's `Client` with `TasksClient`
(`start`, `attach`, `TaskHandle.updates/result/cancel`, opened in `connection`);
this module runs the command, and what it shows and asks lives in `views`, `prompts`, `forms`:

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
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import IO, Any

import anyio
import anyio.abc
from mcp.shared.exceptions import MCPError
from mcp_types import CallToolResult
from rich.console import Console

from celery_mcp_tasks.cli.connection import CallOptions, connect, open_task
from celery_mcp_tasks.cli.outcome import (
    EXIT_CANCELLED,
    EXIT_FAILED,
    EXIT_OK,
    EXIT_TIMEOUT,
    EXIT_USAGE,
    PROG,
    CallError,
    exit_code,
)
from celery_mcp_tasks.cli.prompts import FdLines, LineSource, Prompter
from celery_mcp_tasks.cli.views import JsonView, LiveView, PlainView, View
from celery_mcp_tasks.client import TaskCancelled, TaskHandle, TaskNotFound, TasksClient

__all__ = [
    "EXIT_CANCELLED",
    "EXIT_FAILED",
    "EXIT_OK",
    "EXIT_TIMEOUT",
    "EXIT_USAGE",
    "PROG",
    "CallError",
    "CallIo",
    "CallOptions",
    "exit_code",
    "parse_arguments",
    "read_arguments",
    "run_call",
]


def read_arguments(text: str | None, stdin: IO[str] | None) -> str | None:
    """ARGS as given -> the JSON text: `@PATH` reads a file, `-` reads stdin to its end, else ARGS itself.

    For arguments the shell will not take on a command line (a long document, a large list).
    """
    if text == "-":
        if stdin is None:
            raise CallError("ARGS is -, but there is no stdin to read the arguments from", EXIT_USAGE)
        return stdin.read()
    if text is not None and text.startswith("@"):
        path = text[1:]
        try:
            with open(path, encoding="utf-8") as source:
                return source.read()
        except (OSError, UnicodeDecodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
            raise CallError(f"cannot read ARGS from {path!r}: {reason}", EXIT_USAGE) from None
    return text


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
    args_on_stdin = options.arguments == "-"  # then stdin is the arguments, not the answers to questions
    if io is None:
        try:
            stdin_fd: int | None = sys.stdin.fileno() if sys.stdin is not None and not args_on_stdin else None
        except (OSError, ValueError):
            stdin_fd = None
        io = _make_io(options, stdin_fd)
    try:
        options = replace(options, arguments=read_arguments(options.arguments, sys.stdin))
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


async def _session(options: CallOptions, arguments: dict[str, Any], io: CallIo, interrupts: _Interrupts) -> int:
    tasks = TasksClient()
    async with connect(options, tasks, io.prompter) as client:
        try:
            with interrupts.stage() as starting:
                handle = await open_task(options, arguments, tasks, client)
            if starting.cancelled_caught:
                io.view.note("interrupted")
                return EXIT_CANCELLED
            assert handle is not None
            try:
                return await _follow(options, io, interrupts, handle)
            finally:
                handle.close()
        finally:
            # Following ends before the connection closes, also when leaving at once (shielded):
            # a notification on a listen stream still open would meet a closed session.
            with anyio.CancelScope(shield=True):
                await tasks.stop_following(client)


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


def call(
    url: str,
    tool: str | None,
    arguments: str | None = None,
    *,
    abort: Callable[[], bool] | None = None,
    resume: str | None = None,
    token: str | None = None,
    json_output: bool = False,
    no_wait: bool = False,
    timeout: float | None = None,
) -> int:
    """Call `tool` as a task (or follow `resume`) and show it until it ends: the tasks client's terminal front.

    Exit status: 0 completed, 1 failed / isError / unreachable, 2 usage, 124 --timeout, 130 cancelled.
    `abort` (dev --call): polled; once true the call returns 1 at once.
    """
    options = CallOptions(
        url=url,
        tool=tool,
        arguments=arguments,
        resume=resume,
        token=token,
        json_output=json_output,
        no_wait=no_wait,
        timeout=timeout,
    )
    return run_call(options, abort=abort)
