"""The synchronous path: a task tool called by a client without the Tasks extension.

The job runs as a hidden task and the call answers with its outcome; its reports go out as
`notifications/progress`, its questions on the request's own stream (earlier eras) or as an MRTR
`InputRequiredResult` (2026-07-28); a cancelled, abandoned or timed-out call cancels the hidden task.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from functools import partial
from typing import Any, Protocol, TypeVar

import anyio
from mcp.server.context import HandlerResult, ServerRequestContext
from mcp.shared.exceptions import MCPError
from mcp.shared.message import ServerMessageMetadata
from mcp_types import (
    CallToolRequestParams,
    ElicitResult,
    InputRequest,
    InputRequiredResult,
)
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import TypeAdapter, ValidationError

from celery_mcp_tasks.mcp.principal import current_principal
from celery_mcp_tasks.mcp.toolspec import TaskTool
from celery_mcp_tasks.mcp.wire import declared_capability, internal, invalid_params, plain_responses
from celery_mcp_tasks.model import InvalidInputResponse, TaskRecord, TaskStatus
from celery_mcp_tasks.notify.hub import Hub, Watch
from celery_mcp_tasks.protocol import answer_type, capability_of, render_error
from celery_mcp_tasks.service import PayloadTooLarge, TaskExpired, TaskService
from celery_mcp_tasks.store.base import TaskNotFound

logger = logging.getLogger("celery_mcp_tasks.mcp")

T = TypeVar("T")
_SYNC_STATE = "celery-mcp-tasks/sync/1:"
"""`requestState` of a synchronous call's MRTR round: this prefix, then the hidden row's key (sealed by the SDK)."""
_SAFETY_REREAD_S = 1.0  # with push on: a hint can be lost (or land before the watch exists); re-read anyway
_POLL_FIRST_S, _POLL_MAX_S = 0.02, 0.25  # with push off: poll the row, growing delay

_INPUT_REQUEST: TypeAdapter[InputRequest] = TypeAdapter(InputRequest)
_CALLER_CHECK_S = 0.5
_ABANDON_S = 5.0
"""The bound on cancelling a hidden task on the way out of a cancelled call: a hung store does not hold it."""


class Run(Protocol):  # `TasksExtension._run`: `fn` on the bounded pool; a store outage answers -32603
    def __call__(self, fn: Callable[[], T], method: str, *, logged: bool = True) -> Awaitable[T]: ...


class _Latest:
    """The last record a synchronous call read (only that one, however long the job runs)."""

    __slots__ = ("record",)

    def __init__(self, record: TaskRecord) -> None:
        self.record = record


class SyncCalls:
    """The synchronous path of `TasksExtension` (which builds it with its own service, pool and settings).

    `sync_timeout_s` (MCP_TASKS_SYNC_TIMEOUT_S; a tool's own wins) bounds a call's silence, not its
    length: it restarts at every change the job reports (`_reported`); a job silent that long is
    cancelled and the caller gets -32603. `hub()` None: push is off, the wait polls the row.
    `sealed_state`: whether the SDK seals `requestState` (questions go by MRTR only then).
    """

    def __init__(
        self,
        service: Callable[[], TaskService],
        run: Run,
        *,
        sync_timeout_s: float,
        hub: Callable[[], Hub | None],
        sealed_state: Callable[[], bool],
    ) -> None:
        self._service = service
        self._run = run
        self._sync_timeout_s = sync_timeout_s
        self._hub = hub
        self._sealed_state = sealed_state
        self._waiting: dict[object, str] = {}  # each non-idempotent call's hidden row key (`abandon_all`)

    async def call(
        self, tool: TaskTool, ctx: ServerRequestContext[Any, Any], record: TaskRecord, *, idempotent: bool = False
    ) -> HandlerResult:
        """A task tool called without the extension: wait for the hidden task's outcome, answer plainly.

        Whenever the answer can no longer be delivered (an unanswerable question, `sync_timeout_s` of
        silence, a cancelled request, a caller gone) the row is cancelled, so no job runs for nobody. An
        MRTR round leaves it waiting for the retry, and so does an `idempotent` call's caller leaving:
        its retry with the same key meets the same row.
        """
        hub = self._hub()
        watch = hub.watch([record.key]) if hub is not None else None
        latest = _Latest(record)
        waiting = object()
        if not idempotent:  # an idempotent call's task outlives its caller, and its server: a retry meets it
            self._waiting[waiting] = record.key
        try:
            outcome, gone = await unless_caller_leaves(ctx, lambda: self._follow(tool, ctx, latest, watch))
        except anyio.get_cancelled_exc_class():
            if not idempotent:
                with anyio.CancelScope(shield=True), anyio.move_on_after(_ABANDON_S):
                    await self._abandon(latest.record, "The synchronous caller cancelled the request")
            raise
        finally:
            self._waiting.pop(waiting, None)
            if watch is not None:
                watch.close()
        if gone:
            if not idempotent:
                await self._abandon(latest.record, "The synchronous caller went away")
            raise internal(f"Tool {tool.name}: the caller disconnected")
        return outcome

    async def _follow(
        self, tool: TaskTool, ctx: ServerRequestContext[Any, Any], latest: _Latest, watch: Watch | None
    ) -> HandlerResult:
        """Wait (woken by `watch`, else polling) until the task ends, bridging its reports and questions.

        `latest` holds the last record read, for the caller to abandon on the way out.
        """
        service = self._service()
        record = latest.record
        idle_s = tool.sync_timeout_s or self._sync_timeout_s
        deadline = anyio.current_time() + idle_s
        reported = _reported(record)
        progress = CallProgress(ctx, record)
        delay = _POLL_FIRST_S
        failing = False  # the store failed the last re-read: said once in the log, not at every re-read
        while not record.terminal:
            if record.status is TaskStatus.INPUT_REQUIRED:
                asked = await self._ask(tool, ctx, record)
                if isinstance(asked, InputRequiredResult):
                    return asked
                latest.record = record = asked
                deadline, reported = anyio.current_time() + idle_s, _reported(record)
                continue
            remaining = deadline - anyio.current_time()
            if remaining <= 0:
                pass  # read once more before giving up: a claim is not read as it lands (`_the_claim`), a last
                # hint may not be taken yet, and the row says whether the job ended, spoke, or ever started
            elif watch is not None:
                hints = await watch.next(min(_SAFETY_REREAD_S, remaining))
                if hints and all(version is not None and version <= record.version for version in hints.values()):
                    continue  # nothing newer than what was read (the poller's first sight of the row)
                if hints and _the_claim(record, hints):
                    continue  # the job started: nothing this call shows, the row is not read for it
            else:
                await anyio.sleep(min(delay, remaining))
                delay = min(delay * 1.5, _POLL_MAX_S)
            try:
                read = await self._run(partial(service.record, record.key), "tools/call", logged=not failing)
            except MCPError:  # the store failed this read (logged): it may be back by the next, within the bound
                failing = True
                if remaining > 0:
                    continue
                await self._abandon(record, "Timed out waiting synchronously")  # best effort: else the reaper
                raise
            failing = False
            if read is None:
                raise internal(f"Tool {tool.name}: the job's task is gone")
            latest.record = record = read
            if _reported(record) != reported:
                deadline, reported = anyio.current_time() + idle_s, _reported(record)
                if not record.terminal:
                    await progress.report(record)
            elif remaining <= 0:  # silent for the whole bound, read again included
                await self._abandon(record, "Timed out waiting synchronously")
                raise internal(_timed_out(tool, record, idle_s))
        if record.status is TaskStatus.COMPLETED and record.result is not None:
            return record.result
        error = render_error(record.error, record.status_message or "The job did not complete")
        raise MCPError(code=error["code"], message=error["message"], data=error.get("data"))

    async def _ask(
        self, tool: TaskTool, ctx: ServerRequestContext[Any, Any], record: TaskRecord
    ) -> TaskRecord | InputRequiredResult:
        """The job asked: the client answers (the task resumes) or, when it cannot, the task is cancelled.

        2026-07-28: an MRTR round naming the row in its sealed `requestState`. Earlier eras: each question
        as a request on the call's own stream, the answers put into the task as `tasks/update` would.
        """
        requests = record.input_requests
        if can_answer(ctx, requests):
            if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
                if self._sealed_state():  # an MRTR round; the SDK's `RequestStateBoundary` seals the state
                    typed = {
                        key: _INPUT_REQUEST.validate_python(r, by_alias=True, by_name=False)
                        for key, r in requests.items()
                    }
                    return InputRequiredResult(input_requests=typed, request_state=_SYNC_STATE + record.key)
            elif ctx.session.can_send_request:
                try:
                    answers = {key: await ask_client(ctx, request) for key, request in requests.items()}
                except (MCPError, ValidationError) as exc:
                    await self._abandon(record, "The client did not answer the job's question")
                    raise internal(
                        f"Tool {tool.name}: the client did not answer its input request ({type(exc).__name__})"
                    ) from None
                try:
                    return await self._run(partial(self._service().answer_by_key, record.key, answers), "tools/call")
                except PayloadTooLarge as exc:
                    await self._abandon(record, "The client's answer was too large")
                    raise invalid_params(str(exc)) from None
                except InvalidInputResponse as exc:  # an answer of the wrong shape: the call cannot go on
                    await self._abandon(record, "The client's answer did not fit the job's question")
                    raise invalid_params(str(exc)) from None
        await self._abandon(record, "The job needs input; call it as a task")
        # a desktop client cannot pick the extension: it can be told what the tool needs of it
        if missing := undeclared(ctx, requests):
            raise internal(
                f"Tool {tool.name} needs input from the user, and this client did not declare {', '.join(missing)}: "
                "call it from a client that does, or with the tasks extension"
            )
        raise internal(f"Tool {tool.name} needs input from the user; call it with the tasks extension")

    async def resume(self, tool: TaskTool, params: CallToolRequestParams) -> TaskRecord | None:
        """The hidden task an MRTR retry names (answered with its `inputResponses`); None for any other call.

        The SDK verified the seal (and the tool, arguments and principal it binds); the row must still be
        the caller's and this tool's.
        """
        state = params.request_state
        if not (isinstance(state, str) and state.startswith(_SYNC_STATE)):
            return None
        if not self._sealed_state():
            raise invalid_params("Invalid or expired requestState")  # never minted here: the key would be in clear
        key = state.removeprefix(_SYNC_STATE)
        owner = current_principal()
        responses = plain_responses(params.input_responses)
        service = self._service()

        def answer() -> TaskRecord | None:
            record = service.get_by_key(key, owner)
            if record.tool != tool.name:
                return None
            return service.answer_by_key(key, responses, owner=owner) if responses else record

        try:
            record = await self._run(answer, "tools/call")
        except (TaskNotFound, TaskExpired):
            record = None
        except (InvalidInputResponse, PayloadTooLarge) as exc:  # the call cannot go on, as on the earlier eras
            why = "too large" if isinstance(exc, PayloadTooLarge) else "did not fit the job's question"
            await self._abandon_key(key, f"The client's answer {why}")
            raise invalid_params(str(exc)) from None
        if record is None:
            raise invalid_params("Invalid or expired requestState")
        return record

    async def _abandon(self, record: TaskRecord, message: str) -> None:
        """Cancel a synchronous call's hidden task (a no-op once terminal; the service revokes its job).

        Never raises: it runs on the way out of another answer. With the store down the reaper ends the job.
        """
        await self._abandon_key(record.key, message)

    async def _abandon_key(self, key: str, message: str) -> None:
        try:
            await self._run(partial(self._service().cancel_by_key, key, message), "tools/call")
        except MCPError:
            pass  # the store is unavailable: already logged

    def abandon_all(self, message: str) -> int:
        """Cancel the hidden task of every call still waiting (but idempotent ones: a retry with the key meets the
        task); how many there were. Blocking: run it in a thread.

        For a server that exits before its handlers can unwind (`stdio` on a signal), so no job runs on
        for nobody. Never raises; the caller bounds it in time (a hung store is simply left behind).
        """
        keys = set(self._waiting.copy().values())  # one C-level copy: safe against the loop's changes
        if not keys:
            return 0
        service = self._service()
        for key in keys:
            try:
                service.cancel_by_key(key, message)
            except Exception as exc:  # noqa: BLE001 - on the way out: the reaper ends what is left
                logger.warning("could not cancel a synchronous call's task on shutdown: %s", type(exc).__name__)
        return len(keys)


def _timed_out(tool: TaskTool, record: TaskRecord, idle_s: float) -> str:
    """Why a synchronous call gave up its job, naming the bound that ended it and what to do."""
    setting = "the tool's sync_timeout_s" if tool.sync_timeout_s else "MCP_TASKS_SYNC_TIMEOUT_S"
    bound = f"{idle_s:g} s ({setting})"
    if record.started_at is None:
        why = f"no worker started its job within {bound}: check that a worker consumes its queue"
    else:
        why = f"its job reported nothing for {bound}"
    advice = "" if tool.mode == "forbidden" else "; call it with the tasks extension to wait as long as it runs"
    return f"Tool {tool.name} did not finish in time, and its job was cancelled: {why}{advice}"


def _the_claim(record: TaskRecord, hints: Mapping[str, int | None]) -> bool:
    """The hint is for the write right after the one `record` is, on a dispatched run not started yet: the job's
    claim, but for a rare other writer (an operator's cancel, a claim that could not be written and failed).
    A claim says only the runtime's "Started" (not reported to the caller: `CallProgress`), so the row is not
    read for it; should it be another write, the next hint or the safety re-read (`_SAFETY_REREAD_S`) reads it."""
    fresh = record.status is TaskStatus.WORKING and record.started_at is None and record.dispatches > 0
    return fresh and set(hints.values()) == {record.version + 1}


def _reported(record: TaskRecord) -> tuple[Any, ...]:
    """What the job reports (state, message, progress, questions): a change restarts the idle bound.
    Not the version: a run's claim and other bookkeeping bump it without the job saying anything."""
    return (record.status, record.status_message, record.progress, record.progress_total, tuple(record.input_requests))


# -- the calling request: its input capabilities, its back-channel, whether its HTTP caller is still there -------


def can_answer(ctx: ServerRequestContext[Any, Any], requests: Mapping[str, Any]) -> bool:
    """The client declared the capability for every one of `requests` (wire shapes, by key)."""
    known = all(isinstance(request, Mapping) and capability_of(request) for request in requests.values())
    return bool(requests) and known and not undeclared(ctx, requests)


def undeclared(ctx: ServerRequestContext[Any, Any], requests: Mapping[str, Any]) -> list[str]:
    """The capabilities `requests` need that the client did not declare, sorted (requests of no known kind need none)."""
    return sorted(
        {
            name
            for request in requests.values()
            if isinstance(request, Mapping) and (name := capability_of(request)) and not declared_capability(ctx, name)
        }
    )


async def ask_client(ctx: ServerRequestContext[Any, Any], request: Mapping[str, Any]) -> dict[str, Any]:
    """Ask one input request (a wire shape) on the calling request's own stream (earlier eras): the answer
    as `tasks/update` would carry it. `MCPError`: the client's error; `ValidationError`: a malformed one."""
    typed = _INPUT_REQUEST.validate_python(request, by_alias=True, by_name=False)
    result_type = answer_type(request) or ElicitResult
    answer = await ctx.session.send_request(
        typed, result_type, metadata=ServerMessageMetadata(related_request_id=ctx.request_id)
    )
    return answer.model_dump(by_alias=True, mode="json", exclude_none=True)


class CallProgress:
    """`notifications/progress` for the calling request (a no-op without a progressToken), strictly increasing.

    The job's own numbers when it reports them (from 0 or from 1), else a count of
    its reports from 0; a number that does not exceed the last one sent is skipped.
    The runtime's own word for a start or a retry ("Started", "Retrying (attempt 2)":
    a change that moves the run's start) is not sent without a number of the job's:
    it would take the 0 that the job's first report may need.
    """

    def __init__(self, ctx: ServerRequestContext[Any, Any], record: TaskRecord) -> None:
        self._session = ctx.session
        self._last: float | None = None
        self._started_at = record.started_at

    async def report(self, record: TaskRecord) -> None:
        current, total, message = record.progress, record.progress_total, record.status_message
        restarted, self._started_at = record.started_at != self._started_at, record.started_at
        if current is None and restarted:
            return  # the runtime's word, not the job's
        value = current if current is not None else 0 if self._last is None else self._last + 1
        if self._last is not None and value <= self._last:
            return  # a message without a step forward: progress must never repeat or go back
        self._last = value
        try:
            await self._session.report_progress(value, total if current is not None else None, message)
        except Exception as exc:  # noqa: BLE001 - progress is best effort; the answer still goes out
            logger.debug("could not send progress for a synchronous call: %s", type(exc).__name__)


async def unless_caller_leaves(
    ctx: ServerRequestContext[Any, Any], fn: Callable[[], Awaitable[T]]
) -> tuple[T | None, bool]:
    """Run `fn`: `(its result, False)`, or `(None, True)` once the HTTP caller disconnected (`fn` is then cancelled).

    On the earlier eras' Streamable HTTP a closed response stream does not cancel the handler (the
    session outlives the POST). Without an HTTP request (stdio, in-process) `fn` simply runs.
    """
    disconnected: Callable[[], Awaitable[bool]] | None = getattr(ctx.request, "is_disconnected", None)
    if disconnected is None:
        return await fn(), False
    results: list[T] = []
    failures: list[Exception] = []
    gone = False
    async with anyio.create_task_group() as tg:

        async def body() -> None:
            try:
                results.append(await fn())
            except Exception as exc:  # noqa: BLE001 - re-raised below, outside the task group (no ExceptionGroup)
                failures.append(exc)
            finally:
                tg.cancel_scope.cancel()

        tg.start_soon(body)
        while not await disconnected():  # noqa: ASYNC110 - a Request offers no disconnect event, only this check
            await anyio.sleep(_CALLER_CHECK_S)
        gone = True
        tg.cancel_scope.cancel()
    if failures:
        raise failures[0]
    if results:
        return results[0], False
    return None, gone
