"""The console's values (rows, keyset pages, the overview, a task's detail) and the filters and cursors that ask for them.

Rows, never tasks: the store keeps only `key` = sha256(task id). An owner shows as its namespace and a short
hash of the whole owner string (its *tag*), never the raw subject; payloads only when the caller reveals them.
Pure values and parsing; the SQL that answers them is `store.browse`.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Final, NamedTuple

from celery_mcp_tasks.model import (
    ACTIVE_VALUES,
    ANONYMOUS,
    MAX_TOOL_NAME,
    OWNER_CLAIMS,
    TERMINAL_VALUES,
    TaskRecord,
    TaskStatus,
    celery_message_id,
    owner_namespace,
    spelled_namespace,
)
from celery_mcp_tasks.store.ledger import SweepRecord

SORTS: Final = ("-created", "created", "-updated", "updated")
DEFAULT_SORT: Final = "-created"
DEFAULT_LIMIT: Final = 50
MAX_LIMIT: Final = 500
OWNER_TAG_LEN: Final = 10
MAX_TEXT: Final = 200

STATUS_NAMES: Final = tuple(status.value for status in TaskStatus)
_STATUS_GROUPS: Final = {"active": frozenset(ACTIVE_VALUES), "final": frozenset(TERMINAL_VALUES)}
_HEX = re.compile(r"[0-9a-f]{4,64}")
MAX_OWNER = 1024
"""The longest owner filter taken: a namespace names an issuer, at most the store's 512-character owner (its
percent-encoded spelling may be longer), and a tag."""
_DURATION = re.compile(r"([0-9]{1,9})([smhd]?)")  # [0-9], not \d: no full-width digits
_UNITS: Final = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


class BadFilter(ValueError):
    """A filter, sort, page cursor or limit the console cannot use. `field` names the query parameter; the
    message says what it takes, never what was typed (an operator may paste a task id into any field)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


def owner_tag(owner: str | None) -> str | None:
    """A short hash of the whole owner string: tells owners apart without showing any of them."""
    if owner is None:
        return None
    return hashlib.sha256(owner.encode("utf-8", "surrogatepass")).hexdigest()[:OWNER_TAG_LEN]


def _label(namespace: str, tag: str | None) -> str:
    return namespace if tag is None else f"{namespace} {tag}"


def owner_label(owner: str | None) -> str:
    """How the console names an owner: its namespace and tag (`sub:<issuer> 0a1b2c3d4e`), or `anonymous`; an
    owner filter takes it as it is."""
    return _label(owner_namespace(owner), owner_tag(owner))


def _duration_s(name: str, value: str) -> int:
    """Seconds from `90`, `90s`, `15m`, `2h` or `7d`."""
    match = _DURATION.fullmatch(value.strip().lower())
    if match is None:
        raise BadFilter(name, "not a duration (seconds, or a number with s, m, h or d: 90, 15m, 2h, 7d)")
    return int(match.group(1)) * _UNITS[match.group(2)]


@dataclass(frozen=True)
class Filter:
    """Which rows to list. Every part optional; all given parts must hold.

    `owner`: `anonymous`, a namespace (`sub:<issuer>` / `client_id:<issuer>`), a tag (the short hash, or a prefix
    of 4 or more hex digits) or a label (`<namespace> <tag>`). Ages are seconds since creation. `text`: a
    case-insensitive substring of the status message.
    """

    statuses: frozenset[str] = frozenset()
    tool: str | None = None
    owner: str | None = None
    min_age_s: int | None = None
    max_age_s: int | None = None
    text: str | None = None

    @classmethod
    def parse(cls, query: Mapping[str, str]) -> Filter:
        """From query parameters (`status=working,failed&tool=...&owner=...&min_age=5m&max_age=1h&q=...`).

        Empty values count as absent; parameters other than the filter's (sort, cursor, ...) are ignored.
        Raises `BadFilter` naming the parameter.
        """

        def given(name: str) -> str | None:
            value = (query.get(name) or "").strip() or None
            if value is not None and "\x00" in value:  # PostgreSQL refuses it in any text: a 400, not a 503
                raise BadFilter(name, "a filter holds no NUL character")
            return value

        statuses: set[str] = set()
        if (raw := given("status")) is not None:
            for part in (p.strip().lower() for p in raw.split(",")):
                if not part:
                    continue
                if part in _STATUS_GROUPS:
                    statuses |= _STATUS_GROUPS[part]
                elif part in STATUS_NAMES:
                    statuses.add(part)
                else:
                    raise BadFilter("status", f"unknown status (one of {', '.join(STATUS_NAMES)}, active, final)")
        tool = given("tool")
        if tool is not None and len(tool) > MAX_TOOL_NAME:
            raise BadFilter("tool", f"a tool name has at most {MAX_TOOL_NAME} characters")
        owner = given("owner")
        if owner is not None and len(owner) > MAX_OWNER:
            raise BadFilter("owner", f"an owner filter has at most {MAX_OWNER} characters")
        if owner is not None:
            owner = cls._checked_owner(owner)
        min_age = None if (raw := given("min_age")) is None else _duration_s("min_age", raw)
        max_age = None if (raw := given("max_age")) is None else _duration_s("max_age", raw)
        if min_age is not None and max_age is not None and min_age > max_age:
            raise BadFilter("min_age", "min_age is larger than max_age: no task can match")
        text = given("q")
        if text is not None and len(text) > MAX_TEXT:
            raise BadFilter("q", f"the text to find has at most {MAX_TEXT} characters")
        return cls(frozenset(statuses), tool, owner, min_age, max_age, text)

    @staticmethod
    def _checked_owner(owner: str) -> str:
        if owner == ANONYMOUS:
            return owner
        namespace, _, tag = owner.partition(" ")
        if tag:
            if not namespace.startswith(OWNER_CLAIMS) or not _HEX.fullmatch(tag.strip()):
                raise BadFilter("owner", "a label is '<namespace> <tag>', e.g. 'sub:issuer 0a1b2c3d4e'")
            return f"{spelled_namespace(namespace)} {tag.strip()}"
        if namespace.startswith(OWNER_CLAIMS):
            return spelled_namespace(namespace)
        if _HEX.fullmatch(namespace):
            return namespace
        raise BadFilter(
            "owner", "an owner is 'anonymous', a namespace (sub:<issuer>, client_id:<issuer>) or a tag (hex digits)"
        )

    def owner_parts(self) -> tuple[str | None, str | None, bool]:
        """(namespace, tag prefix, anonymous) of the owner filter, for the store's query."""
        if self.owner is None:
            return None, None, False
        if self.owner == ANONYMOUS:
            return None, None, True
        namespace, _, tag = self.owner.partition(" ")
        if tag:
            return namespace, tag, False
        if namespace.startswith(OWNER_CLAIMS):
            return namespace, None, False
        return None, namespace, False

    def query(self) -> dict[str, str]:
        """Back to query parameters (for "next page" links and the CLI): `Filter.parse(f.query()) == f`."""
        values = {
            "status": ",".join(s for s in STATUS_NAMES if s in self.statuses) or None,
            "tool": self.tool,
            "owner": self.owner,
            "min_age": self.min_age_s,
            "max_age": self.max_age_s,
            "q": self.text,
        }
        return {name: str(value) for name, value in values.items() if value is not None}

    @property
    def empty(self) -> bool:
        return not self.query()


def parse_sort(value: str | None) -> str:
    sort = (value or "").strip() or DEFAULT_SORT
    if sort not in SORTS:
        raise BadFilter("sort", f"unknown sort (one of {', '.join(SORTS)})")
    return sort


def parse_limit(value: str | None) -> int:
    if value is None or not value.strip():
        return DEFAULT_LIMIT
    digits = value.strip()
    if not (digits.isascii() and digits.isdigit()):  # int() takes full-width digits and "1_0" too
        raise BadFilter("limit", "not a whole number")
    limit = int(digits)
    if not 1 <= limit <= MAX_LIMIT:
        raise BadFilter("limit", f"between 1 and {MAX_LIMIT}")
    return limit


@dataclass(frozen=True)
class Row:
    """One task as a list shows it. `key` is the full row key (URLs); `short` its first 12 characters."""

    key: str
    tool: str
    status: str
    status_message: str | None
    owner_namespace: str
    owner_tag: str | None
    created_at: int
    updated_at: int
    progress: float | None
    progress_total: float | None
    attempt: int
    resends: int
    dispatches: int
    heartbeat_at: int | None
    expires_at: int | None
    version: int

    @property
    def short(self) -> str:
        return self.key[:12]

    @property
    def owner_label(self) -> str:
        return _label(self.owner_namespace, self.owner_tag)

    @property
    def final(self) -> bool:
        return self.status in _STATUS_GROUPS["final"]

    @property
    def percent(self) -> float | None:
        """Progress in percent (0-100) when the job reported a total, else None."""
        if self.progress is None or not self.progress_total:
            return None
        return max(0.0, min(100.0, 100.0 * self.progress / self.progress_total))

    def as_json(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "row": self.short,
            "tool": self.tool,
            "status": self.status,
            "status_message": self.status_message,
            "owner": self.owner_label,
            "created_at": self.created_at,
            "updated_at": self.updated_at,
            "progress": self.progress,
            "progress_total": self.progress_total,
            "percent": self.percent,
            "attempt": self.attempt,
            "resends": self.resends,
            "dispatches": self.dispatches,
            "heartbeat_at": self.heartbeat_at,
            "expires_at": self.expires_at,
            "version": self.version,
        }


_COPIED: Final = tuple(f.name for f in fields(Row) if f.name not in ("owner_namespace", "owner_tag"))
ROW_COLUMNS: Final = ("owner", *_COPIED)
"""The columns a `Row` shows (never a payload): its own fields, the owner whole (shown as namespace and tag)."""


def row_from(values: Mapping[Any, Any]) -> Row:
    """The `Row` of a mapping of `ROW_COLUMNS` (a result row, or a record's fields)."""
    owner = values["owner"]
    return Row(
        owner_namespace=owner_namespace(owner), owner_tag=owner_tag(owner), **{name: values[name] for name in _COPIED}
    )


def row_of(record: TaskRecord) -> Row:
    return row_from({name: getattr(record, name) for name in ROW_COLUMNS} | {"status": record.status.value})


@dataclass(frozen=True)
class Page:
    rows: list[Row]
    next_cursor: str | None


def encode_cursor(sort: str, row: Row) -> str:
    """The opaque cursor for the page after `row` (the last row of a page) in `sort` order."""
    value = row.created_at if sort.endswith("created") else row.updated_at
    raw = json.dumps([sort, value, row.key], separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def decode_cursor(sort: str, cursor: str) -> tuple[int, str]:
    """(sort value, key) of a cursor made for `sort`; `BadFilter("cursor", ...)` for anything else."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        made_for, value, key = json.loads(raw)
    except (binascii.Error, ValueError, TypeError, RecursionError):  # RecursionError: JSON nested too deep
        raise BadFilter("cursor", "malformed page cursor (take it from a page's next_cursor)") from None
    if made_for != sort:
        made = f"the {made_for!r} order" if made_for in SORTS else "another order"
        raise BadFilter("cursor", f"this cursor pages {made}, not {sort!r}")
    # type(), not isinstance: a bool is no position
    if type(value) is not int or not -(2**63) <= value < 2**63 or not isinstance(key, str):
        raise BadFilter("cursor", "malformed page cursor (take it from a page's next_cursor)")
    if not re.fullmatch(r"[0-9a-f]{64}", key):
        raise BadFilter("cursor", "malformed page cursor (take it from a page's next_cursor)")
    return value, key


class MinuteCount(NamedTuple):
    """One minute of the last hour: tasks created, completed and failed in it."""

    minute_ms: int
    created: int
    completed: int
    failed: int


class OwnerCount(NamedTuple):
    """One owner's active tasks. `owner`: its label as a row shows it (namespace and tag, never the subject)."""

    owner: str
    working: int
    input_required: int

    @property
    def active(self) -> int:
        return self.working + self.input_required


TOP_OWNERS: Final = 20
"""How many owners the overview lists: those with the most active tasks."""


@dataclass(frozen=True)
class Overview:
    """The state of the store at `now_ms`, read without scanning it.

    `by_status` / `by_tool`: every active task, and the final ones that ended since `final_since_ms` (the chart's
    hour: counting every finished task kept for its TTL would read every row). `per_minute`: the last 60 minutes,
    oldest first, a final task counted at its `updated_at` (it is never written again). `by_owner`: the
    `TOP_OWNERS` owners with the most active tasks, most first; `owners_active`: how many owners have any.
    `last_sweep`: the janitor's ledger row.
    """

    now_ms: int
    final_since_ms: int
    by_status: dict[str, int]
    by_tool: dict[str, dict[str, int]]
    per_minute: list[MinuteCount]
    oldest_working: Row | None
    oldest_input_required: Row | None
    last_sweep: SweepRecord | None
    by_owner: list[OwnerCount]
    owners_active: int

    @property
    def lost_resent(self) -> int:
        return 0 if self.last_sweep is None else int(self.last_sweep.report.get("resent", 0))

    @property
    def lost_failed(self) -> int:
        return 0 if self.last_sweep is None else int(self.last_sweep.report.get("failed", 0))


@dataclass(frozen=True)
class Question:
    """An input request the task made: its key, and whether it is answered, outstanding or was dropped.
    `message`: the question's own text while it is outstanding, never the answer."""

    key: str
    state: str  # "answered" | "outstanding" | "dropped"
    method: str | None = None
    message: str | None = None


@dataclass(frozen=True)
class ErrorView:
    message: str
    code: int | None = None


@dataclass(frozen=True)
class TaskDetail:
    """Everything the task page shows. The payload fields are None unless `revealed`."""

    row: Row
    ttl_ms: int | None
    poll_interval_ms: int | None
    started_at: int | None
    parked: bool
    questions: list[Question]
    error: ErrorView | None
    trace_id: str | None
    celery_message_id: str | None
    queue: str | None
    revealed: bool = False
    arguments: dict[str, Any] | None = None
    result: dict[str, Any] | None = None
    answers: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> str:
        return self.row.key

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            **self.row.as_json(),
            "ttl_ms": self.ttl_ms,
            "poll_interval_ms": self.poll_interval_ms,
            "started_at": self.started_at,
            "parked": self.parked,
            "questions": [asdict(question) for question in self.questions],
            "error": None if self.error is None else asdict(self.error),
            "trace_id": self.trace_id,
            "celery_message_id": self.celery_message_id,
            "queue": self.queue,
            "revealed": self.revealed,
        }
        if self.revealed:
            out.update(arguments=self.arguments, result=self.result, answers=self.answers)
        return out


_TRACEPARENT = re.compile(r"[0-9a-f]{2}-([0-9a-f]{32})-[0-9a-f]{16}-[0-9a-f]{2}")


def trace_id_of(trace_context: str | None) -> str | None:
    """The trace id of a W3C `traceparent`, or None (absent, malformed, or the all-zero id)."""
    if not trace_context:
        return None
    match = _TRACEPARENT.match(trace_context.strip().lower())
    if match is None or set(match.group(1)) == {"0"}:
        return None
    return match.group(1)


def _question(key: str, record: TaskRecord) -> Question:
    if key in record.input_responses:
        return Question(key, "answered")
    request = record.input_requests.get(key)
    if request is None:
        return Question(key, "dropped")
    request = request if isinstance(request, dict) else {}
    method, params = request.get("method"), request.get("params")
    message = params.get("message") if isinstance(params, dict) else None
    return Question(key, "outstanding", *(text if isinstance(text, str) else None for text in (method, message)))


def _error(error: dict[str, Any] | None) -> ErrorView | None:
    if error is None:
        return None
    code = error.get("code")
    return ErrorView(str(error.get("message", "Failed")), code if isinstance(code, int) else None)


def detail_of(record: TaskRecord, *, queue: str | None, reveal: bool = False) -> TaskDetail:
    """The task page's view of `record`; payloads only with `reveal` (the caller checks it may)."""
    keys = list(dict.fromkeys([*record.issued_keys, *record.input_requests, *record.input_responses]))
    return TaskDetail(
        row=row_of(record),
        ttl_ms=record.ttl_ms,
        poll_interval_ms=record.poll_interval_ms,
        started_at=record.started_at,
        parked=record.parked,
        questions=[_question(key, record) for key in keys],
        error=_error(record.error),
        trace_id=trace_id_of(record.trace_context),
        celery_message_id=celery_message_id(record) if record.dispatches else None,
        queue=queue,
        revealed=reveal,
        arguments=dict(record.arguments) if reveal else None,
        result=None if not reveal or record.result is None else dict(record.result),
        answers=dict(record.input_responses) if reveal else None,
    )
