"""`Console`: the reads, audited actions and live updates that the console's pages and JSON API share.

It names rows by their store key, never by task id (the store has none). Live updates: one every-key hub
watch, drained each ~100 ms tick and read in one query for every open page; new rows (a creation sends no
hint) and, under the polling transport, every change are found by an indexed read of rows written since.
"""

from __future__ import annotations

import functools
import json
import logging
import re
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, TypeVar

import anyio
import anyio.to_thread

from celery_mcp_tasks.model import TaskRecord, now_ms, stale_cutoff
from celery_mcp_tasks.notify.hub import Hub, Watch
from celery_mcp_tasks.service import NotLost, TaskService
from celery_mcp_tasks.store.base import TaskNotFound
from celery_mcp_tasks.store.rows import (
    DEFAULT_SORT,
    STATUS_NAMES,
    BadFilter,
    Filter,
    Overview,
    Page,
    Row,
    TaskDetail,
    detail_of,
    parse_limit,
    parse_sort,
    row_of,
)

AUDIT_LOGGER: Final = "celery_mcp_tasks.console.audit"
audit_log = logging.getLogger(AUDIT_LOGGER)
logger = logging.getLogger(__name__)

TICK_S: Final = 0.1
_KNOWN_VERSIONS: Final = 20_000  # rows whose last fanned-out version is remembered (dedupes hints and polls)
_POLL_BATCH: Final = 500
_POLL_MARGIN_MS: Final = 1_000  # a write committed a little after its `updated_at` was taken is still found
MIN_PREFIX: Final = 8  # hex digits of a row key prefix (lists show 12)
KEY = re.compile(r"[0-9a-f]{64}")
_KEY_OR_PREFIX = re.compile(rf"[0-9a-f]{{{MIN_PREFIX},64}}")
ACTIONS: Final = ("cancel", "resend", "delete", "reveal")
DONE: Final = {"cancel": "The task is cancelled", "resend": "The job is sent again", "delete": "The task is deleted"}
_GONE: Final = "no such task (it may have expired or been deleted)"
_HIDDEN: Final = "payloads are hidden: MCP_TASKS_CONSOLE_PAYLOADS is off"
_T = TypeVar("_T")


class ConsoleError(Exception):
    """An action or read the console refuses; nothing changed. `status`: the HTTP status to answer."""

    status, outcome = 400, "refused"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class NotFound(ConsoleError):
    """No such row (never existed, evicted, or deleted)."""

    status, outcome = 404, "not_found"


class Ambiguous(ConsoleError):
    """A row key prefix that more than one row's key starts with."""

    outcome = "ambiguous"


class Conflict(ConsoleError):
    """The task changed meanwhile (e.g. a cancel that lost the race to `completed`)."""

    status, outcome = 409, "conflict"


class Refused(ConsoleError):
    """The action does not apply to this task (a re-send of a job not judged lost, terminate not allowed)."""

    status, outcome = 409, "refused"


class PayloadsHidden(ConsoleError):
    """Payloads are off (MCP_TASKS_CONSOLE_PAYLOADS): no reveal."""

    status, outcome = 403, "forbidden"


@dataclass(frozen=True)
class ActionResult:
    """A done action: what it did and the row as it is now (None once deleted)."""

    action: str
    key: str
    outcome: str  # "cancelled", "resent", "deleted"
    message: str
    row: Row | None

    def as_json(self) -> dict[str, object]:
        row = None if self.row is None else self.row.as_json()
        return {"action": self.action, "key": self.key, "outcome": self.outcome, "message": self.message, "row": row}


@dataclass(frozen=True)
class Change:
    """One live update: a row as it is now (None: gone), put to every open page: its JSON is encoded once."""

    key: str
    row: Row | None

    @property
    def status(self) -> str | None:
        return None if self.row is None else self.row.status

    @functools.cached_property
    def data(self) -> str:
        """The change as an SSE `data:` line carries it."""
        gone = {"key": self.key, "row": self.key[:12], "status": None, "version": None, "deleted": True}
        return json.dumps(gone if self.row is None else self.row.as_json(), separators=(",", ":"))


@dataclass(frozen=True)
class ListQuery:
    """A task list's query (the list page's, the API's): as parsed, and as typed (for the page's form)."""

    form: dict[str, Any]
    filter: Filter
    sort: str
    cursor: str | None
    limit: int


def flat_query(items: Iterable[tuple[str, str]]) -> dict[str, str]:
    """Query parameters as one string each: repeated `status` (the page's checkboxes) joined as a,b; any other
    parameter given twice is `BadFilter` naming it (which of the two was meant cannot be told)."""
    flat: dict[str, str] = {}
    statuses: list[str] = []
    for name, value in items:
        if name == "status":
            statuses.extend(part for part in value.split(",") if part.strip())
        elif name in flat:
            raise BadFilter(name, f"{name} is given more than once")
        else:
            flat[name] = value
    if statuses:
        flat["status"] = ",".join(statuses)
    return flat


def form_of(flat: Mapping[str, str]) -> dict[str, Any]:
    return {
        "status": [s.strip() for s in flat.get("status", "").split(",") if s.strip()],
        **{name: flat.get(name, "") for name in ("tool", "owner", "min_age", "max_age", "q")},
        "sort": flat.get("sort", "") or DEFAULT_SORT,
    }


def parse_list_query(flat: Mapping[str, str]) -> ListQuery:
    """Raises `BadFilter` naming the parameter."""
    filter = Filter.parse(flat)
    sort = parse_sort(flat.get("sort"))
    limit = parse_limit(flat.get("limit"))
    cursor = (flat.get("cursor") or "").strip() or None
    form = form_of(flat)
    form["status"] = [s for s in STATUS_NAMES if s in filter.statuses]  # groups (active, final) spelled out
    return ListQuery(form, filter, sort, cursor, limit)


def _operator(name: str | None) -> str:
    """The operator's name for an audit line: one token, printable, bounded."""
    cleaned = re.sub(r"[^\w.@+-]", "_", (name or "").strip())[:64]
    return cleaned or "unknown"


def _row(key: str) -> str:
    """The row an audit line names: a row key's first 12 digits, or "invalid" for anything else (a task id
    pasted in a key's place must not reach the log, nor a line break forge a line)."""
    key = key.strip().lower()
    return key[:12] if _KEY_OR_PREFIX.fullmatch(key) else "invalid"


def audit(operator: str | None, action: str, key: str, outcome: str) -> None:
    audit_log.info("operator=%s action=%s row=%s outcome=%s", _operator(operator), action, _row(key), outcome)


def audit_refused(operator: str | None, action: str, client: str) -> None:
    """A wrong operator token (never the token): a WARNING, for whoever watches for a guess at it."""
    audit_log.warning(
        "operator=%s action=%s outcome=refused (wrong operator token) client=%s", _operator(operator), action, client
    )


@dataclass(eq=False)  # hashed by identity: one per open page
class _Subscriber:
    pending: dict[str, Change] = field(default_factory=dict)
    event: anyio.Event = field(default_factory=anyio.Event)

    def put(self, change: Change) -> None:
        self.pending[change.key] = change  # a burst for one row coalesces into its latest state
        self.event.set()


class Console:
    """The operators' view of one deployment's store.

    `queue_of(record)`: the Celery queue the task's job goes to (its routing or fair-queue shard, else the default);
    `terminable(tool)`: whether a cancel may terminate its running job. `stale_timeout_s`: a `working` task
    whose heartbeat is older is judged lost (and may be re-sent). `poll_s`: how often rows written since the
    last look are read for live updates (every tick under the polling transport, whose hints cover only
    watched keys; ~1 s otherwise, for new rows). `quota_active`: how many active tasks one caller may have
    (`MCP_TASKS_QUOTA_ACTIVE`), shown beside each owner's count.
    """

    def __init__(
        self,
        service: TaskService | Callable[[], TaskService],
        *,
        hub: Hub | None,
        queue_of: Callable[[TaskRecord], str | None],
        terminable: Callable[[str], bool],
        stale_timeout_s: float,
        payloads_allowed: bool = False,
        tools: Callable[[], list[str]] | None = None,
        poll_s: float = 1.0,
        quota_active: int | None = None,
        clock: Callable[[], int] = now_ms,
    ) -> None:
        self._service = service
        self.hub = hub
        self.queue_of = queue_of
        self.terminable = terminable
        self.stale_timeout_s = stale_timeout_s
        self.payloads_allowed = payloads_allowed
        self._tools = tools
        self.poll_s = poll_s
        self.quota_active = quota_active
        self.clock = clock
        self._subscribers: set[_Subscriber] = set()
        self._has_subscribers = anyio.Event()
        self._known: OrderedDict[str, int] = OrderedDict()
        self._mark: int | None = None
        self._signed_out_here: dict[str, int] = {}  # session -> when its cookie expires (epoch s)
        self.reads = 0  # store reads made for live updates (the benchmark and tests look)
        self.serving = False  # whether `console.app.serving` runs the live-update loop (a lifespan)

    @property
    def service(self) -> TaskService:
        """This process's service (`service` may be a callable: the app's, which is rebuilt after a fork)."""
        return self._service if isinstance(self._service, TaskService) else self._service()

    @property
    def tools(self) -> list[str]:
        """The tools this deployment serves (for the list page's filter), sorted."""
        return sorted(self._tools()) if self._tools is not None else []

    # -- reads ----------------------------------------------------------------------------

    async def page(self, query: ListQuery) -> Page:
        """A keyset page. Raises `BadFilter` (a malformed cursor included)."""
        return await anyio.to_thread.run_sync(
            lambda: self.service.browse(query.filter, query.sort, query.cursor, query.limit, now_ms=self.clock())
        )

    async def matching_row(self, key: str, filter: Filter) -> Row | None:
        """The row of `key` if it exists and belongs in a list filtered by `filter` (the store's one
        definition of the filter rules decides), else None."""
        found = await anyio.to_thread.run_sync(lambda: self.service.rows([key], filter, now_ms=self.clock()))
        return found[0] if found else None

    async def overview(self) -> Overview:
        return await anyio.to_thread.run_sync(lambda: self.service.overview(self.clock()))

    async def _record(self, key: str) -> TaskRecord:
        """The row of `key`: its 64 hex digits, or a prefix of them (at least 8, as lists show 12) that
        only one row's key starts with."""
        key = key.strip().lower()
        if not _KEY_OR_PREFIX.fullmatch(key):
            raise NotFound(f"no task has this row key (a row key is 64 hex digits, or its first {MIN_PREFIX} or more)")
        if not KEY.fullmatch(key):
            found = await anyio.to_thread.run_sync(lambda: self.service.keys_starting(key, limit=2))
            if len(found) > 1:
                raise Ambiguous(f"several rows' keys start with {key}: give more of the key's digits")
            if not found:
                raise NotFound(_GONE)
            key = found[0]
        record = await anyio.to_thread.run_sync(lambda: self.service.record(key))
        if record is None:
            raise NotFound(_GONE)
        return record

    async def detail(self, key: str) -> TaskDetail:
        """The task page's view, without payloads."""
        record = await self._record(key)
        return detail_of(record, queue=self.queue_of(record))

    # -- actions --------------------------------------------------------------------------

    async def sign_out(self, session: str, expires_s: int) -> None:
        """Refuse the console session `session` in every console process until it expires (epoch s)."""
        await anyio.to_thread.run_sync(lambda: self.service.sign_out(session, expires_s * 1000))
        now_s = self.clock() // 1000
        kept = {sid: until for sid, until in self._signed_out_here.items() if until > now_s}
        self._signed_out_here = {**kept, session: expires_s}

    def signed_out_here(self, session: str) -> bool:
        """Whether `session` was signed out by this process (no store read: a live stream asks at every change)."""
        return session in self._signed_out_here

    async def signed_out(self, session: str) -> bool:
        return await anyio.to_thread.run_sync(lambda: self.service.signed_out(session))

    async def act(
        self, action: str, key: str, operator: str | None, terminate: bool = False
    ) -> ActionResult | TaskDetail:
        """`action` (cancel, resend, delete or reveal) as the pages and the API name it."""
        if action == "reveal":
            return await self.reveal(key, operator)
        if action == "cancel":
            return await self.cancel(key, operator, terminate)
        if action == "resend":
            return await self.resend(key, operator)
        if action == "delete":
            return await self.delete(key, operator)
        raise ValueError(f"unknown console action {action!r}")

    async def _audited(
        self, action: str, key: str, operator: str | None, act: Callable[[TaskRecord], Awaitable[tuple[str, _T]]]
    ) -> _T:
        """`act` on the row of `key`, one audit line either way (its outcome, or the refusal's)."""
        try:
            record = await self._record(key)
            key = record.key
            try:
                outcome, done = await act(record)
            except TaskNotFound:
                raise NotFound(_GONE) from None
        except ConsoleError as exc:
            audit(operator, action, key, exc.outcome)
            raise
        audit(operator, action, key, outcome)
        return done

    async def reveal(self, key: str, operator: str | None) -> TaskDetail:
        """The detail with arguments, result and answers, audited (refused unless payloads are allowed)."""
        if not self.payloads_allowed:
            audit(operator, "reveal", key, "forbidden")
            raise PayloadsHidden(_HIDDEN)

        async def act(record: TaskRecord) -> tuple[str, TaskDetail]:
            return "revealed", detail_of(record, queue=self.queue_of(record), reveal=True)

        return await self._audited("reveal", key, operator, act)

    async def cancel(self, key: str, operator: str | None, terminate: bool = False) -> ActionResult:
        """Cancel an active task; with `terminate`, also stop its running job (only where its tool allows)."""

        async def act(record: TaskRecord) -> tuple[str, TaskRecord]:
            if record.terminal:  # first: a final task's answer is that, whatever was asked of its job
                raise Conflict(f"the task is already {record.status.value}; nothing changed")
            if terminate and not self.terminable(record.tool):
                raise Refused(f"tool {record.tool!r} does not allow terminate; cancel without it")
            message = f"Cancelled by an operator ({_operator(operator)})"
            record, changed = await anyio.to_thread.run_sync(
                lambda: self.service.cancel_by_key(record.key, message, terminate=terminate)
            )
            if not changed:
                raise Conflict(f"the task became {record.status.value} first; nothing changed")
            return ("cancelled+terminate" if terminate else "cancelled"), record

        record = await self._audited("cancel", key, operator, act)
        return self._done("cancel", "cancelled", record)

    async def resend(self, key: str, operator: str | None) -> ActionResult:
        """Send the job of a `working` task judged lost (no heartbeat for the stale timeout) again."""

        async def act(record: TaskRecord) -> tuple[str, TaskRecord]:
            stale_before_ms = stale_cutoff(self.clock(), self.stale_timeout_s)
            message = f"Re-sent by an operator ({_operator(operator)})"
            try:
                return "resent", await anyio.to_thread.run_sync(
                    lambda: self.service.resend(record.key, stale_before_ms=stale_before_ms, message=message)
                )
            except NotLost as exc:
                raise Refused(str(exc)) from None

        record = await self._audited("resend", key, operator, act)
        return self._done("resend", "resent", record)

    async def delete(self, key: str, operator: str | None) -> ActionResult:
        """Delete a final task's row (an active one is refused: cancel it first)."""

        async def act(record: TaskRecord) -> tuple[str, str]:
            if not record.terminal:
                raise Refused(
                    f"the task is {record.status.value}: only a finished task can be deleted; cancel it first"
                )
            await anyio.to_thread.run_sync(lambda: self.service.delete(record.key))
            return "deleted", record.key

        key = await self._audited("delete", key, operator, act)
        self._fan_out([Change(key, None)])
        return ActionResult("delete", key, "deleted", DONE["delete"], None)

    def _done(self, action: str, outcome: str, record: TaskRecord) -> ActionResult:
        """A cancel's or re-send's result; this process's own action, so its pages hear of it now."""
        row = row_of(record)
        self._fan_out_news([row])
        return ActionResult(action, record.key, outcome, DONE[action], row)

    # -- live updates -----------------------------------------------------------------------

    async def events(self, idle_s: float | None = None) -> AsyncIterator[Change | None]:
        """Every change to any row, as it happens (bursts for one row coalesced); `None` after
        `idle_s` seconds without one (a keep-alive for the caller), when given."""
        subscriber = _Subscriber()
        self._subscribers.add(subscriber)
        self._has_subscribers.set()
        try:
            while True:
                if not subscriber.event.is_set():
                    with anyio.move_on_after(idle_s):
                        await subscriber.event.wait()
                if not subscriber.event.is_set():
                    yield None
                    continue
                subscriber.event = anyio.Event()
                taken, subscriber.pending = subscriber.pending, {}
                for change in taken.values():
                    yield change
        finally:
            self._subscribers.discard(subscriber)
            if not self._subscribers:
                self._has_subscribers = anyio.Event()

    @property
    def subscriber_count(self) -> int:
        return len(self._subscribers)

    def _remember(self, row: Row) -> bool:
        """Whether `row` is news (a version not fanned out yet); remembers it."""
        known = self._known.get(row.key)
        if known is not None and known >= row.version:
            return False
        self._known[row.key] = row.version
        self._known.move_to_end(row.key)
        while len(self._known) > _KNOWN_VERSIONS:
            self._known.popitem(last=False)
        return True

    def _fan_out(self, changes: list[Change]) -> None:
        for subscriber in list(self._subscribers):
            for change in changes:
                subscriber.put(change)

    def _fan_out_news(self, rows: list[Row]) -> None:
        self._fan_out([Change(row.key, row) for row in rows if self._remember(row)])

    async def run(self) -> None:
        """The fan-out loop (the console app's lifespan runs it): one hub watch while a page looks, one read per tick.

        The watch is open only while some page subscribes: with it closed, the process's transport
        need not listen for this console (PostgreSQL's LISTEN stops once nothing follows a task).
        """
        watch: Watch | None = None
        last_poll = 0.0
        try:
            while True:
                if not self._subscribers:
                    self._mark = None  # nobody looks: nothing to catch up on later
                    if watch is not None:
                        watch.close()  # nor any hint to hear
                        watch = None
                    await self._has_subscribers.wait()
                    continue
                if watch is None and self.hub is not None:
                    watch = self.hub.watch_every()
                await anyio.sleep(TICK_S)
                hinted: list[str] = []
                resynced = False
                if watch is not None:
                    taken = await watch.next(0)
                    hinted = [k for k, v in (taken or {}).items() if v is None or v > self._known.get(k, 0)]
                    resynced, watch.resynced = watch.resynced, False
                now = anyio.current_time()
                poll = resynced or now - last_poll >= self.poll_s
                if poll:
                    last_poll = now
                if hinted or poll:
                    try:
                        rows = await anyio.to_thread.run_sync(self._read, hinted, poll)
                    except Exception as exc:  # noqa: BLE001 - a store outage: pages catch up on the next tick
                        logger.warning("console live update read failed (%s); retrying", type(exc).__name__)
                        continue
                    self._fan_out_news(rows)
        finally:
            if watch is not None:
                watch.close()

    def _read(self, hinted: list[str], poll: bool) -> list[Row]:
        rows: dict[str, Row] = {}
        if hinted:
            self.reads += 1
            for row in self.service.rows(hinted):
                rows[row.key] = row
        if poll:
            now = self.clock()
            since = now if self._mark is None else self._mark - _POLL_MARGIN_MS
            self.reads += 1
            found = self.service.changed_since(since, limit=_POLL_BATCH)
            for row in found:
                if row.key not in rows or rows[row.key].version < row.version:
                    rows[row.key] = row
            if self._mark is None:
                self._mark = now
            else:  # after a full batch, go on from its last row (the margin re-reads some, deduped)
                full = len(found) == _POLL_BATCH
                self._mark = max(self._mark, found[-1].updated_at + _POLL_MARGIN_MS if full else now)
        return list(rows.values())
