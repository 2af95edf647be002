"""`celery-mcp-tasks call`: the tasks client on a terminal, a task followed to the end.

The task id is shown to the person (their handle for `--resume`), never written to a log line.
"""

from __future__ import annotations

import argparse
import errno
import json
import logging
import math
import os
import signal
import ssl
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, fields, replace
from typing import IO, TYPE_CHECKING, Any
from urllib.parse import urlsplit

import anyio
import anyio.abc
from mcp.shared.exceptions import MCPError
from mcp_types import CallToolResult
from rich.console import Console

from celery_mcp_tasks.cli.prompts import FdLines, LineSource, Prompter
from celery_mcp_tasks.cli.shared import printable
from celery_mcp_tasks.cli.views import PROG, JsonView, LiveView, PlainView, View, result_text
from celery_mcp_tasks.client import TaskCancelled, TaskHandle, TaskNotFound, TasksClient, TaskState
from celery_mcp_tasks.model import now_ms
from celery_mcp_tasks.protocol import PROGRESS_META_KEY, format_timestamp

if TYPE_CHECKING:
    from mcp import Client

EXIT_OK = 0
EXIT_FAILED = 1  # failed, a result with isError, the server unreachable or refusing
EXIT_USAGE = 2  # ARGS not JSON / not an object, TOOL and --resume both or neither
EXIT_TIMEOUT = 124  # --timeout expired, like timeout(1): the task keeps running (resume it), or a call gave up
EXIT_CANCELLED = 130  # the task ended cancelled (Ctrl-C, a declined question, another client)
_TOOLS_SHOWN = 12  # an unknown tool's refusal names this many of the server's tools
_TOOLS_LOOKUP_S, _TOOLS_PAGES = 5.0, 20  # how long, and how many pages, looking them up may take


class CallError(Exception):
    """One line for stderr, and the exit status that goes with it."""

    def __init__(self, message: str, code: int = EXIT_FAILED) -> None:
        super().__init__(message)
        self.code = code


def exit_code(status: str | None, *, is_error: bool = False) -> int:
    """The exit status for a task's final status (None: it never ended here)."""
    if status == "completed":
        return EXIT_FAILED if is_error else EXIT_OK
    if status == "cancelled":
        return EXIT_CANCELLED
    return EXIT_FAILED


@dataclass(frozen=True)
class CallOptions:
    """What `celery-mcp-tasks call` was given: where to connect, what to start or attach to, how to show it."""

    url: str
    tool: str | None = None
    arguments: str | None = None  # the JSON text as typed
    resume: str | None = None  # a task id to attach to instead of calling a tool
    token: str | None = None  # bearer token (None: $MCP_TASKS_TOKEN)
    json_output: bool = False
    no_wait: bool = False
    timeout: float | None = None  # seconds to wait for the end; None: as long as it runs


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in _leaves(inner)]
    return [exc]


def _one_line(
    exc: BaseException, options: CallOptions, refused: Sequence[int], has_token: bool, session_gone: bool = False
) -> BaseException:
    """Whatever escaped the connection, as the one line a person needs (or itself, when it is not ours)."""
    import httpx2

    if session_gone:  # whatever failed after it failed for it (the SDK says only "Session terminated")
        return CallError(
            f"{options.url}: the server no longer knows this connection's session (HTTP 404); it may have restarted"
        )
    leaves = _leaves(exc)
    for leaf in leaves:
        if isinstance(leaf, CallError):
            return leaf
    if 404 in refused:
        parts = urlsplit(options.url)
        at_mcp = parts.path.rstrip("/").endswith("/mcp")
        usual = f"{parts.scheme}://{parts.netloc}/mcp"
        hint = "" if at_mcp else f"; the MCP endpoint is usually at /mcp: {usual}"
        return CallError(f"{options.url}: no MCP endpoint there (HTTP 404){hint}")
    if refused:
        if has_token:
            return CallError(f"the server refused the token (HTTP {refused[-1]})")
        return CallError(f"the server requires a token (HTTP {refused[-1]}): pass --token or set MCP_TASKS_TOKEN")
    for leaf in leaves:
        if isinstance(leaf, httpx2.TransportError | OSError):
            return CallError(f"cannot reach {options.url}: {_reason(leaf)}")
        if isinstance(leaf, httpx2.HTTPError):
            return CallError(f"HTTP error talking to {options.url}: {_reason(leaf)}")
        if isinstance(leaf, MCPError):
            return CallError(f"{options.url}: {printable(leaf.message)}")
    if isinstance(exc, BaseExceptionGroup) and len(leaves) == 1:
        return leaves[0]
    return exc


class _OutputClosed(CallError):
    """Stdout's reader went away (`call ... | head`): nothing more can be shown. Once a Ctrl-C's cancel ended
    the task (the Ctrl-C ends the reader too, `| cat`): 130; otherwise the task may go on, and stderr says how
    to follow it."""

    def __init__(self, resume: str | None, interrupts: _Interrupts) -> None:
        if interrupts.cancelled:
            super().__init__("the output was closed (its reader left); the task was cancelled", EXIT_CANCELLED)
        elif resume:
            super().__init__(f"the output was closed (its reader left); the task may still be running: {resume}")
        else:
            super().__init__("the output was closed (its reader left)")


def _closed(out: IO[str]) -> None:
    """Point a stream whose reader left at /dev/null."""
    with suppress(OSError, ValueError):
        null = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(null, out.fileno())
        finally:
            os.close(null)


def _reason(exc: BaseException) -> str:
    """The operating system's words where the error came from one (`Connection refused`), else the library's
    first line, with the error's name."""
    cause: BaseException | None = exc
    for _ in range(8):  # the chain httpx and anyio build: ConnectError <- OSError <- ExceptionGroup[OSError]
        if cause is None:
            break
        if isinstance(cause, ssl.SSLError):  # its errno is the TLS library's code, not the system's
            return f"TLS handshake failed, {cause.reason or cause} ({type(exc).__name__})"
        if isinstance(cause, OSError) and cause.strerror:  # asyncio's words add the address: the errno's alone
            code = cause.errno
            words = os.strerror(code) if code is not None and code in errno.errorcode else cause.strerror
            return f"{words} ({type(exc).__name__})"
        grouped = cause.exceptions[0] if isinstance(cause, BaseExceptionGroup) else None
        cause = grouped or cause.__cause__ or cause.__context__
    lines = str(exc).strip().splitlines()
    return f"{lines[0][:200]} ({type(exc).__name__})" if lines else type(exc).__name__


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


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} is out of range for a JSON number")
    return value


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON (JSON has no NaN or Infinity)")


def parse_arguments(text: str | None) -> dict[str, Any]:
    """ARGS as typed -> the tool's arguments (a JSON object); `CallError` with one line otherwise. Python's
    NaN, Infinity and numbers past a float are refused: sent on, they would reach the tool as null."""
    if text is None or not text.strip():
        return {}
    try:
        parsed = json.loads(text, parse_float=_finite, parse_constant=_no_constant)
    except ValueError as exc:  # json.JSONDecodeError is one
        raise CallError(f"ARGS is not JSON: {exc}", EXIT_USAGE) from None
    if not isinstance(parsed, dict):
        raise CallError('ARGS must be a JSON object, e.g. \'{"topic": "tides"}\'', EXIT_USAGE)
    try:
        json.dumps(parsed, ensure_ascii=False).encode()
    except UnicodeEncodeError:  # "\ud800" alone: JSON's escapes allow it, UTF-8 (what is sent) has no such text
        raise CallError(
            "ARGS holds a lone surrogate (a \\ud800-\\udfff escape without its pair): not text", EXIT_USAGE
        ) from None
    return parsed


def run(args: argparse.Namespace) -> int:
    if args.resume is not None and not args.resume.strip():
        # An empty id would be asked for and answered "no such task": it is a usage error.
        print("celery-mcp-tasks call: --resume needs a TASK_ID (the id the call printed)", file=sys.stderr)
        return 2
    given = {option.name: getattr(args, option.name) for option in fields(CallOptions)}  # named as the parser's
    return run_call(CallOptions(**given))


@contextmanager
def _sdk_lines() -> Iterator[None]:
    """While a call runs, the SDK client's log records are this command's lines (`_SdkLines`), not the host's."""
    sdk = logging.getLogger("mcp.client")
    handler, propagated = _SdkLines(), sdk.propagate
    sdk.addHandler(handler)
    sdk.propagate = False
    try:
        yield
    finally:
        sdk.removeHandler(handler)
        sdk.propagate = propagated


class _SdkLines(logging.Handler):
    """The SDK client's own errors as this command's lines: one line each, without a traceback. Unhandled,
    Python's last-resort handler prints its warnings bare beside the command's lines ("Session termination
    failed: 404" after a restarted server); the command says what went wrong itself."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)

    def emit(self, record: logging.LogRecord) -> None:
        first = (record.getMessage().strip().splitlines() or [record.levelname.lower()])[0]
        sys.stderr.write(f"{PROG}: the MCP client: {first}\n")


# -- the run --------------------------------------------------------------------------------


class _Interrupts:
    """Ctrl-C (and dev's abort): the first one ends the current step, another one everything."""

    def __init__(self, outer: anyio.CancelScope) -> None:
        self.outer = outer
        self.step: anyio.CancelScope | None = None
        self.count = 0
        self.forced: int | None = None
        self.message: str | None = None
        self.resume: str | None = None  # the command that follows the task again, once there is one
        self.cancelled = False  # the first one's `tasks/cancel` ended the task cancelled

    def interrupt(self) -> None:
        self.count += 1
        if self.count == 1 and self.step is not None:
            self.step.cancel()
        elif self.count == 1:
            self.leave(EXIT_CANCELLED, "interrupted")
        elif self.resume is None:
            self.leave(EXIT_CANCELLED, "interrupted again: leaving now (the task may still be running)")
        else:
            self.leave(EXIT_CANCELLED, f"interrupted again: leaving now; the task may still be running: {self.resume}")

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


def _make_io(options: CallOptions) -> CallIo:
    try:  # when ARGS is -, stdin is the arguments, not the answers to questions
        stdin_fd = sys.stdin.fileno() if sys.stdin is not None and options.arguments != "-" else None
    except (OSError, ValueError):
        stdin_fd = None
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
    echoed = True

    async def readline(self) -> str | None:
        return None


def run_call(
    options: CallOptions,
    *,
    abort: Callable[[], bool] | None = None,
    io: CallIo | None = None,
) -> int:
    """Call (or resume) and follow one task; print as `options` say; return the exit status."""
    io = io or _make_io(options)
    try:
        options = replace(options, arguments=read_arguments(options.arguments, sys.stdin))
        with _sdk_lines():
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
        raise CallError("give a TOOL to call, or --resume=TASK_ID to follow a task (not both)", EXIT_USAGE)
    if options.resume is not None and (options.arguments is not None or options.no_wait):
        raise CallError("--resume follows an existing task: it takes no ARGS and no --no-wait", EXIT_USAGE)
    if options.timeout is not None and not options.timeout > 0:  # NaN too
        raise CallError("--timeout must be a positive number of seconds", EXIT_USAGE)
    if not options.url.lower().startswith(("http://", "https://")):
        raise CallError(
            f"URL must start with http:// or https:// (e.g. http://127.0.0.1:8000/mcp), not {options.url!r}", EXIT_USAGE
        )
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
            except _OutputClosed as exc:
                _closed(io.out)  # what stdout's buffer still holds would fail again at exit's flush
                with suppress(BrokenPipeError):  # `2>&1 | head`: stderr went with it
                    _stop(io.view, str(exc))
                code = exc.code
            except CallError as exc:
                _stop(io.view, str(exc))
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
    """Connect (the SDK's `Client` over Streamable HTTP, the bearer token on every request), start or attach
    to the task, and follow it; whatever goes wrong on the way is one `CallError` line."""
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    token = options.token if options.token is not None else os.environ.get("MCP_TASKS_TOKEN")
    refused: list[int] = []
    session_gone: list[bool] = []
    following: list[anyio.CancelScope] = []  # the task's following, once it exists

    async def note_refusal(response: httpx2.Response) -> None:
        # A 404 to a request in a session is the SDK's "session gone" (a restarted server), not a missing endpoint
        # (the goodbye's DELETE after another failure says nothing new).
        if response.status_code == 404 and "mcp-session-id" in response.request.headers:
            if response.request.method != "DELETE":
                session_gone.append(True)
        elif response.status_code in (401, 403, 404):
            refused.append(response.status_code)
            if response.status_code != 404:
                # A token refused once the task exists (it expired, it was revoked) is refused at every poll
                # after it: the SDK reports each as a server error, which the client retries for ever.
                for scope in following:
                    scope.cancel()

    http = httpx2.AsyncClient(
        headers={"Authorization": f"Bearer {token}"} if token else {},
        timeout=httpx2.Timeout(30, read=300),  # the SDK's own defaults: a response stream may stay open
        event_hooks={"response": [note_refusal]},
    )
    tasks = TasksClient()
    prompter = io.prompter
    shown = _Answering(io.view)
    task_id: str | None = None  # once the task exists, a connection lost says how to resume it
    try:
        async with (
            http,
            Client(
                streamable_http_client(options.url, http_client=http),
                extensions=[tasks],
                elicitation_callback=prompter.elicit,
                sampling_callback=prompter.sample,
                list_roots_callback=prompter.roots,
            ) as client,
        ):
            try:
                # --timeout bounds the start too: a tool that answers without a task (mode="forbidden", or a
                # server without the extension) answers only when its job has run.
                deadline = None if options.timeout is None else anyio.current_time() + options.timeout
                with interrupts.stage() as starting, anyio.move_on_at(deadline or math.inf) as answering:
                    handle = await _start(options, arguments, tasks, client, shown)
                if starting.cancelled_caught:
                    io.view.note("interrupted")
                    return EXIT_CANCELLED
                if answering.cancelled_caught:
                    _stop(
                        io.view,
                        f"no answer after {options.timeout:g}s; gave up waiting (the server cancels a call's job "
                        f"when its caller leaves; a task it created meanwhile keeps running)",
                    )
                    return EXIT_TIMEOUT
                task_id = handle.id
                if task_id is not None:
                    interrupts.resume = f"celery-mcp-tasks call {options.url} --resume={task_id}"
                try:
                    with anyio.CancelScope() as refusal:
                        following.append(refusal)
                        return await _follow(options, io, interrupts, handle, deadline, shown)
                    again = f": {interrupts.resume} with a token it takes" if interrupts.resume else ""
                    status = "HTTP 401; expired?" if refused[-1] == 401 else f"HTTP {refused[-1]}"
                    raise CallError(
                        f"the server refused the token ({status}) while following the task; "
                        f"it may still be running{again}"
                    )
                finally:
                    handle.close()
            finally:
                # Following ends before the connection closes, also when leaving at once (shielded):
                # a notification on a listen stream still open would meet a closed session.
                with anyio.CancelScope(shield=True):
                    await tasks.stop_following(client)
    except Exception as exc:  # noqa: BLE001 - an ExceptionGroup from the SDK's task groups, or one error: one line
        if any(isinstance(leaf, BrokenPipeError) for leaf in _leaves(exc)):  # stdout's reader left (`| head`)
            resume = task_id and f"celery-mcp-tasks call {options.url} --resume={task_id}"
            raise _OutputClosed(resume, interrupts) from None
        error = _one_line(exc, options, refused, bool(token), bool(session_gone))
        ours = any(isinstance(e, CallError) for e in _leaves(exc)) and not session_gone
        if task_id and isinstance(error, CallError) and not ours:
            resume = f"celery-mcp-tasks call {options.url} --resume={task_id}"
            error = CallError(f"{error}\n{PROG}: the task may still be running: {resume}", error.code)
        raise error from None


class _Answering:
    """The progress a tool that answers without a task (`mode="forbidden"`) reports while its call runs (the
    SDK's progress callback), shown as a task's state would be: the live line on a terminal, a line per
    message otherwise."""

    def __init__(self, view: View) -> None:
        self.view = view
        self.state: TaskState | None = None
        self._since = format_timestamp(now_ms())

    async def __call__(self, progress: float, total: float | None, message: str | None) -> None:
        self.state = TaskState.model_validate(
            {
                "taskId": "",
                "status": "working",
                "statusMessage": message,
                "createdAt": self._since,
                "lastUpdatedAt": format_timestamp(now_ms()),
                "_meta": {PROGRESS_META_KEY: {"progress": progress, "total": total}},
            }
        )
        self.view.answering(self.state)

    def ended(self, answer: CallToolResult) -> None:
        """The answer came: the line it left says how the call ended (not the last progress it heard: the server
        reports what it read of the job, and the job may have gone on before it answered)."""
        if self.state is not None:
            ended = "failed" if answer.is_error else "completed"
            self.view.update(self.state.model_copy(update={"status": ended, "status_message": None}))


async def _start(
    options: CallOptions, arguments: dict[str, Any], tasks: TasksClient, client: Client, progress: _Answering
) -> TaskHandle:
    """The tool's task (or an answer at once), or `--resume`'s; a refusal is one `CallError` line."""
    try:
        if options.resume is not None:
            return await tasks.attach(client, options.resume)
        assert options.tool is not None
        # --no-wait prints an id or nothing on stdout: no progress lines either
        return await tasks.start(
            client, options.tool, arguments, progress_callback=None if options.no_wait else progress
        )
    except TaskNotFound:
        raise CallError("no such task: it expired, or it belongs to another user") from None
    except MCPError as exc:
        raise CallError(printable(exc.message) + await _other_tools(client, options.tool)) from None


async def _other_tools(client: Client, tool: str | None) -> str:
    """When the server has no tool of that name, the ones it has (a typo is the usual reason); else nothing.
    Every page of `tools/list`, within `_TOOLS_LOOKUP_S`: a hint must not hold the refusal up."""
    if tool is None:
        return ""
    found: list[str] = []
    cursor: str | None = None
    with anyio.move_on_after(_TOOLS_LOOKUP_S) as lookup:
        try:
            for _ in range(_TOOLS_PAGES):
                page = await client.list_tools(cursor=cursor)
                found += (listed.name for listed in page.tools)
                cursor = page.next_cursor
                if not cursor:
                    break
        except Exception:  # noqa: BLE001 - a hint only: the refusal itself is what is said
            return ""
    names = sorted(found)
    if lookup.cancelled_caught or cursor or tool in names:  # not every page seen: no hint rather than a wrong one
        return ""
    shown = printable(", ".join(names[:_TOOLS_SHOWN]) + (", ..." if len(names) > _TOOLS_SHOWN else ""))
    return f" (this server's tools: {shown})" if names else " (this server has no tools)"


async def _follow(
    options: CallOptions,
    io: CallIo,
    interrupts: _Interrupts,
    handle: TaskHandle,
    deadline: float | None,
    shown: _Answering,
) -> int:
    """Show the task's changes until it ends, `deadline` (--timeout, from the call's start) or a Ctrl-C."""
    view = io.view
    if handle.id is None:  # the tool answered at once: there is no task
        answer = await handle.result()
        shown.ended(answer)
        if options.no_wait:  # stdout holds a task id or nothing: a script's ID=$(...) never takes a result for one
            view.note(f"{PROG}: the tool answered without a task, so there is no id to print; its result:")
            view.note(printable(result_text(answer).expandtabs(), lines=True))
        else:
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
                with anyio.fail_at(deadline or math.inf):
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
        _stop(
            view,
            f"still {state.status} after {options.timeout:g}s; the task keeps running. "
            f"Follow it with: celery-mcp-tasks call {options.url} --resume={task_id}",
        )
        return EXIT_TIMEOUT
    code = _show_end(view, state, result)
    if code == EXIT_CANCELLED and problem is not None:  # e.g. a question this client could not answer
        view.note(f"{PROG}: {printable(problem.message)}")
    if code is not None:
        return code
    _stop(view, printable(problem.message) if problem is not None else "the task ended without an outcome")
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
            interrupts.cancelled = handle.state is not None and handle.state.status == "cancelled"
    except TaskNotFound:
        _stop(view, "the task is gone (expired)")
        return EXIT_FAILED
    except (MCPError, TimeoutError) as exc:
        _stop(
            view, f"could not cancel the task: {exc.message if isinstance(exc, MCPError) else 'no answer within 10s'}"
        )
        return EXIT_FAILED
    state = handle.state
    assert state is not None
    view.update(state)
    result = state.call_tool_result() if state.status == "completed" else None  # it finished before the cancel
    code = _show_end(view, state, result)
    if code is None:
        _stop(view, f"the cancel was sent; the task is still {state.status}")
    return EXIT_CANCELLED if code is None else code


def _show_end(view: View, state: TaskState, result: CallToolResult | None) -> int | None:
    """Show the result, or how the task failed or was cancelled: the exit status (None: it did not end)."""
    if result is not None:
        view.result(result)
        return exit_code("completed", is_error=bool(result.is_error))
    if state.status == "failed":
        view.failed(state.error_data())
        return EXIT_FAILED
    if state.status == "cancelled":
        view.stopped()
        return EXIT_CANCELLED
    return None


def _stop(view: View, message: str) -> None:
    view.close()
    view.note(f"{PROG}: {message}")
