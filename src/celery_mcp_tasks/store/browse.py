"""The console's reads (`SqlStore.browse`, `overview`, `rows`, ...), answered in `store.rows`' values.

Every list is a keyset page on an index (migration 0006): `(created_at, key)`, `(updated_at, key)`, and
`(status|tool|owner, created_at, key)`, so the thousandth page costs what the first does at a million rows.
Payloads are never read. An owner tag (a hash SQLite cannot compute) is resolved by a loose index scan of
the distinct owners, hashed here.
"""

from __future__ import annotations

import string
from collections.abc import Iterable
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from celery_mcp_tasks.model import ACTIVE_VALUES, TERMINAL_VALUES, TaskStatus
from celery_mcp_tasks.model import now_ms as clock_ms
from celery_mcp_tasks.store.rows import (
    ROW_COLUMNS,
    TOP_OWNERS,
    BadFilter,
    Filter,
    MinuteCount,
    Overview,
    OwnerCount,
    Page,
    Row,
    decode_cursor,
    encode_cursor,
    owner_label,
    owner_tag,
    row_from,
)
from celery_mcp_tasks.store.schema import UNFINISHED, tasks
from celery_mcp_tasks.store.sweeps import JANITOR, read_sweep

MINUTE_MS = 60_000
HOUR_MINUTES = 60
_BATCH = 500  # stays under SQLite's bound-parameter limit on old builds
_MAX_OWNERS = 10_000  # distinct owners a tag is looked for among

_COLUMNS = tuple(tasks.c[name] for name in ROW_COLUMNS)


def _rows(conn: Connection, *where: Any, order_by: Any = (), limit: int | None = None) -> list[Row]:
    query = sa.select(*_COLUMNS).where(*where).order_by(*order_by).limit(limit)
    return [row_from(values) for values in conn.execute(query).mappings()]


def _exactly_starts(column: Any, prefix: Any) -> sa.ColumnElement[bool]:
    """`column` starts with `prefix`, letter case included: SQLite's LIKE ignores the case of A-Z (PostgreSQL's
    does not), so beside a LIKE (which an index can serve) this keeps `sub:https://IDP.example`'s owners out of
    `sub:https://idp.example`."""
    starts: sa.ColumnElement[bool] = sa.func.substr(column, 1, sa.func.length(prefix)) == prefix
    return starts


_ASCII_LOWER = str.maketrans(string.ascii_uppercase, string.ascii_lowercase)


def _ascii_lower(text: str) -> str:
    """`text` with A-Z lowered and nothing else: the text filter ignores the case of ASCII letters only, on every
    store (a `C` or SQLite `lower()` leaves "Ä" as it is, an ICU one would not)."""
    return text.translate(_ASCII_LOWER)


def _distinct_owners() -> Any:
    """A loose index scan: one probe of the owner index per distinct owner, not a scan of every row; at most
    `cap` probes, from the namespace's prefix (`low`) on. Its owners are not always consecutive in the index:
    where the collation ignores punctuation (glibc's en_US), "sub:ab" sorts after "subaa:x"; and no upper bound
    is the same in every collation (in a C database ';' follows ':', in an en_US one it comes before)."""
    first = sa.select(sa.func.min(tasks.c.owner).label("owner"), sa.literal(1, sa.Integer).label("n"))
    walk = first.where(tasks.c.owner >= sa.bindparam("low")).cte("o", recursive=True)
    later = tasks.alias("t")
    following = sa.select(sa.func.min(later.c.owner)).where(later.c.owner > walk.c.owner).scalar_subquery()
    walk = walk.union_all(
        sa.select(following, walk.c.n + 1).where(walk.c.owner.is_not(None), walk.c.n <= sa.bindparam("cap"))
    )
    return sa.select(walk.c.owner, walk.c.n).where(
        sa.or_(
            walk.c.owner.like(sa.bindparam("within"), escape="/"),
            sa.and_(walk.c.n > sa.bindparam("cap"), walk.c.owner.is_not(None)),
        )
    )


_DISTINCT_OWNERS = _distinct_owners()
_OWNERS_WITHIN = (
    sa.select(tasks.c.owner)
    .distinct()
    .where(
        tasks.c.owner.like(sa.bindparam("within"), escape="/"),
        _exactly_starts(tasks.c.owner, sa.bindparam("low", type_=sa.String)),
    )
    .limit(sa.bindparam("limit"))
)
"""A namespace's owners, when the walk above stopped before its end: up to `:limit` of them, wherever they sort."""


def _owners_tagged(conn: Connection, namespace: str | None, tag: str) -> list[str]:
    """The owners (within `namespace`, when given) whose tag starts with `tag`: looked for among the first
    `_MAX_OWNERS` distinct owners from the namespace's prefix on, or, when the walk stopped before the end,
    among the namespace's own owners; `BadFilter` when there are more than `_MAX_OWNERS` of those (an answer
    from some of them only could leave out the very owner asked for)."""
    low = namespace + ":" if namespace else ""
    within = low.replace("/", "//").replace("%", "/%").replace("_", "/_") + "%"
    found = conn.execute(_DISTINCT_OWNERS, {"low": low, "within": within, "cap": _MAX_OWNERS}).all()
    owners = [owner for owner, n in found if n <= _MAX_OWNERS]
    if len(owners) < len(found):  # the walk stopped early; past it, other namespaces' owners may be what it counted
        owners = list(conn.execute(_OWNERS_WITHIN, {"within": within, "low": low, "limit": _MAX_OWNERS + 1}).scalars())
        if len(owners) > _MAX_OWNERS:
            instead = (
                "filter by the namespace alone" if namespace else "give the owner's namespace too: `<namespace> <hash>`"
            )
            raise BadFilter(
                "owner", f"a short hash is looked up among at most {_MAX_OWNERS:,} owners, there are more; {instead}"
            )
    return [owner for owner in owners if owner.startswith(low) and (owner_tag(owner) or "").startswith(tag)]


def _where(conn: Connection, filter: Filter, now_ms: int, *, tags: bool = True) -> list[sa.ColumnElement[bool]] | None:
    """The filter as SQL conditions (for a page and for `rows`); None when it can match nothing (an unknown tag).
    Without `tags`, an owner tag is left for the caller to check on the rows (only its namespace is SQL)."""
    where: list[sa.ColumnElement[bool]] = []
    if filter.statuses:
        statuses = sorted(filter.statuses)
        where.append(tasks.c.status == statuses[0] if len(statuses) == 1 else tasks.c.status.in_(statuses))
    if filter.tool is not None:
        where.append(tasks.c.tool == filter.tool)
    namespace, tag, anonymous = filter.owner_parts()
    if anonymous:
        where.append(tasks.c.owner.is_(None))
    elif tag is not None and tags:
        owners = _owners_tagged(conn, namespace, tag)
        if not owners:
            return None
        where.append(tasks.c.owner == owners[0] if len(owners) == 1 else tasks.c.owner.in_(owners))
    elif namespace is not None:
        prefix = namespace + ":"
        where += [tasks.c.owner.startswith(prefix, autoescape=True), _exactly_starts(tasks.c.owner, prefix)]
    if filter.min_age_s is not None:
        where.append(tasks.c.created_at <= now_ms - filter.min_age_s * 1000)
    if filter.max_age_s is not None:
        where.append(tasks.c.created_at >= now_ms - filter.max_age_s * 1000)
    if filter.text is not None:
        message: sa.ColumnElement[Any] = tasks.c.status_message
        if conn.dialect.name == "postgresql":  # lower() in "C" changes A-Z only, as SQLite's does, in any database
            message = message.collate("C")
        where.append(sa.func.lower(message).contains(_ascii_lower(filter.text), autoescape=True))
    return where


def browse(conn: Connection, filter: Filter, sort: str, cursor: str | None, limit: int, *, now_ms: int) -> Page:
    column = tasks.c.created_at if sort.endswith("created") else tasks.c.updated_at
    descending = sort.startswith("-")
    after = None if cursor is None else decode_cursor(sort, cursor)  # BadFilter before any SQL
    where = _where(conn, filter, now_ms)
    if where is None:
        return Page([], None)
    if after is not None:
        position = sa.tuple_(column, tasks.c.key)
        bound = sa.tuple_(sa.literal(after[0], sa.BigInteger), sa.literal(after[1]))
        where.append(position < bound if descending else position > bound)
    order = (column.desc(), tasks.c.key.desc()) if descending else (column.asc(), tasks.c.key.asc())
    found = _rows(conn, *where, order_by=order, limit=limit + 1)
    more = len(found) > limit
    page = found[:limit]
    return Page(page, encode_cursor(sort, page[-1]) if more and page else None)


def rows(
    conn: Connection, keys: Iterable[str], filter: Filter | None = None, *, now_ms: int | None = None
) -> list[Row]:
    """The rows of `keys` that `filter` lists. An owner tag is checked on the rows found: resolving it lists the
    distinct owners, a cost a page pays once but live.js would pay for every changed row it asks about."""
    wanted = list(dict.fromkeys(keys))
    where = [] if filter is None else _where(conn, filter, clock_ms() if now_ms is None else now_ms, tags=False)
    if where is None:
        return []
    found: list[Row] = []
    for start in range(0, len(wanted), _BATCH):
        found.extend(_rows(conn, tasks.c.key.in_(wanted[start : start + _BATCH]), *where))
    tag = None if filter is None else filter.owner_parts()[1]
    return found if tag is None else [row for row in found if (row.owner_tag or "").startswith(tag)]


def keys_starting(conn: Connection, prefix: str, *, limit: int) -> list[str]:
    """Row keys starting with `prefix` (lowercase hex), in order, at most `limit`: a range of the primary key."""
    query = (
        sa.select(tasks.c.key)
        .where(tasks.c.key >= prefix, tasks.c.key < prefix + "g")  # "g" follows every hex digit
        .order_by(tasks.c.key)
        .limit(limit)
    )
    return list(conn.execute(query).scalars().all())


def changed_since(conn: Connection, updated_at_ms: int, *, limit: int) -> list[Row]:
    order = (tasks.c.updated_at.asc(), tasks.c.key.asc())
    return _rows(conn, tasks.c.updated_at >= updated_at_ms, order_by=order, limit=limit)


def _oldest(conn: Connection, status: TaskStatus) -> Row | None:
    order = (tasks.c.created_at.asc(), tasks.c.key.asc())
    return next(iter(_rows(conn, tasks.c.status == status.value, order_by=order, limit=1)), None)


def overview(conn: Connection, now_ms: int) -> Overview:
    """Never a scan of the whole table: active rows are counted whole (few, on the status index), final
    ones only where they ended in the chart's hour (on the `(status, updated_at)` index), and the
    per-minute chart reads the hour's slice of the `created_at` and `(status, updated_at)` indexes."""
    by_status = {status.value: 0 for status in TaskStatus}
    by_tool: dict[str, dict[str, int]] = {}

    def count(tool: object, status: object, n: int) -> None:  # `status` is one the query asked for: a known one
        by_status[str(status)] += n
        by_tool.setdefault(str(tool), dict.fromkeys(by_status, 0))[str(status)] += n

    query = (
        sa.select(tasks.c.tool, tasks.c.status, sa.func.count())
        .where(tasks.c.status.in_(ACTIVE_VALUES))
        .group_by(tasks.c.tool, tasks.c.status)
    )
    for tool, status, n in conn.execute(query).all():
        count(tool, status, int(n))
    by_owner: dict[str, dict[str, int]] = {}
    query = (  # active as the quotas count it: on the partial (owner, caller) index of unfinished rows
        sa.select(tasks.c.owner, tasks.c.status, sa.func.count())
        .where(UNFINISHED)
        .group_by(tasks.c.owner, tasks.c.status)
    )
    for owner, status, n in conn.execute(query).all():
        by_owner.setdefault(owner, dict.fromkeys(ACTIVE_VALUES, 0))[str(status)] = int(n)
    owners = sorted(
        (OwnerCount(owner_label(owner), n["working"], n["input_required"]) for owner, n in by_owner.items()),
        key=lambda counted: (-counted.active, counted.owner),
    )

    # The last hour in whole minutes, the current (partial) minute last.
    first = (now_ms // MINUTE_MS - (HOUR_MINUTES - 1)) * MINUTE_MS
    created = [0] * HOUR_MINUTES
    minute = ((tasks.c.created_at - first) // MINUTE_MS).label("minute")
    query = sa.select(minute, sa.func.count()).where(tasks.c.created_at >= first).group_by(minute)
    for index, n in conn.execute(query).all():
        if 0 <= int(index) < HOUR_MINUTES:
            created[int(index)] = int(n)
    # A final task is never written again: its `updated_at` is when it ended.
    ended = {status: [0] * HOUR_MINUTES for status in TERMINAL_VALUES}
    minute = ((tasks.c.updated_at - first) // MINUTE_MS).label("minute")
    query = (
        sa.select(tasks.c.tool, tasks.c.status, minute, sa.func.count())
        .where(tasks.c.status.in_(list(ended)))
        .where(tasks.c.updated_at >= first)
        .group_by(tasks.c.tool, tasks.c.status, minute)
    )
    for tool, status, index, n in conn.execute(query).all():
        if 0 <= int(index) < HOUR_MINUTES:
            ended[str(status)][int(index)] += int(n)
            count(tool, status, int(n))
    per_minute = [
        MinuteCount(first + i * MINUTE_MS, created[i], ended["completed"][i], ended["failed"][i])
        for i in range(HOUR_MINUTES)
    ]
    return Overview(
        now_ms=now_ms,
        final_since_ms=first,
        by_status=by_status,
        by_tool=dict(sorted(by_tool.items())),
        per_minute=per_minute,
        oldest_working=_oldest(conn, TaskStatus.WORKING),
        oldest_input_required=_oldest(conn, TaskStatus.INPUT_REQUIRED),
        last_sweep=read_sweep(conn, JANITOR),
        by_owner=owners[:TOP_OWNERS],
        owners_active=len(owners),
    )
