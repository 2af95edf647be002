"""`TasksClient`: the Tasks extension for the SDK's `Client`.

    async with Client(url, extensions=[TasksClient()], elicitation_callback=ask) as client:
        result = await client.call_tool("write_report", {"topic": "tides"})  # waits for the task

The extension advertises `io.modelcontextprotocol/tasks` and claims
`resultType: "task"`, so a plain `call_tool` on a task tool follows the task
to its end and returns the `CallToolResult` the synchronous call would have
returned. A `failed` task raises the SDK's `MCPError` with the task's error, a
`cancelled` one `TaskCancelled`, a task the server no longer knows
`TaskNotFound`. Questions (`input_required`) are answered with the client's
own elicitation / sampling / roots callbacks and sent with `tasks/update`.
Cancelling the awaiting coroutine cancels the task.

Following: one `subscriptions/listen` stream per connection names every task
being followed (`taskIds`) when the server follows tasks on listen; it is
re-opened after a drop, and each newly followed task is read once after the
acknowledgment, so no change between creation and subscription is missed.
Otherwise each task is polled at its `pollIntervalMs` (within a floor and a
ceiling), backing off while nothing changes.

For applications that keep tasks across restarts: `start()` returns a
`TaskHandle` (id, state, state changes, `answer`, `cancel`, `result`), and
`attach()` makes one for a task id stored earlier. No log line names a task.
"""

from __future__ import annotations

import contextvars
import logging
import weakref
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, cast

import anyio
import anyio.abc
from mcp.client.extension import ClaimContext, ClientExtension, NotificationBinding, ResultClaim
from mcp.shared.exceptions import MCPError
from mcp_types import (
    CONNECTION_CLOSED,
    INTERNAL_ERROR,
    INVALID_PARAMS,
    INVALID_REQUEST,
    CallToolResult,
    ErrorData,
    InputRequest,
    RequestParamsMeta,
    TextContent,
)
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError

from celery_mcp_tasks.client import _sdk
from celery_mcp_tasks.client.models import (
    Ack,
    CancelTaskRequest,
    CreateTaskResult,
    GetTaskRequest,
    TaskIdParams,
    TaskState,
    UpdateParams,
    UpdateTaskRequest,
)
from celery_mcp_tasks.protocol import EXTENSION_ID

if TYPE_CHECKING:
    from mcp.client.client import Client
    from mcp.client.session import ClientSession

__all__ = ["InputNotAnswered", "TaskCancelled", "TaskHandle", "TaskNotFound", "TasksClient"]

logger = logging.getLogger("celery_mcp_tasks.client")

TASKS_VERSIONS = frozenset({"2026-07-28"}) & frozenset(MODERN_PROTOCOL_VERSIONS)
_INPUT_REQUEST: TypeAdapter[Any] = TypeAdapter(InputRequest)
_ACK_TIMEOUT_S = 5.0  # the acknowledgment is the stream's first frame: it comes at once or not at all
_SAFETY_READ_S = 30.0  # with push on, each followed task is still read this often (a lost notification heals)


class TaskCancelled(Exception):
    """The task ended `cancelled` (by this client, another client, or the server)."""

    def __init__(self, state: TaskState) -> None:
        reason = f": {state.status_message}" if state.status_message else ""
        super().__init__(f"The task was cancelled{reason}")
        self.state = state


class TaskNotFound(MCPError):
    """The server no longer knows the task (expired, evicted, or never this caller's)."""


class InputNotAnswered(MCPError):
    """The task asked for input this client could not give (no callback, or the callback refused).

    The task is cancelled before this is raised.
    """


class _TasksNotificationParams(BaseModel):
    model_config = ConfigDict(extra="allow")


@dataclass
class _Tracked:
    """One followed task: its latest state, a version, and an event fired on each change."""

    state: TaskState
    version: int = 0
    changed: anyio.Event = field(default_factory=anyio.Event)
    gone: MCPError | None = None
    refs: int = 0
    next_poll: float = 0.0
    interval: float = 0.0
    on_end: Callable[[], None] | None = None  # the follower's wake-up: one task fewer to follow

    def offer(self, state: TaskState) -> bool:
        """Take a newer state; never leave a terminal one, never go back in time (but a final state always wins)."""
        current = self.state
        if current.terminal or state.task_id != current.task_id:
            return False
        if not state.terminal and _moment(state.last_updated_at) < _moment(current.last_updated_at):
            return False  # notifications may arrive out of wire order
        if state == current:
            return False
        self.state = state
        self._fire()
        return True

    def lose(self, error: MCPError) -> None:
        if self.gone is None and not self.state.terminal:
            self.gone = error
            self._fire()

    def _fire(self) -> None:
        self.version += 1
        event, self.changed = self.changed, anyio.Event()
        event.set()
        if (self.state.terminal or self.gone is not None) and self.on_end is not None:
            self.on_end()


def _moment(stamp: str) -> tuple[int, float | str]:
    """A timestamp to order states by: parsed (servers differ in precision and offsets), else the text."""
    try:
        moment = datetime.fromisoformat(stamp)
    except ValueError:
        return (1, stamp)
    return (0, (moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)).timestamp())


class TasksClient(ClientExtension):
    """The Tasks extension for `mcp.Client(extensions=[...])`.

    poll_floor_s / poll_ceiling_s: the bounds of the polling interval when the server
    does not follow tasks on listen (the server's `pollIntervalMs` inside them, growing
    by `backoff` while nothing changes).
    timeout: the longest a plain `call_tool` waits for a task (None: as long as it runs);
    past it the task is cancelled and `TimeoutError` raised.
    cancel_timeout: how long a `tasks/cancel` on the way out may take.
    listen: follow tasks on `subscriptions/listen` when the server offers it.
    """

    identifier = EXTENSION_ID

    def __init__(
        self,
        *,
        poll_floor_s: float = 0.1,
        poll_ceiling_s: float = 5.0,
        backoff: float = 1.5,
        timeout: float | None = None,
        cancel_timeout: float = 5.0,
        listen: bool = True,
    ) -> None:
        if poll_floor_s <= 0 or poll_ceiling_s < poll_floor_s or backoff < 1:
            raise ValueError("TasksClient: need 0 < poll_floor_s <= poll_ceiling_s and backoff >= 1")
        self.poll_floor_s = poll_floor_s
        self.poll_ceiling_s = poll_ceiling_s
        self.backoff = backoff
        self.timeout = timeout
        self.cancel_timeout = cancel_timeout
        self.listen = listen
        self._followers: weakref.WeakKeyDictionary[ClientSession, _Follower] = weakref.WeakKeyDictionary()
        self._capture: contextvars.ContextVar[list[TaskHandle] | None] = contextvars.ContextVar(
            "celery_mcp_tasks_capture", default=None
        )

    # -- the SDK's extension surface --------------------------------------------------

    def claims(self) -> Sequence[ResultClaim[Any]]:
        return [
            ResultClaim(
                result_type="task",
                model=CreateTaskResult,
                resolve=self._resolve,
                protocol_versions=TASKS_VERSIONS,
            )
        ]

    def notifications(self) -> Sequence[NotificationBinding[Any]]:
        return [
            NotificationBinding(
                method="notifications/tasks", params_type=_TasksNotificationParams, handler=self._on_notification
            )
        ]

    async def _on_notification(self, params: _TasksNotificationParams) -> None:
        try:
            state = TaskState.model_validate(params.model_dump(by_alias=True), by_name=False)
        except ValidationError:
            logger.warning("ignored a malformed notifications/tasks")
            return
        for follower in list(self._followers.values()):
            follower.offer(state)

    async def _resolve(self, created: CreateTaskResult, ctx: ClaimContext) -> CallToolResult:
        handle = self._handle(ctx.session, created.state(), ctx.tool_name)
        capture = self._capture.get()
        if capture is not None:  # start(): the caller wants the handle, not the wait
            capture.append(handle)
            return CallToolResult(content=[TextContent(type="text", text="(task started)")], is_error=True)
        try:
            with anyio.fail_after(self.timeout):
                return await handle.result()
        except BaseException:
            if not handle.finished:
                await handle._cancel_on_the_way_out()
            raise
        finally:
            handle.close()

    # -- the explicit API -------------------------------------------------------------

    async def start(
        self,
        client: Client | ClientSession,
        name: str,
        arguments: dict[str, Any] | None = None,
        *,
        meta: Mapping[str, Any] | None = None,
    ) -> TaskHandle:
        """Call `name` and return its task's handle without waiting.

        A tool that answers at once (a plain tool, or a server that chose not to
        make a task) gives a handle that is already finished: `id` is None and
        `result()` returns that answer.
        """
        from mcp.client.client import Client

        captured: list[TaskHandle] = []
        token = self._capture.set(captured)
        try:
            if isinstance(client, Client):
                result: Any = await client.call_tool(
                    name, arguments, meta=cast(RequestParamsMeta, dict(meta)) if meta else None
                )
            else:
                result = await client.call_tool(
                    name,
                    arguments,
                    meta=cast(RequestParamsMeta, dict(meta)) if meta else None,
                    allow_claimed=True,
                )
                if isinstance(result, CreateTaskResult):
                    return self._handle(client, result.state(), name)
        finally:
            self._capture.reset(token)
        if captured:
            return captured[0]
        if not isinstance(result, CallToolResult):
            raise MCPError(INVALID_REQUEST, f"tools/call returned an unexpected result: {type(result).__name__}")
        session = client.session if isinstance(client, Client) else client
        return TaskHandle(self, session, None, name, immediate=result)

    async def attach(self, client: Client | ClientSession, task_id: str) -> TaskHandle:
        """A handle for a task created earlier (by this process or another); reads it once."""
        from mcp.client.client import Client

        session = client.session if isinstance(client, Client) else client
        state = await _get(session, task_id)
        return self._handle(session, state, None)

    # -- internals --------------------------------------------------------------------

    def _handle(self, session: ClientSession, state: TaskState, tool: str | None) -> TaskHandle:
        follower = self._followers.get(session)
        if follower is None:
            follower = self._followers[session] = _Follower(self, session)
        return TaskHandle(self, session, follower.track(state), tool)


class TaskHandle:
    """One task: its id, its latest state, its changes, and what a client can do with it."""

    def __init__(
        self,
        tasks: TasksClient,
        session: ClientSession,
        tracked: _Tracked | None,
        tool: str | None,
        *,
        immediate: CallToolResult | None = None,
    ) -> None:
        self._tasks = tasks
        self._session = session
        self._tracked = tracked
        self.tool = tool
        self._immediate = immediate
        self._answered: set[str] = set()
        self._closed = False
        if tracked is not None:
            tracked.refs += 1

    @property
    def id(self) -> str | None:
        """The task id (keep it to `attach` later); None when the tool answered at once."""
        return self._tracked.state.task_id if self._tracked is not None else None

    @property
    def state(self) -> TaskState | None:
        """The latest state seen (None when the tool answered at once)."""
        return self._tracked.state if self._tracked is not None else None

    @property
    def status(self) -> str:
        return self._tracked.state.status if self._tracked is not None else "completed"

    @property
    def finished(self) -> bool:
        tracked = self._tracked
        return tracked is None or tracked.state.terminal or tracked.gone is not None

    async def refresh(self) -> TaskState | None:
        """Read the task now (`tasks/get`)."""
        tracked = self._tracked
        if tracked is None:
            return None
        try:
            tracked.offer(await _get(self._session, tracked.state.task_id))
        except TaskNotFound as gone:
            tracked.lose(gone)
            raise
        return tracked.state

    async def updates(self) -> AsyncIterator[TaskState]:
        """The current state, then each change, ending after the terminal one.

        Raises `TaskNotFound` when the task disappears while followed.
        """
        tracked = self._open()
        if tracked is None:
            return
        seen = -1
        while True:
            if tracked.version != seen:
                seen = tracked.version
                yield tracked.state
                if tracked.state.terminal:
                    return
            if tracked.gone is not None:
                raise tracked.gone
            if tracked.version == seen:
                await tracked.changed.wait()

    async def wait(self, *, answer_input: bool = True) -> TaskState | None:
        """Wait for the task to end and return its final state (no exception for failed/cancelled).

        With `answer_input`, questions are answered with the session's callbacks.
        """
        tracked = self._open()
        if tracked is None:
            return None
        while True:
            state = tracked.state
            if state.terminal:
                if (state.status == "completed" and state.result is None) or (
                    state.status == "failed" and state.error is None
                ):
                    await self.refresh()  # e.g. a CreateTaskResult that was already final: read the outcome
                return tracked.state
            if tracked.gone is not None:
                raise tracked.gone
            version = tracked.version
            if answer_input and state.status == "input_required":
                await self._respond_while_asked(tracked, state)
            if tracked.version == version:
                await tracked.changed.wait()

    async def _respond_while_asked(self, tracked: _Tracked, state: TaskState) -> None:
        """`respond`, given up as soon as the questions are gone (answered elsewhere, task ended or lost)."""
        asked = set(state.input_requests or {}) - self._answered

        async def watch(group: anyio.abc.TaskGroup) -> None:
            while True:
                await tracked.changed.wait()
                now = tracked.state
                if now.terminal or tracked.gone is not None or not asked & set(now.input_requests or {}):
                    group.cancel_scope.cancel()
                    return

        failure: Exception | None = None
        async with anyio.create_task_group() as group:
            group.start_soon(watch, group)
            try:
                await self.respond(state)
            except Exception as exc:  # noqa: BLE001 - re-raised below, outside the group (no ExceptionGroup)
                failure = exc
            group.cancel_scope.cancel()
        if failure is not None:
            raise failure

    async def result(self, *, answer_input: bool = True) -> CallToolResult:
        """The task's `CallToolResult` once it completes (bound it with `anyio.fail_after`).

        failed -> `MCPError` with the task's error; cancelled -> `TaskCancelled`.
        """
        if self._immediate is not None:
            return self._immediate
        state = await self.wait(answer_input=answer_input)
        assert state is not None
        if state.status == "completed":
            try:
                return state.call_tool_result()
            except ValidationError as exc:
                raise MCPError(INVALID_PARAMS, f"The completed task's result is not a CallToolResult: {exc}") from None
        if state.status == "failed":
            error = state.error_data()
            raise MCPError(error.code, error.message, error.data)
        raise TaskCancelled(state)

    async def respond(self, state: TaskState) -> None:
        """Answer the outstanding questions in `state` with the session's callbacks, then `tasks/update`.

        A question this client cannot answer (no callback for it, or the callback
        refused with an error) cancels the task and raises `InputNotAnswered`.
        """
        from mcp.client.session import ClientRequestContext

        pending = {k: v for k, v in (state.input_requests or {}).items() if k not in self._answered}
        if not pending:
            return
        responses: dict[str, Any] = {}
        refused: tuple[str, ErrorData] | None = None

        async def ask(key: str, raw: Any) -> None:
            nonlocal refused
            try:
                request = _INPUT_REQUEST.validate_python(raw, by_name=False)
            except ValidationError:
                refused = (
                    str(raw.get("method") if isinstance(raw, dict) else "?"),
                    ErrorData(code=INVALID_PARAMS, message="the server sent a malformed input request"),
                )
                return
            ctx = ClientRequestContext(session=self._session, request_id=key, meta=None)
            answer = await self._session.dispatch_input_request(ctx, request)
            if isinstance(answer, ErrorData):
                refused = (request.method, answer)
                group.cancel_scope.cancel()
                return
            responses[key] = answer.model_dump(by_alias=True, mode="json", exclude_none=True)

        async with anyio.create_task_group() as group:
            for key, raw in pending.items():
                group.start_soon(ask, key, raw)
        if refused is not None:
            method, error = refused
            await self._cancel_on_the_way_out()
            raise InputNotAnswered(
                error.code,
                f"The task asked for {method}, which this client did not answer ({error.message});"
                " the task was cancelled",
            )
        self._answered.update(pending)
        with anyio.CancelScope(shield=True):  # once asked and answered, the answers are delivered
            await self.answer(responses)

    async def answer(self, responses: Mapping[str, Any]) -> None:
        """Send answers (`tasks/update`), keyed as the task's `inputRequests` are."""
        tracked = self._require()
        plain = {
            k: v.model_dump(by_alias=True, mode="json", exclude_none=True) if isinstance(v, BaseModel) else v
            for k, v in responses.items()
        }
        request = UpdateTaskRequest(params=UpdateParams(task_id=tracked.state.task_id, input_responses=plain))
        await _send(self._session, request)

    async def cancel(self) -> None:
        """Ask the server to cancel the task (`tasks/cancel`); a finished task stays as it is."""
        tracked = self._require()
        await _send(self._session, CancelTaskRequest(params=TaskIdParams(task_id=tracked.state.task_id)))
        try:
            await self.refresh()
        except TaskNotFound:
            pass

    async def _cancel_on_the_way_out(self) -> None:
        """Shielded and bounded: the caller is leaving (cancelled, timed out, failed to answer)."""
        with anyio.CancelScope(shield=True):
            with anyio.move_on_after(self._tasks.cancel_timeout):
                try:
                    await self.cancel()
                except (MCPError, OSError) as exc:
                    logger.warning("could not cancel an abandoned task: %s", type(exc).__name__)

    def close(self) -> None:
        """Stop following the task (the server keeps it; `attach` again later)."""
        if self._closed or self._tracked is None:
            return
        self._closed = True
        self._tracked.refs -= 1
        if self._tracked.refs <= 0 and self._tracked.on_end is not None:
            self._tracked.on_end()  # nobody follows it any more: the follower may let it go

    def _open(self) -> _Tracked | None:
        if self._closed:
            raise RuntimeError("this TaskHandle is closed; attach() again to follow the task")
        return self._tracked

    def _require(self) -> _Tracked:
        if self._tracked is None:
            raise RuntimeError("this tool answered at once: there is no task to update or cancel")
        return self._tracked

    async def __aenter__(self) -> TaskHandle:
        return self

    async def __aexit__(self, *_: object) -> None:
        self.close()


class _Follower:
    """Keeps the followed tasks of one connection current: one listen stream, or polling."""

    def __init__(self, tasks: TasksClient, session: ClientSession) -> None:
        self._tasks = tasks
        self._session = session
        self._tracked: dict[str, _Tracked] = {}
        self._membership = anyio.Event()
        self._running = False
        self._listen_ok: bool | None = None if tasks.listen else False

    def track(self, state: TaskState) -> _Tracked:
        tracked = self._tracked.get(state.task_id)
        if tracked is None:
            tracked = self._tracked[state.task_id] = _Tracked(
                state=state, interval=self._first_interval(state), on_end=self._membership_changed
            )
            tracked.next_poll = anyio.current_time() + tracked.interval
            self._membership.set()
        else:
            tracked.offer(state)
        if not self._running and not tracked.state.terminal:
            self._running = True
            _sdk.task_group(self._session).start_soon(self._run)
        return tracked

    def _membership_changed(self) -> None:
        self._membership.set()

    def offer(self, state: TaskState) -> None:
        tracked = self._tracked.get(state.task_id)
        if tracked is not None and tracked.offer(state):
            tracked.interval = self._first_interval(tracked.state)

    def _first_interval(self, state: TaskState) -> float:
        suggested = (state.poll_interval_ms or 1000) / 1000
        return min(max(suggested, self._tasks.poll_floor_s), self._tasks.poll_ceiling_s)

    def _live(self) -> list[_Tracked]:
        """Tasks someone still follows; finished or abandoned ones are dropped."""
        for task_id, tracked in list(self._tracked.items()):
            if tracked.state.terminal or tracked.gone is not None or tracked.refs <= 0:
                del self._tracked[task_id]
        return list(self._tracked.values())

    async def _run(self) -> None:
        lost = MCPError(CONNECTION_CLOSED, "The connection closed while a task was being followed")
        try:
            while True:
                if not self._live():
                    return
                if self._listen_ok is not False and self._session.protocol_version in TASKS_VERSIONS:
                    await self._listen()
                else:
                    await self._poll()
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            pass  # the connection is gone: the finally below tells every waiter
        except Exception as exc:  # never take the client's connection down with us
            logger.exception("following tasks stopped")
            lost = MCPError(INTERNAL_ERROR, f"Following the task stopped: {type(exc).__name__}")
        finally:
            self._running = False
            for tracked in self._tracked.values():
                tracked.lose(lost)  # a no-op for finished tasks; nobody waits forever
            self._tracked.clear()

    async def _wait_membership(self, within_s: float) -> bool:
        """True when the set of followed tasks changed within `within_s`."""
        event = self._membership
        with anyio.move_on_after(within_s):
            await event.wait()
        if event.is_set():
            self._membership = anyio.Event()
            return True
        return False

    async def _listen(self) -> None:
        """Follow every live task on one stream; re-open (overlapping the old one) when tasks join.

        Falls back to polling (for good, on this connection) when the server refuses
        listen, does not follow tasks on it, leaves a live task out of its
        acknowledgment, or does not acknowledge within `_ACK_TIMEOUT_S` (a proxy
        that buffers the stream would deliver nothing either).
        """
        failures = 0
        current: AsyncExitStack | None = None
        covered: set[str] = set()
        watching: _sdk.TaskStream | None = None
        try:
            while True:
                live = self._live()
                if not live:
                    return
                ids = {tracked.state.task_id for tracked in live}
                if current is None or not ids <= covered:
                    await anyio.sleep(0.01)  # let a burst of new tasks join one stream
                    ids = {tracked.state.task_id for tracked in self._live()}
                    stack = AsyncExitStack()
                    try:
                        stream = await stack.enter_async_context(
                            _sdk.listen_tasks(self._session, sorted(ids), ack_timeout=_ACK_TIMEOUT_S)
                        )
                    except (MCPError, _sdk.ListenClosed, TimeoutError) as exc:
                        await stack.aclose()
                        if isinstance(exc, MCPError) and exc.code == CONNECTION_CLOSED:
                            raise anyio.ClosedResourceError from None
                        failures += 1
                        if (
                            isinstance(exc, TimeoutError)
                            or (isinstance(exc, MCPError) and failures >= 3)
                            or failures >= 6
                        ):
                            logger.warning("subscriptions/listen failed (%s); polling tasks instead", _brief(exc))
                            self._listen_ok = False
                            return
                        await self._poll_once(self._live())  # keep the states moving meanwhile
                        await anyio.sleep(min(0.2 * 2**failures, 5.0))
                        continue
                    if stream.task_ids is None:
                        await stack.aclose()
                        self._listen_ok = False  # the server does not follow tasks on listen
                        return
                    self._listen_ok = True
                    failures = 0
                    old, current = current, stack
                    if old is not None:
                        await old.aclose()
                    # Read each task not covered before once, now that changes are pushed.
                    fresh = [t for t in self._live() if t.state.task_id not in covered]
                    covered = set(stream.task_ids)
                    await self._poll_once(fresh)
                    if any(t.state.task_id in ids and t.state.task_id not in covered for t in self._live()):
                        logger.warning("the server left followed tasks out of its listen acknowledgment; polling")
                        self._listen_ok = False
                        return
                    watching = stream
                assert watching is not None
                changed = False
                ended = anyio.Event()
                async with anyio.create_task_group() as group:

                    async def closed(stream: _sdk.TaskStream = watching, done: anyio.Event = ended) -> None:
                        await stream.wait_closed()
                        done.set()
                        group.cancel_scope.cancel()

                    group.start_soon(closed)
                    changed = await self._wait_membership(_SAFETY_READ_S)
                    group.cancel_scope.cancel()
                if ended.is_set() or watching.ended:
                    if current is not None:
                        await current.aclose()
                    current, covered = None, set()
                    failures += 1
                    await anyio.sleep(min(0.1 * 2**failures, 5.0))
                elif not changed:
                    await self._poll_once(self._live())  # a slow safety read while nothing is heard
        finally:
            if current is not None:
                with anyio.CancelScope(shield=True):
                    await current.aclose()

    async def _poll(self) -> None:
        """Poll each live task when it is due; wake early when a task joins."""
        live = self._live()
        if not live:
            return
        now = anyio.current_time()
        due = [tracked for tracked in live if tracked.next_poll <= now]
        if due:
            await self._poll_once(due)
            return
        await self._wait_membership(max(0.0, min(t.next_poll for t in live) - now))

    async def _poll_once(self, tracked_list: list[_Tracked]) -> None:
        for tracked in tracked_list:
            if tracked.state.terminal or tracked.gone is not None:
                continue
            try:
                state = await _get(self._session, tracked.state.task_id)
            except TaskNotFound as gone:
                tracked.lose(gone)
                continue
            except MCPError as exc:
                if exc.code == CONNECTION_CLOSED:
                    tracked.lose(exc)
                    raise anyio.ClosedResourceError from None
                logger.warning("tasks/get failed (%s); trying again", _brief(exc))
                state = tracked.state
            if not tracked.offer(state):
                tracked.interval = min(tracked.interval * self._tasks.backoff, self._tasks.poll_ceiling_s)
            tracked.next_poll = anyio.current_time() + tracked.interval


async def _send(session: ClientSession, request: Any) -> None:
    try:
        await session.send_request(request, Ack)
    except MCPError as exc:
        raise _translate(exc) from None


async def _get(session: ClientSession, task_id: str) -> TaskState:
    try:
        return await session.send_request(GetTaskRequest(params=TaskIdParams(task_id=task_id)), TaskState)
    except MCPError as exc:
        raise _translate(exc) from None
    except ValidationError as exc:
        raise MCPError(INVALID_PARAMS, f"tasks/get returned a malformed task: {exc.error_count()} errors") from None


def _translate(exc: MCPError) -> MCPError:
    message = exc.message.lower()
    if exc.code == INVALID_PARAMS and ("not found" in message or "expired" in message):
        return TaskNotFound(exc.code, exc.message, exc.data)
    return exc


def _brief(exc: BaseException) -> str:
    if isinstance(exc, MCPError):
        return f"{exc.code} {exc.message}"[:200]
    return type(exc).__name__
