"""`subscriptions/listen` that honours the Tasks extension's `taskIds` (the SDK's stock handler drops them).

The core events of the SDK's subscription bus reach the stream as before. Per stream: validate (-32602,
-32021, before the stream opens), follow only the ids the caller owns (foreign and unknown alike dropped),
acknowledge, then on each hint re-read the row owner-scoped and send `notifications/tasks` when the
client-visible state moved on, until its terminal one. Streams of one owner share a re-read (`listen_reads`).
"""

from __future__ import annotations

import logging
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, Literal, Protocol, TypeVar

import anyio
import anyio.to_thread
from mcp.server.context import ServerRequestContext
from mcp.server.subscriptions import SubscriptionBus
from mcp.shared.exceptions import MCPError
from mcp.shared.subscriptions import SUBSCRIPTION_ID_META_KEY, ServerEvent, event_matches, event_to_notification
from mcp_types import (
    INTERNAL_ERROR,
    INVALID_REQUEST,
    SubscriptionFilter,
    SubscriptionsAcknowledgedNotification,
    SubscriptionsAcknowledgedNotificationParams,
    SubscriptionsListenRequestParams,
    SubscriptionsListenResult,
)
from pydantic import BaseModel

from celery_mcp_tasks.mcp.listen_reads import SharedRead, SharedReads, digest
from celery_mcp_tasks.mcp.principal import anonymous_caller, current_principal, token_expiry
from celery_mcp_tasks.mcp.wire import (
    declared_extension,
    invalid_params,
    missing_extension,
    store_unavailable,
    streams_quota_reached,
)
from celery_mcp_tasks.model import TaskRecord, task_key
from celery_mcp_tasks.notify.hub import Hub, Watch
from celery_mcp_tasks.protocol import render_task
from celery_mcp_tasks.service import TaskExpired, TaskService
from celery_mcp_tasks.store.base import StoreUnavailable, TaskNotFound

logger = logging.getLogger("celery_mcp_tasks.mcp")

T = TypeVar("T")

MAX_TASK_IDS = 1000
MAX_BUFFERED_EVENTS = 1024  # a stream's backlog of core events: a client that stopped reading is ended there
_RETRY_S = 1.0
_HELD = 8  # the most task states a stream reads ahead of sending them (a client that stops reading holds these)
TASK_IDS = "taskIds"


class TasksNotification(BaseModel):
    """`notifications/tasks`: the DetailedTask as `tasks/get` renders it (null `ttlMs` kept), plus `_meta`."""

    method: Literal["notifications/tasks"] = "notifications/tasks"
    params: dict[str, Any]


def requested_task_ids(requested: SubscriptionFilter) -> list[str] | None:
    """The `taskIds` filter field, de-duplicated in order; None when absent. -32602 when malformed."""
    ids = (requested.model_extra or {}).get(TASK_IDS)
    if ids is None:
        return None
    if not isinstance(ids, list) or not all(isinstance(item, str) for item in ids):
        raise invalid_params("taskIds must be an array of task id strings")
    if len(ids) > MAX_TASK_IDS:
        raise invalid_params(f"taskIds may name at most {MAX_TASK_IDS} tasks")
    return list(dict.fromkeys(ids))


def honored_core(requested: SubscriptionFilter) -> SubscriptionFilter:
    """Every core kind asked for, as the SDK's own handler honours them."""
    return SubscriptionFilter(
        tools_list_changed=True if requested.tools_list_changed else None,
        prompts_list_changed=True if requested.prompts_list_changed else None,
        resources_list_changed=True if requested.resources_list_changed else None,
        resource_subscriptions=list(requested.resource_subscriptions) if requested.resource_subscriptions else None,
    )


async def _send_task(ctx: Any, rendered: dict[str, Any], meta: dict[str, Any]) -> None:
    """`notifications/tasks` with a task's state as `tasks/get` renders it, on the listen request's stream."""
    await ctx.session.send_notification(
        TasksNotification(params={**rendered, "_meta": {**rendered.get("_meta", {}), **meta}}),
        related_request_id=ctx.request_id,
    )


@dataclass
class _Followed:
    """A followed task's last version and a digest of what was last sent: never the payload, so 10 000
    streams following large results do not hold 10 000 copies of them."""

    task_id: str
    version: int
    seen: bytes


class _Stream:
    def __init__(self, honored: SubscriptionFilter, watch: Watch, expires_at: float | None = None) -> None:
        self.honored = honored
        self.expires_at = expires_at  # the caller's token's expiry (epoch seconds): the stream ends then
        self.uris = frozenset(honored.resource_subscriptions or ())
        self.watch = watch
        self.events: deque[ServerEvent] | None = None  # made on the first core event (most streams get none)
        self.followed: dict[str, _Followed] = {}
        self.ending = False

    def deliver(self, event: ServerEvent) -> None:
        """Bus listener (sync, on the loop): queue a matching core event."""
        if self.ending or not event_matches(self.honored, self.uris, event):
            return
        if self.events is None:
            self.events = deque()
        if len(self.events) >= MAX_BUFFERED_EVENTS:
            logger.warning("listen stream backlog full; ending the stream")
            self.end()
            return
        self.events.append(event)
        self.watch.wake()

    def unfollow(self, key: str) -> None:
        self.followed.pop(key, None)
        self.watch.forget(key)

    def end(self) -> None:
        self.ending = True
        self.watch.wake()


class ListenObserver(Protocol):
    """Told of the streams' life (metrics): must be cheap, and may not fail a stream (a `Plugin` is one)."""

    def stream_opened(self) -> None: ...

    def stream_closed(self) -> None: ...

    def stream_notified(self, latency_s: float) -> None: ...  # sent `latency_s` after a hint woke the stream


class TaskListenHandler:
    """The `subscriptions/listen` handler for one server (`McpTasks.listen`).

    `max_streams` bounds the streams open in this process (one more is refused with -32603);
    `max_streams_per_caller` (`MCP_TASKS_QUOTA_STREAMS`) bounds one caller's (-32029), so one caller cannot
    take them all: a caller as the quotas count one (the principal; anonymous callers together, or each
    client address with `per_client`). Task hints never queue up: they coalesce per row.
    """

    def __init__(
        self,
        bus: SubscriptionBus,
        service: Callable[[], TaskService],
        hub: Callable[[], Hub | None],
        *,
        max_streams: int = 1024,
        max_streams_per_caller: int | None = None,
        per_client: bool = False,
        resync_interval_s: float = 30.0,
        max_threads: int = 16,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._bus = bus
        self._clock = clock
        self._service = service
        self._hub = hub
        self.max_streams = max_streams
        self.max_streams_per_caller = max_streams_per_caller
        self._per_client = per_client
        self._by_caller: Counter[tuple[str | None, str | None]] = Counter()  # open streams per caller
        self._resync_interval_s = resync_interval_s
        self._limiter = anyio.CapacityLimiter(max_threads)
        self._reads = SharedReads(self._in_thread)
        self._streams: set[_Stream] = set()
        self._closing = False
        self.observers: list[ListenObserver] = []  # the app's plugins with stream hooks

    def _tell(self, hear: Callable[[ListenObserver], None]) -> None:
        for observer in self.observers:
            try:
                hear(observer)
            except Exception:  # one observer that raises is logged and skipped
                logger.exception("listen observer raised")

    def _notified(self, latency_s: float) -> None:  # a method: a lambda in `_pump`'s loop would bind late
        self._tell(lambda observer: observer.stream_notified(latency_s))

    @property
    def open_streams(self) -> int:
        return len(self._streams)

    def reopen(self) -> None:
        """Accept streams again (a new serving run of the same app in this process)."""
        self._closing = False

    def close(self) -> None:
        """End every open stream gracefully: each sends its listen result and closes (server exit)."""
        self._closing = True
        for stream in list(self._streams):
            stream.end()

    async def __call__(
        self, ctx: ServerRequestContext[Any, Any], params: SubscriptionsListenRequestParams
    ) -> SubscriptionsListenResult:
        subscription_id = ctx.request_id
        if subscription_id is None:
            raise MCPError(INVALID_REQUEST, "subscriptions/listen requires a request id")
        task_ids = requested_task_ids(params.notifications)
        if task_ids is not None and not declared_extension(ctx):
            raise missing_extension()
        if len(self._streams) >= self.max_streams:
            raise MCPError(INTERNAL_ERROR, "Subscription limit reached")
        meta: dict[str, Any] = {SUBSCRIPTION_ID_META_KEY: subscription_id}
        owner = current_principal()
        caller = (owner, anonymous_caller(ctx.request) if owner is None and self._per_client else None)
        allowed = self.max_streams_per_caller
        if allowed is not None and self._by_caller[caller] >= allowed:
            raise streams_quota_reached(allowed)
        # With push off there is no hub: `taskIds` is then left out of the ack (not honoured).
        hub = self._hub() if task_ids is not None else None
        followed_ids = task_ids if hub is not None else None
        # Watch before reading, so a change between the read and the ack is not missed.
        watch = hub.watch(map(task_key, followed_ids or ())) if hub is not None else Watch()
        stream = _Stream(honored_core(params.notifications), watch, token_expiry())
        self._streams.add(stream)
        self._by_caller[caller] += 1
        unsubscribe: Callable[[], None] | None = None
        self._tell(lambda observer: observer.stream_opened())
        try:
            unsubscribe = self._bus.subscribe(stream.deliver)  # a custom bus that raises keeps no slot
            honored = stream.honored.model_dump(by_alias=True, exclude_none=True)
            current: list[dict[str, Any]] = []
            if followed_ids is not None:
                honored[TASK_IDS] = (
                    await self._follow_owned(stream, followed_ids, owner, current) if followed_ids else []
                )
            await ctx.session.send_notification(
                SubscriptionsAcknowledgedNotification(
                    params=SubscriptionsAcknowledgedNotificationParams(
                        notifications=SubscriptionFilter.model_validate(honored), _meta=meta
                    )
                ),
                related_request_id=subscription_id,
            )
            # Each followed task's state as it stands: a state reached before the listen (a question asked, the
            # task finished) would otherwise reach only a client that reads it after the ack.
            current.reverse()
            while current:  # each dropped once sent: the stream keeps no payload (`_Followed`)
                await _send_task(ctx, current.pop(), meta)
            await self._pump(ctx, stream, owner, meta)
        finally:
            stream.ending = True
            try:
                if unsubscribe is not None:
                    unsubscribe()
            except Exception:  # a custom bus must not keep the stream's slot
                logger.exception("subscription bus unsubscribe raised")
            watch.close()
            self._streams.discard(stream)
            self._by_caller[caller] -= 1
            if not self._by_caller[caller]:
                del self._by_caller[caller]
            self._tell(lambda observer: observer.stream_closed())
        return SubscriptionsListenResult(_meta=meta)

    # -- tasks -----------------------------------------------------------------------

    def _read(self, task_id: str, owner: str | None) -> TaskRecord | None:
        """A followed row as the stream sends it: its final state even past its TTL (a cancel committed just
        before the expiry is still the task's last word), None when it is gone or expired unfinished."""
        try:
            return self._service().get(task_id, owner, final_too=True)
        except (TaskNotFound, TaskExpired):
            return None

    async def _in_thread(self, fn: Callable[[], T]) -> T:
        return await anyio.to_thread.run_sync(fn, limiter=self._limiter)

    async def _follow_owned(
        self, stream: _Stream, task_ids: list[str], owner: str | None, current: list[dict[str, Any]]
    ) -> list[str]:
        """Follow the caller's own tasks among `task_ids`; the ones to acknowledge. The first `_HELD` ones' states
        as read go to `current` (a finished one's too, and then it is not followed), sent right after the ack;
        every further one is followed as not sent yet and offered to the pump, which reads and sends them
        `_HELD` at a time: a client that does not read holds that many states here, not a thousand results."""
        try:
            records = await self._in_thread(lambda: self._owned(task_ids, owner))
        except StoreUnavailable as exc:  # before the stream opens: an error with a fixed text, not the store's
            raise store_unavailable("subscriptions/listen", exc) from None
        acknowledged = []
        for task_id in task_ids:
            key = task_key(task_id)
            if task_id not in records:
                stream.watch.forget(key)  # unknown, foreign and expired look the same: simply not followed
                continue
            acknowledged.append(task_id)
            record = records[task_id]
            if record is None:
                stream.followed[key] = _Followed(task_id, -1, b"")  # its state is the pump's to read and send
                stream.watch.offer(key, None)
                continue
            rendered = render_task(task_id, record)
            current.append(rendered)
            if record.terminal:
                stream.watch.forget(key)  # acknowledged (it is the caller's), but nothing more will come
                continue
            stream.followed[key] = _Followed(task_id, record.version, digest(rendered))
        return acknowledged

    def _owned(self, task_ids: list[str], owner: str | None) -> dict[str, TaskRecord | None]:
        """The caller's unexpired tasks among `task_ids`: the first `_HELD` with their records, the rest as None.
        Read `_HELD` at a time, so the ack of a thousand finished tasks never holds more than a few results
        (one read of them all held every result at once: 4 GB for a thousand at the size limit)."""
        found: dict[str, TaskRecord | None] = {}
        for start in range(0, len(task_ids), _HELD):
            batch = task_ids[start : start + _HELD]
            records = self._service().get_many(batch, owner)
            for task_id in batch:
                if task_id in records:
                    found[task_id] = records[task_id] if len(found) < _HELD else None
        return found

    def _moved(self, due: dict[str, tuple[_Followed, int | None]]) -> list[str]:
        """The rows worth reading in full (in a worker thread): hints without a version (a resync) first ask
        every such row's version in one query, so only the rows that moved are read (a row not sent yet is)."""
        unknown = [key for key, (followed, hint) in due.items() if hint is None and followed.version >= 0]
        current = self._service().versions(unknown) if unknown else {}
        return [
            key
            for key, (followed, hint) in due.items()
            if not (hint is None and key in current and current[key] <= followed.version)
        ]

    def _read_many(self, task_ids: dict[str, str], owner: str | None) -> dict[str, TaskRecord | None]:
        """One owner-scoped read of these rows (by key: task id), in a worker thread."""
        found = self._service().get_many(task_ids.values(), owner, final_too=True)
        return {key: found.get(task_id) for key, task_id in task_ids.items()}

    async def _refresh(
        self,
        ctx: Any,
        stream: _Stream,
        hints: dict[str, int | None],
        owner: str | None,
        meta: dict[str, Any],
        woke: float | None = None,
    ) -> None:
        """Re-read the hinted rows the stream follows and send what the client has not seen.

        `woke`: when a hint woke the stream (monotonic), to time hint -> notification."""
        due: dict[str, tuple[_Followed, int | None]] = {}
        for key, hint in hints.items():
            followed = stream.followed.get(key)
            if followed is not None and (hint is None or hint > followed.version):
                due[key] = (followed, hint)
        if not due:
            return
        if len(due) == 1 and next(iter(due.values()))[1] is not None:
            # one hinted row (a change fanned out to every stream following it): share the read
            ((key, (followed, _)),) = due.items()
            task_id = followed.task_id
            read = await self._reads.read(key, owner, lambda: self._read(task_id, owner))
            await self._send_read(ctx, stream, due, {key: read}, meta, woke)
            return
        moved = await self._in_thread(partial(self._moved, due))
        for start in range(0, len(moved), _HELD):  # read as they go out: a slow client holds `_HELD` states
            if self._over(stream):
                return
            batch = {key: due[key][0].task_id for key in moved[start : start + _HELD]}
            records = await self._in_thread(partial(self._read_many, batch, owner))
            await self._send_read(ctx, stream, due, dict(records), meta, woke)

    async def _send_read(
        self,
        ctx: Any,
        stream: _Stream,
        due: dict[str, tuple[_Followed, int | None]],
        records: dict[str, SharedRead | TaskRecord | None],
        meta: dict[str, Any],
        woke: float | None,
    ) -> None:
        """Send each row read whose client-visible state moved on; unfollow the gone and the finished."""
        for key, got in records.items():
            followed = due[key][0]
            record = got.record if isinstance(got, SharedRead) else got
            if record is None:
                stream.unfollow(key)  # evicted, expired, or no longer the caller's
                continue
            if record.version <= followed.version:
                continue
            if isinstance(got, SharedRead):
                rendered, seen = got.rendered(followed.task_id)
            else:
                rendered = render_task(followed.task_id, record)
                seen = digest(rendered)
            if seen == followed.seen:
                followed.version = record.version
                continue  # a write clients cannot see (heartbeat, dispatch bookkeeping)
            await _send_task(ctx, rendered, meta)
            # Seen only once it went out: a send that fails leaves the row due, and the retry sends it.
            followed.version, followed.seen = record.version, seen
            if woke is not None:
                self._notified(time.monotonic() - woke)
            if record.terminal:
                stream.unfollow(key)

    # -- the stream ------------------------------------------------------------------

    def _expired(self, stream: _Stream) -> bool:
        return stream.expires_at is not None and self._clock() >= stream.expires_at

    def _over(self, stream: _Stream) -> bool:
        """The stream must stop: the client left, the server is closing, or the caller's token expired."""
        return stream.ending or self._closing or self._expired(stream)

    async def _pump(self, ctx: Any, stream: _Stream, owner: str | None, meta: dict[str, Any]) -> None:
        """Until the stream ends: at the server's exit, or when the caller's token expires (the client listens
        again with a fresh token, as a request's would be checked: a stream never outlives its credentials)."""
        while not self._over(stream):
            wait = self._resync_interval_s if stream.followed else None
            if stream.expires_at is not None:
                left = stream.expires_at - self._clock()
                wait = left if wait is None else min(wait, left)
            hints = await stream.watch.next(wait)
            if self._expired(stream):
                return
            woke = time.monotonic() if hints else None
            while stream.events:
                await ctx.session.send_notification(
                    event_to_notification(stream.events[0], meta), related_request_id=ctx.request_id
                )
                stream.events.popleft()  # dropped once it went out
            if stream.ending or self._closing:
                return
            if hints is None:
                hints = dict.fromkeys(stream.followed)  # the periodic safety re-read: hints can be lost
            if hints:
                try:
                    await self._refresh(ctx, stream, hints, owner, meta, woke)
                except Exception as exc:  # noqa: BLE001 - store or send failed: keep the stream, retry shortly
                    logger.warning(
                        "listen stream could not re-read or send its tasks (%s); retrying", type(exc).__name__
                    )
                    await anyio.sleep(_RETRY_S)
                    for key in hints:
                        stream.watch.offer(key, None)
