"""Keeping followed tasks current: one state per task (`Tracked`) and, per connection, one
`subscriptions/listen` stream naming every followed task, or polling (`Follower`).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Protocol

import anyio
from mcp.shared.exceptions import MCPError
from mcp_types import CONNECTION_CLOSED, INTERNAL_ERROR, METHOD_NOT_FOUND

from celery_mcp_tasks import protocol, sdk_internals
from celery_mcp_tasks.client import calls
from celery_mcp_tasks.client.calls import TASKS_VERSIONS, TaskNotFound
from celery_mcp_tasks.client.models import TaskState

if TYPE_CHECKING:
    from mcp.client.session import ClientSession


logger = logging.getLogger("celery_mcp_tasks.client")


class Pacing(Protocol):
    """The options of `TasksClient` that following and a handle read (live)."""

    poll_floor_s: float
    poll_ceiling_s: float
    backoff: float
    cancel_timeout: float
    listen: bool


_ACK_TIMEOUT_S = 5.0  # the acknowledgment is the stream's first frame: it comes at once or not at all
_STOP_TIMEOUT_S = 5.0  # ending the stream is local; a read in flight is abandoned the same way
_SAFETY_READ_S = 30.0  # with push on, each followed task is still read this often (a lost notification heals)
_RELISTEN_S = 30.0  # listen kept failing (a restart, a proxy's 503 meanwhile): poll this long, then listen again


def outcome_missing(state: TaskState) -> bool:
    """A final state that lacks what it ended with: a completed one without `result`, a failed one without `error`."""
    return (state.status == "completed" and state.result is None) or (state.status == "failed" and state.error is None)


@dataclass
class Tracked:
    """One followed task: its latest state, a version, and an event fired on each change."""

    state: TaskState
    version: int = 0
    changed: anyio.Event = field(default_factory=anyio.Event)
    gone: MCPError | None = None
    refs: int = 0
    next_poll: float = 0.0
    interval: float = 0.0
    answered: set[str] = field(default_factory=set)  # input keys whose answers were delivered (any handle)
    asking: dict[str, anyio.Event] = field(default_factory=dict)  # input keys a handle is asking now: set once done
    on_end: Callable[[], None] | None = None  # the follower's wake-up: one task fewer to follow
    settle: Callable[[], Awaitable[None]] | None = None  # the follower's `settle`

    def offer(self, state: TaskState) -> bool:
        """Take a newer state (never leave a terminal one, never go back in time, but a final state always
        wins); fire and answer True only when it differs in what a follower sees (`TaskState.seen_as`).

        A terminal state without its outcome (a creation answered with a task already final: a repeat of an
        idempotent call) takes the same status with the outcome once, from `tasks/get`."""
        current = self.state
        if state.task_id != current.task_id:
            return False
        if current.terminal and not (
            state.status == current.status and outcome_missing(current) and not outcome_missing(state)
        ):
            return False
        if not state.terminal and moment(state.last_updated_at) < moment(current.last_updated_at):
            return False  # notifications may arrive out of wire order
        if state == current:
            return False
        self.state = state
        if state.seen_as() == current.seen_as():
            return False
        self._fire()
        return True

    def lose(self, error: MCPError) -> None:
        if self.gone is None and not self.state.terminal:
            self.gone = error
            self._fire()

    def wake(self) -> None:
        """Wake whoever waits for a change, with none (a handle closed: its waiters look and leave)."""
        event, self.changed = self.changed, anyio.Event()
        event.set()

    def _fire(self) -> None:
        self.version += 1
        self.wake()
        if (self.state.terminal or self.gone is not None) and self.on_end is not None:
            self.on_end()


def moment(stamp: str) -> tuple[int, float | str]:
    """A timestamp to order states by: parsed (servers differ in precision and offsets), else the text."""
    try:
        parsed = datetime.fromisoformat(stamp)
    except ValueError:
        return (1, stamp)
    return (0, (parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)).timestamp())


class Follower:
    """Keeps the followed tasks of one connection current: one listen stream, or polling."""

    def __init__(self, tasks: Pacing, session: ClientSession) -> None:
        self._tasks = tasks
        self._session = session
        self._tracked: dict[str, Tracked] = {}
        self._membership = anyio.Event()
        self._run_scope: anyio.CancelScope | None = None  # set while following runs (in the session's background)
        self._news = anyio.Event()  # fired when following ends (stream closed, no read in flight) or a task joins
        self._may_listen = tasks.listen  # False for good once the server showed listen does not carry tasks
        self._listen_again_at = 0.0  # while listen keeps failing for a while: poll until then

    def track(self, state: TaskState) -> Tracked:
        tracked = self._tracked.get(state.task_id)
        if tracked is None:
            tracked = self._tracked[state.task_id] = Tracked(
                state=state, interval=self._first_interval(state), on_end=self._membership_changed, settle=self.settle
            )
            tracked.next_poll = anyio.current_time() + tracked.interval
            self._membership.set()
            self._announce()
        else:
            tracked.offer(state)
        if self._run_scope is None and not tracked.state.terminal:
            self._run_scope = anyio.CancelScope()
            sdk_internals.task_group(self._session).start_soon(self._run)
        return tracked

    async def settle(self) -> None:
        """When no task is followed any more, wait until following (in the session's background) has ended,
        so the `Client` may close next: a notification arriving on a stream the closing session no longer
        reads is logged by the SDK with a traceback. Returns at once while other tasks are followed."""
        with anyio.CancelScope(shield=True), anyio.move_on_after(_STOP_TIMEOUT_S):
            while self._run_scope is not None and not self._live():
                await self._news.wait()

    async def stop(self) -> None:
        """Stop following every task on this connection now, and wait until no stream or read is left."""
        if self._run_scope is not None:
            self._run_scope.cancel()
        with anyio.CancelScope(shield=True), anyio.move_on_after(_STOP_TIMEOUT_S):
            while self._run_scope is not None:
                await self._news.wait()

    def _announce(self) -> None:
        event, self._news = self._news, anyio.Event()
        event.set()

    def _membership_changed(self) -> None:
        self._membership.set()

    def offer(self, state: TaskState) -> None:
        tracked = self._tracked.get(state.task_id)
        if tracked is not None and tracked.offer(state):
            tracked.interval = self._first_interval(tracked.state)

    def _first_interval(self, state: TaskState) -> float:
        suggested = (state.poll_interval_ms or 1000) / 1000
        return min(max(suggested, self._tasks.poll_floor_s), self._tasks.poll_ceiling_s)

    def _live(self) -> list[Tracked]:
        """Tasks someone still follows; finished or abandoned ones are dropped."""
        for task_id, tracked in list(self._tracked.items()):
            if tracked.state.terminal or tracked.gone is not None or tracked.refs <= 0:
                del self._tracked[task_id]
        return list(self._tracked.values())

    async def _run(self) -> None:
        lost = MCPError(CONNECTION_CLOSED, "The connection closed while a task was being followed")
        scope = self._run_scope
        assert scope is not None
        try:
            with scope:
                while True:
                    if not self._live():
                        return
                    listening = self._may_listen and anyio.current_time() >= self._listen_again_at
                    if listening and self._session.protocol_version in TASKS_VERSIONS:
                        await self._listen()
                    else:
                        await self._poll()
            if scope.cancelled_caught:
                lost = MCPError(CONNECTION_CLOSED, "Following stopped: the client is leaving this connection")
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            pass  # the connection is gone: the finally below tells every waiter
        except Exception as exc:  # never take the client's connection down with us
            logger.exception("following tasks stopped")
            lost = MCPError(INTERNAL_ERROR, f"Following the task stopped: {type(exc).__name__}")
        finally:
            self._run_scope = None
            for tracked in self._tracked.values():
                tracked.lose(lost)  # a no-op for finished tasks; nobody waits forever
            self._tracked.clear()
            self._announce()

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

        Falls back to polling for good when the server has no listen (method not found), does not follow tasks
        on it, leaves a live task out of its acknowledgment, or does not acknowledge within `_ACK_TIMEOUT_S` (a
        proxy that buffers the stream would deliver nothing either); for `_RELISTEN_S` when it keeps failing
        otherwise (a restart, a proxy answering 503 meanwhile), then listens again.
        """
        failures = 0
        current: AsyncExitStack | None = None
        covered: set[str] = set()
        watching: sdk_internals.TaskStream | None = None
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
                            sdk_internals.listen_tasks(self._session, sorted(ids), ack_timeout=_ACK_TIMEOUT_S)
                        )
                    except (MCPError, sdk_internals.ListenClosed, TimeoutError) as exc:
                        await stack.aclose()
                        if isinstance(exc, MCPError) and exc.code == CONNECTION_CLOSED:
                            raise anyio.ClosedResourceError from None
                        if isinstance(exc, MCPError) and exc.code == protocol.QUOTA_EXCEEDED and current is not None:
                            # The caller's stream quota counts this connection's open stream too: give it back,
                            # then ask for one stream with every task (refused again, as any refusal: retried
                            # twice, the server may not have seen the old stream end yet, then polled a while).
                            await current.aclose()
                            current, covered = None, set()
                            continue
                        failures += 1
                        if isinstance(exc, TimeoutError) or (
                            isinstance(exc, MCPError) and exc.code == METHOD_NOT_FOUND
                        ):
                            logger.warning("subscriptions/listen failed (%s); polling tasks instead", calls.brief(exc))
                            self._may_listen = False
                            return
                        if (isinstance(exc, MCPError) and failures >= 3) or failures >= 6:
                            logger.warning(
                                "subscriptions/listen failed (%s); polling tasks, listening again in %gs",
                                calls.brief(exc),
                                _RELISTEN_S,
                            )
                            self._listen_again_at = anyio.current_time() + _RELISTEN_S
                            return
                        await self._poll_once(self._live())  # keep the states moving meanwhile
                        await anyio.sleep(min(0.2 * 2**failures, 5.0))
                        continue
                    if stream.task_ids is None:
                        await stack.aclose()
                        self._may_listen = False  # the server does not follow tasks on listen
                        return
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
                        self._may_listen = False
                        return
                    watching = stream
                assert watching is not None
                changed = False
                ended = anyio.Event()
                async with anyio.create_task_group() as group:

                    async def closed(stream: sdk_internals.TaskStream = watching, done: anyio.Event = ended) -> None:
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

    async def _poll_once(self, tracked_list: list[Tracked]) -> None:
        for tracked in tracked_list:
            if tracked.state.terminal or tracked.gone is not None:
                continue
            try:
                state = await calls.get_task(self._session, tracked.state.task_id)
            except TaskNotFound as gone:
                tracked.lose(gone)
                continue
            except MCPError as exc:
                if exc.code == CONNECTION_CLOSED:
                    tracked.lose(exc)
                    raise anyio.ClosedResourceError from None
                logger.warning("tasks/get failed (%s); trying again", calls.brief(exc))
                state = tracked.state
            if not tracked.offer(state):
                tracked.interval = min(tracked.interval * self._tasks.backoff, self._tasks.poll_ceiling_s)
            tracked.next_poll = anyio.current_time() + tracked.interval
