"""`SqlStore`: the `Store` on SQLAlchemy Core, for SQLite and PostgreSQL alike.

Every transition is a compare-and-swap: `UPDATE ... WHERE key AND version` setting only the columns it
changed; no row means another writer won, and the transition is recomputed from the fresh row.

A write costs what it must. A creation is one statement in autocommit: the INSERT, or, when `quotas.RowGauge`
says so (once a second, or near the row cap), the capped `INSERT ... SELECT ... WHERE <room>`. An update told
the record its caller last saw (`expected`) is one conditional UPDATE in autocommit; only when that misses does
it take the locking path (BEGIN, `SELECT ... FOR UPDATE`, UPDATE, COMMIT; SQLite serializes with `BEGIN
IMMEDIATE`). The change hint (`pg_notify`) and a non-durable write's `synchronous_commit` off ride in the
writing statement's RETURNING, so they take effect at that write's commit and never for a write that missed.

A dropped connection is retried once, but never past a write whose outcome is unknown (a COMMIT, or an
autocommit statement, lost in flight): `create` and `update` then read what the row became, so nothing is
applied twice. Every failure leaves as `StoreUnavailable`, whose text names nothing of SQL.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import fields, replace
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from celery_mcp_tasks.model import (
    TERMINAL_VALUES,
    OwnerScope,
    TaskRecord,
    TaskStatus,
    UnreadableTask,
    failure,
    owner_scope,
)
from celery_mcp_tasks.store import browse, quotas
from celery_mcp_tasks.store.base import (
    ANY,
    ChangeHint,
    Eviction,
    Owner,
    Quota,
    StoreConflict,
    TaskLimitReached,
    TaskNotFound,
    Transition,
    apply,
)
from celery_mcp_tasks.store.codec import KeyRing, UnreadablePayload, open_columns, same_json, seal_columns
from celery_mcp_tasks.store.engine import create_store_engine, is_postgres, read, upsert, write
from celery_mcp_tasks.store.failures import _CommitInDoubt, _in_doubt, _operation, _reconnecting, _reported
from celery_mcp_tasks.store.rows import Filter, Overview, Page, Row
from celery_mcp_tasks.store.schema import signouts, tasks
from celery_mcp_tasks.store.sweeps import SweepLedger, count_by_status, evict, read_sweep, unanswered

logger = logging.getLogger(__name__)
_SIGNOUT_KEPT_MS = 3_600_000
"""How long a sign-out is kept after its cookie expired (`sign_out`): more than console hosts' clocks differ."""

_MAX_CAS_ATTEMPTS = 64
_BATCH = 500  # keys bound in one statement: SQLite before 3.32 binds at most 999 parameters
_V = TypeVar("_V")
_COLUMNS = [f.name for f in fields(TaskRecord)]
_SET = tuple(name for name in _COLUMNS if name != "key")
_UNREADABLE_SAID: set[tuple[str, str]] = set()


def _changes(before: TaskRecord, after: TaskRecord) -> dict[str, Any]:
    """The columns `after` changes (the version always; `expires_at` when its inputs move), as `_to_row` writes
    them: all an UPDATE needs to set. Compared field by field, only the changed ones converted."""
    changes = {name: getattr(after, name) for name in _SET if getattr(after, name) != getattr(before, name)}
    if "status" in changes:
        changes["status"] = after.status.value
    if "issued_keys" in changes:
        changes["issued_keys"] = list(after.issued_keys)
    if after.expires_at != before.expires_at:
        changes["expires_at"] = after.expires_at
    return changes


def _holds(found: TaskRecord, changes: Mapping[str, Any]) -> bool:
    """`found` holds what an UPDATE setting `changes` wrote (its heartbeat aside: a touch moves it freely)."""
    row = _to_row(found)
    return all(same_json(row[name], value) for name, value in changes.items() if name != "heartbeat_at")


class _Landed(Exception):
    """A write settled as not applied turned out to land after all: its record, never a second application."""

    def __init__(self, record: TaskRecord) -> None:
        super().__init__("the write in doubt landed")
        self.record = record


def _unless_landed(transition: Transition, doubt: _CommitInDoubt) -> Transition:
    """`transition`, unless the row already holds the write that was in doubt (then `_Landed`)."""
    after, changes = doubt.after, doubt.changes
    assert after is not None

    def step(record: TaskRecord) -> TaskRecord:
        if record.version == after.version and _holds(record, changes):
            raise _Landed(_with_heartbeat(after, record.heartbeat_at))
        return transition(record)

    return step


def _rows_counted(based: bool) -> Any:
    """The row cap's count, no further than the room the base leaves (`quotas.RowBase`): the rows created since
    the base (`based`, an index range on `created_at`), or every row (no base: the smallest index, walked whole;
    a `created_at` bound below every row would make PostgreSQL read the table instead)."""
    since = (tasks.c.created_at > sa.bindparam("rows_since", type_=sa.BigInteger),) if based else ()
    return quotas.bounded_count("rows_room", *since)


def _hinted(statement: Any, returning: tuple[Any, ...], hinted: bool, *, durable: bool = True) -> Any:
    """`statement RETURNING returning`, plus `pg_notify(...)` when `hinted` and `set_config('synchronous_commit',
    'off', true)` when not `durable`: RETURNING runs once per row written and for no other, so the hint goes out
    exactly when a row was written, at its commit, and only a write that happened skips the WAL flush."""
    folded: list[Any] = []
    if hinted:
        folded.append(sa.func.pg_notify(sa.bindparam("hint_channel"), sa.bindparam("hint_payload")))
    if not durable:
        folded.append(sa.func.set_config("synchronous_commit", "off", sa.true()))
    return statement.returning(*returning, *folded)


@functools.cache
def _insert_statement(capped: bool, counted: bool, hinted: bool, durable: bool, based: bool = False) -> Any:
    """A creation's one statement: RETURNING key, so a row back means inserted; `counted`, the rows it saw too.

    Capped: `INSERT ... SELECT :values WHERE (the row cap's count) < :rows_room`, and when `counted` that count
    again in its RETURNING (`quotas.RowGauge`: the rows before it on PostgreSQL, the statement's snapshot, with
    it on SQLite). RETURNING key, not rowcount: psycopg reports -1 for INSERT ... SELECT."""
    if not capped:
        return _hinted(tasks.insert(), (tasks.c.key,), hinted, durable=durable)
    room = _rows_counted(based) < sa.bindparam("rows_room")
    values = sa.select(*(sa.bindparam(c.name, type_=c.type).label(c.name) for c in tasks.columns)).where(room)
    insert = tasks.insert().from_select([c.name for c in tasks.columns], values)
    returning = (tasks.c.key, _rows_counted(based).label("rows_seen")) if counted else (tasks.c.key,)
    return _hinted(insert, returning, hinted, durable=durable)


@functools.cache
def _update_statement(columns: tuple[str, ...], owner: OwnerScope, hinted: bool, forward: bool, durable: bool) -> Any:
    """`UPDATE ... SET <columns> WHERE key AND version AND created_at [AND owner] RETURNING heartbeat_at`.

    `forward`: the heartbeat only grows. `durable`: see `_hinted`."""
    values: dict[str, Any] = {}
    for name in columns:
        value = sa.bindparam(f"new_{name}", type_=tasks.c[name].type)
        values[name] = _later(value) if forward and name == "heartbeat_at" else value
    query = tasks.update().where(
        tasks.c.key == sa.bindparam("cas_key"),
        tasks.c.version == sa.bindparam("cas_version"),
        tasks.c.created_at == sa.bindparam("cas_created"),  # that task's version, not a later task's under the key
        *_owner_clause(owner, "cas_owner"),
    )
    return _hinted(query.values(values), (tasks.c.heartbeat_at,), hinted, durable=durable)


@functools.cache
def _select_statement(owner: OwnerScope, for_update: bool = False, many: bool = False) -> Any:
    """`SELECT * WHERE key [AND owner] [FOR UPDATE]`. FOR UPDATE (PostgreSQL) waits for a concurrent writer, so
    the CAS after it almost never loses (else a fast writer can starve a slow one); SQLite's BEGIN IMMEDIATE
    serializes already. `many`: `key IN` the list bound as `keys`."""
    key = tasks.c.key.in_(sa.bindparam("keys", expanding=True)) if many else tasks.c.key == sa.bindparam("key")
    query = sa.select(tasks).where(key, *_owner_clause(owner, "owner"))
    return query.with_for_update() if for_update else query


def _batched(
    engine: Engine, keys: list[str], select: Callable[[Connection, list[str]], dict[str, _V]]
) -> dict[str, _V]:
    """`select(conn, batch)` over `keys` in batches of `_BATCH`, in one read: SQLite before 3.32 binds at most
    999 parameters in a statement."""
    if not keys:
        return {}

    def every(conn: Connection) -> dict[str, _V]:
        found: dict[str, _V] = {}
        for start in range(0, len(keys), _BATCH):
            found.update(select(conn, keys[start : start + _BATCH]))
        return found

    return read(engine, every)


def _to_row(record: TaskRecord) -> dict[str, Any]:
    row = {name: getattr(record, name) for name in _COLUMNS}
    row["status"] = record.status.value
    row["issued_keys"] = list(record.issued_keys)
    row["expires_at"] = record.expires_at
    return row


def _from_row(row: Mapping[Any, Any], ring: KeyRing | None = None) -> TaskRecord:
    """The record a row holds, its payloads opened (`store.codec`) when a ring is set or any is sealed.

    A payload this process cannot open (a retired key, no ring) reads as a failed task whose error
    says why: the row is left as it is, and nothing can move a terminal record."""
    values = {name: row[name] for name in _COLUMNS}
    # In clear the payloads are objects or NULL: a str among them is sealed. (Spelled out: this runs on every read.)
    if ring is not None or str in (
        type(values["arguments"]),
        type(values["input_requests"]),
        type(values["input_responses"]),
        type(values["result"]),
    ):
        try:
            open_columns(ring, values["key"], values)
        except UnreadablePayload as exc:
            return _unreadable(values, str(exc))
    values["status"] = TaskStatus(values["status"])
    values["issued_keys"] = tuple(values["issued_keys"] or ())
    for name in ("arguments", "input_requests", "input_responses"):
        values[name] = values[name] or {}
    return TaskRecord(**values)


def _unreadable(values: dict[str, Any], reason: str) -> TaskRecord:
    """A row whose payloads cannot be opened, as the failed task every reader sees (the payloads left out).

    Said once per process and reason (a client polling such a task would repeat it every poll)."""
    said = (values["tool"], reason)
    if said not in _UNREADABLE_SAID:
        _UNREADABLE_SAID.add(said)
        logger.warning("a task of tool %r cannot be read: %s", values["tool"], reason)
    message = f"The task cannot be read: {reason}"
    values.update(
        status=TaskStatus.FAILED,
        status_message=message,
        error=failure(message),
        arguments={},
        input_requests={},
        input_responses={},
        result=None,
        issued_keys=tuple(values["issued_keys"] or ()),
    )
    return UnreadableTask(**values)


def _later(at_ms: Any) -> sa.ColumnElement[int]:
    """The heartbeat moved to `at_ms` (a value or a bound parameter), never backwards."""
    at = at_ms if isinstance(at_ms, sa.BindParameter) else sa.literal(at_ms)
    return sa.case((tasks.c.heartbeat_at > at, tasks.c.heartbeat_at), else_=at)


def _with_heartbeat(record: TaskRecord, heartbeat_at: int | None) -> TaskRecord:
    """`record` with the heartbeat the row holds (a touch moves it without a version bump)."""
    return record if record.heartbeat_at == heartbeat_at else replace(record, heartbeat_at=heartbeat_at)


def _owner_shape(owner: Owner, params: dict[str, Any], name: str) -> OwnerScope:
    """The shape of a statement's owner clause (`model.owner_scope`); for "one", the owner bound as `name`."""
    scope = owner_scope(owner)
    if scope == "one":
        params[name] = owner
    return scope


def _owner_clause(scope: OwnerScope, name: str) -> tuple[sa.ColumnElement[bool], ...]:
    """The owner rule (`model.owner_scope`) in SQL: nothing for "any", owner-less rows for "none", else the
    rows of the owner bound as `name`."""
    if scope == "any":
        return ()
    return (tasks.c.owner.is_(None) if scope == "none" else tasks.c.owner == sa.bindparam(name),)


class SqlStore:
    """The durable store. Thread-safe; share one per process (one engine, one pool).

    `change_hint`: sent with every write (PostgreSQL only), e.g. `notify.postgres.PG_HINT`.
    """

    def __init__(self, engine: Engine, *, change_hint: ChangeHint | None = None, ring: KeyRing | None = None) -> None:
        self.engine = engine
        self.ring = ring  # MCP_TASKS_ENCRYPTION_KEYS: payloads sealed on write, opened on read (`store.codec`)
        if change_hint is not None and self.dialect != "postgresql":
            raise ValueError(f"a change hint is PostgreSQL's pg_notify; this store is {self.dialect}")
        self.change_hint = change_hint
        # SQLite: a read takes a deferred BEGIN; a write takes the write lock first (BEGIN IMMEDIATE).
        self._sqlite = self.dialect == "sqlite"
        self._ledger: SweepLedger | None = None
        self._row_gauge = quotas.RowGauge()

    @classmethod
    def from_url(
        cls, url: str, *, change_hint: ChangeHint | None = None, ring: KeyRing | None = None, **engine_kwargs: Any
    ) -> SqlStore:
        """The store on an engine of its own, in autocommit on PostgreSQL: a one-statement read or write is one
        round trip (an engine in transactions works too, at a BEGIN and a COMMIT more per write). Its pool then
        takes a connection back without a ROLLBACK (SQLAlchemy's `pool_reset_on_return=None`, meant for autocommit
        pools): a transaction the store opens is its `Connection`'s, which ends it before the connection goes back."""
        if is_postgres(url):
            engine_kwargs.setdefault("isolation_level", "AUTOCOMMIT")
            if engine_kwargs["isolation_level"] == "AUTOCOMMIT":
                engine_kwargs.setdefault("pool_reset_on_return", None)
        return cls(create_store_engine(url, **engine_kwargs), change_hint=change_hint, ring=ring)

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    def create_schema(self) -> None:
        """Create the tables directly (tests, throwaway databases). Production uses alembic."""
        tasks.metadata.create_all(self.engine)

    def dispose(self) -> None:
        self.engine.dispose()

    def _locking(self) -> Connection:
        """A connection for the locking path: READ COMMITTED on PostgreSQL, BEGIN IMMEDIATE on SQLite.

        READ COMMITTED whatever the server's default: a statement after a lock wait then sees what the lock's
        holder committed (the quota's count, the row FOR UPDATE returns). Under REPEATABLE READ the snapshot
        predates the wait: every racing creation counted the same rows, and the quota let them all in."""
        conn = self.engine.connect()
        if self._sqlite:
            return conn
        return conn.execution_options(isolation_level="READ COMMITTED")

    def _hint(self, record: TaskRecord, params: dict[str, Any]) -> bool:
        """Whether a write of `record` carries a change hint; if so, bound into `params`."""
        hint = self.change_hint
        if hint is None or (payload := hint.payload(record)) is None:
            return False
        params["hint_channel"], params["hint_payload"] = hint.channel, payload
        return True

    @_operation
    def get(self, key: str, owner: Owner = ANY) -> TaskRecord | None:
        return read(self.engine, self._select, key, owner)

    def _select(self, conn: Connection, key: str, owner: Owner, *, for_update: bool = False) -> TaskRecord | None:
        params = {"key": key}
        statement = _select_statement(_owner_shape(owner, params, "owner"), for_update)
        row = conn.execute(statement, params).mappings().first()
        return None if row is None else _from_row(row, self.ring)

    @_operation
    def get_many(self, keys: Iterable[str], owner: Owner = ANY) -> dict[str, TaskRecord]:
        def select(conn: Connection, batch: list[str]) -> dict[str, TaskRecord]:
            params: dict[str, Any] = {"keys": batch}
            statement = _select_statement(_owner_shape(owner, params, "owner"), many=True)
            return {row["key"]: _from_row(row, self.ring) for row in conn.execute(statement, params).mappings()}

        return _batched(self.engine, list(keys), select)

    @_operation
    def versions(self, keys: Iterable[str]) -> dict[str, int]:
        def select(conn: Connection, batch: list[str]) -> dict[str, int]:
            return dict(conn.execute(sa.select(tasks.c.key, tasks.c.version).where(tasks.c.key.in_(batch))).all())

        return _batched(self.engine, list(keys), select)

    @_operation
    def stale(self, *, heartbeat_before_ms: int, limit: int) -> list[TaskRecord]:
        query = (
            sa.select(tasks)
            .where(tasks.c.status == TaskStatus.WORKING.value)
            .where(sa.or_(tasks.c.heartbeat_at.is_(None), tasks.c.heartbeat_at < heartbeat_before_ms))
            .limit(limit)
        )
        rows = read(self.engine, lambda conn: conn.execute(query).mappings().all())
        return [_from_row(row, self.ring) for row in rows]

    @_reported
    def create(
        self,
        record: TaskRecord,
        *,
        max_rows: int | None,
        quota: Quota | None = None,
        idempotent: bool = False,
        durable: bool = True,
    ) -> TaskRecord:
        """One INSERT in autocommit, which counts the rows under the cap once a second and near it (`quotas.RowGauge`):
        the cap is approximate by the racing creates and what other processes created since that count. With a
        `quota`, a transaction of its own (`store.quotas`). `idempotent`:
        the row already under the key is the answer (a retry of its creation); a row gone between the conflict and
        the read (a retry that freed an expired key meanwhile) is inserted again, once. Not `durable`, on
        PostgreSQL: `synchronous_commit` off for its transaction alone, as `update`'s."""
        durable = durable or self._sqlite
        for last in (False, True):
            try:
                if quota is not None and not quota.unlimited:
                    return self._create_within_quota(record, max_rows, quota, idempotent, durable)
                return self._create(record, max_rows, idempotent, durable)
            except (sa.exc.IntegrityError, TaskLimitReached) as exc:
                found = self.get(record.key) if idempotent else None
                if found is not None:
                    return found
                if last or not (idempotent and isinstance(exc, sa.exc.IntegrityError)):
                    raise
        raise AssertionError("unreachable")

    def _create(self, record: TaskRecord, max_rows: int | None, idempotent: bool, durable: bool) -> TaskRecord:
        """The one INSERT; a statement lost in flight is settled by reading the row: there with this content,
        created; absent, inserted again."""
        try:
            self._insert(record, max_rows, durable)
            return record
        except _CommitInDoubt as doubt:
            lost = doubt
        logger.warning("store connection was lost during a COMMIT (create); checking whether it was applied")
        found = self.get(record.key)
        if found is None:
            try:
                self._insert(record, max_rows, durable)
                return record
            except sa.exc.IntegrityError:  # the lost statement landed meanwhile
                found = self.get(record.key)
            except _CommitInDoubt as again:
                raise again.cause from None
        if found is not None and (idempotent or same_json(_to_row(found), _to_row(record))):
            return found
        raise lost.cause

    @_reconnecting
    def _create_within_quota(
        self, record: TaskRecord, max_rows: int | None, quota: Quota, idempotent: bool, durable: bool
    ) -> TaskRecord:
        """Lock the principal (PostgreSQL), read an idempotent creation's row, count, insert, commit."""
        with self._locking() as conn:
            conn.begin()
            if not self._sqlite:
                quotas.lock_caller(conn, record)
            found = self._select(conn, record.key, ANY) if idempotent else None
            if found is not None:  # a retry of a creation that counted already
                conn.rollback()
                return found
            refused = quotas.refusal(conn, record, quota)
            if refused is not None:
                conn.rollback()
                raise refused
            if not self._inserted(conn, record, max_rows, durable):
                conn.rollback()
                raise TaskLimitReached()
            try:
                conn.commit()
            except sa.exc.DBAPIError as exc:
                raise _in_doubt(exc) from exc
        self._row_gauge.created()
        return record

    def _inserted(self, conn: Connection, record: TaskRecord, max_rows: int | None, durable: bool) -> bool:
        """The creation's INSERT: whether it stored the row (False: no room under the cap). Whether it counts the
        rows, and tells the gauge what it counted, is `quotas.RowGauge`'s to say; the count starts from the
        janitor's last (`quotas.RowBase`, read from the ledger at most every `BASE_REFRESH_S`)."""
        params = _to_row(record)
        if self.ring is not None:
            params = seal_columns(self.ring, record.key, params)
        capped, mark = self._row_gauge.plan(max_rows) if max_rows is not None else (False, None)
        base = quotas.RowBase(0, None)
        try:
            if capped and max_rows is not None:
                base = self._row_gauge.base(lambda: quotas.RowBase.of(read_sweep(conn)))
                params["rows_room"] = max(max_rows - base.rows, 0)
                if base.since_ms is not None:
                    params["rows_since"] = base.since_ms
            statement = _insert_statement(
                capped, mark is not None, self._hint(record, params), durable, base.since_ms is not None
            )
            inserted = conn.execute(statement, params).first()
        except BaseException:
            if mark is not None:
                self._row_gauge.uncounted()
            raise
        if mark is not None and max_rows is not None:
            self._row_gauge.counted(max_rows if inserted is None else base.rows + int(inserted.rows_seen), mark)
        return inserted is not None

    def _insert(self, record: TaskRecord, max_rows: int | None, durable: bool) -> None:
        with self.engine.connect() as conn:
            try:
                inserted = self._inserted(conn, record, max_rows, durable)
                conn.commit()  # PostgreSQL: autocommit already; SQLite: the BEGIN IMMEDIATE the write took
            except sa.exc.DBAPIError as exc:
                raise _in_doubt(exc) from exc
        if not inserted:
            raise TaskLimitReached()
        self._row_gauge.created()

    @_reported
    def update(
        self,
        key: str,
        owner: Owner,
        transition: Transition,
        *,
        expected: TaskRecord | None = None,
        durable: bool = True,
    ) -> TaskRecord:
        """Not `durable`, on PostgreSQL: `synchronous_commit` off for that transaction alone."""
        durable = durable or self._sqlite  # SQLite (WAL, synchronous=NORMAL) waits for no flush at commit anyway
        step = transition
        if expected is not None:
            written, in_doubt = self._swap_expected(key, owner, transition, expected, durable)
            if written is not None:
                return written
            if in_doubt is not None:  # not applied when settled; it may still land: never apply it twice
                step = _unless_landed(transition, in_doubt)
        for _ in range(_MAX_CAS_ATTEMPTS):
            try:
                written = self._swap(key, owner, step, durable)
            except _Landed as landed:
                return landed.record
            except _CommitInDoubt as doubt:
                written = self._settle(doubt)
            if written is not None:
                return written
        raise StoreConflict("the task kept changing under this write; try again")

    def _swap_expected(
        self, key: str, owner: Owner, transition: Transition, expected: TaskRecord, durable: bool = True
    ) -> tuple[TaskRecord | None, _CommitInDoubt | None]:
        """The transition computed on `expected` and written as ONE conditional UPDATE in autocommit.

        The record written, or None when the locking path must decide: the row moved on (or is gone, or
        foreign), or the transition refused `expected` or left it as it was. With None, the write lost in
        flight if it was: settled as not applied, it may still land later (an autocommit statement holds no
        lock while it travels). Only changed columns are set, so a touched heartbeat is never rewound.
        """
        if expected.key != key:
            raise ValueError("the expected record is another task's")
        try:
            nxt = apply(transition, expected)
        except Exception:  # noqa: BLE001 - computed on a record that may be stale: the fresh row decides
            return None, None
        if nxt is expected:
            return None, None
        changes = _changes(expected, nxt)
        with self.engine.connect() as conn:
            try:
                row = self._write(conn, key, owner, expected.version, changes, nxt, forward=True, durable=durable)
                conn.commit()  # PostgreSQL: autocommit already; SQLite: the BEGIN IMMEDIATE the write took
            except sa.exc.DBAPIError as exc:
                doubt = _in_doubt(exc, expected, nxt, changes)
            else:
                return (None if row is None else _with_heartbeat(nxt, row[0])), None
        return self._settle(doubt), doubt

    @_reconnecting
    def _swap(self, key: str, owner: Owner, transition: Transition, durable: bool = True) -> TaskRecord | None:
        """One locked compare-and-swap: the record now stored, or None when another writer won (recompute)."""
        with self._locking() as conn:
            conn.begin()
            current = self._select(conn, key, owner, for_update=True)
            if current is None:
                raise TaskNotFound()
            nxt = apply(transition, current)
            if nxt is current:
                conn.rollback()
                return current
            changes = _changes(current, nxt)
            if self._write(conn, key, owner, current.version, changes, nxt, durable=durable) is None:
                conn.rollback()
                return None
            try:
                conn.commit()
            except sa.exc.DBAPIError as exc:
                raise _in_doubt(exc, current, nxt, changes) from exc
        return nxt

    def _write(
        self,
        conn: Connection,
        key: str,
        owner: Owner,
        version: int,
        changes: Mapping[str, Any],
        nxt: TaskRecord,
        *,
        forward: bool = False,
        durable: bool = True,
    ) -> Any:
        """The compare-and-swap UPDATE (`_update_statement`): the returned row, or None when it matched nothing."""
        params: dict[str, Any] = {f"new_{name}": value for name, value in changes.items()}
        if self.ring is not None:
            params = seal_columns(self.ring, key, params, prefix="new_")
        params["cas_key"], params["cas_version"], params["cas_created"] = key, version, nxt.created_at  # never changes
        shape = _owner_shape(owner, params, "cas_owner")
        hinted = self._hint(nxt, params)
        forward = forward and changes.get("heartbeat_at") is not None
        statement = _update_statement(tuple(changes), shape, hinted, forward, durable)
        return conn.execute(statement, params).first()

    def _settle(self, doubt: _CommitInDoubt) -> TaskRecord | None:
        """After a write lost in flight: the written record if it was applied, None if it was not.

        Decided on the row once the lost transaction is resolved (the locking read waits for it on PostgreSQL).
        Versions grow one per write: still at the version read, nothing was applied; at the version written,
        it is ours exactly when it holds what we wrote. Further along, nobody can tell: the write fails.
        """
        before, after = doubt.before, doubt.after
        assert before is not None and after is not None
        logger.warning("store connection was lost during a COMMIT (update); checking whether it was applied")
        found = self._locked(after.key)
        if found is None:
            raise TaskNotFound()
        if found.version == before.version:
            return None
        if found.version == after.version:
            return _with_heartbeat(after, found.heartbeat_at) if _holds(found, doubt.changes) else None
        raise doubt.cause

    @_operation
    def _locked(self, key: str) -> TaskRecord | None:
        with self._locking() as conn, conn.begin():
            return self._select(conn, key, ANY, for_update=True)

    @_operation
    def touch(
        self,
        key: str,
        at_ms: int,
        *,
        dispatch: int | None = None,
        born: int | None = None,
        unstarted: int | None = None,
    ) -> bool:
        """One conditional UPDATE in autocommit, no version bump (liveness is not a change clients see), never
        moving it backwards. Idempotent, so retried even after a lost COMMIT."""
        query = tasks.update().where(tasks.c.key == key).where(tasks.c.status.not_in(TERMINAL_VALUES))
        if dispatch is not None:
            query = query.where(tasks.c.dispatches == dispatch)
        if born is not None:
            query = query.where(tasks.c.created_at == born)
        if unstarted is not None:  # a started copy's silence is the reaper's to judge, not hidden by a waiting one
            query = query.where(
                tasks.c.attempt <= unstarted,  # nor a later attempt's (whose message may be the one lost)
                sa.or_(tasks.c.started_at.is_(None), tasks.c.attempt < unstarted),
            )
        return write(self.engine, query.values(heartbeat_at=_later(at_ms))) == 1

    @_operation
    def browse(self, filter: Filter, sort: str, cursor: str | None, limit: int, *, now_ms: int) -> Page:
        return read(self.engine, browse.browse, filter, sort, cursor, limit, now_ms=now_ms)

    @_operation
    def overview(self, now_ms: int) -> Overview:
        return read(self.engine, browse.overview, now_ms)

    @_operation
    def rows(self, keys: Iterable[str], filter: Filter | None = None, *, now_ms: int | None = None) -> list[Row]:
        return read(self.engine, browse.rows, keys, filter, now_ms=now_ms)

    @_operation
    def keys_starting(self, prefix: str, *, limit: int) -> list[str]:
        return read(self.engine, browse.keys_starting, prefix, limit=limit)

    @_operation
    def changed_since(self, updated_at_ms: int, *, limit: int) -> list[Row]:
        return read(self.engine, browse.changed_since, updated_at_ms, limit=limit)

    @_operation
    def delete(self, key: str, *, expected: TaskRecord | None = None) -> bool:
        """One conditional DELETE (idempotent, so retried after a lost COMMIT too)."""
        query = tasks.delete().where(tasks.c.key == key).where(tasks.c.status.in_(TERMINAL_VALUES))
        if expected is not None:
            query = query.where(tasks.c.created_at == expected.created_at, tasks.c.version == expected.version)
        return write(self.engine, query) == 1

    @_operation
    def sign_out(self, session: str, expires_ms: int, *, now_ms: int) -> None:
        """The long expired forgotten, then one INSERT that ignores a session already there (idempotent, retried).

        Forgotten an hour after expiry, not at it: each console process judges a cookie's expiry by its own
        clock, and one whose clock is behind this one's must still find the sign-out."""
        with self.engine.connect() as conn:
            conn.execute(signouts.delete().where(signouts.c.expires_at <= now_ms - _SIGNOUT_KEPT_MS))
            conn.execute(
                upsert(self.engine, signouts).values(session=session, expires_at=expires_ms).on_conflict_do_nothing()
            )
            conn.commit()

    @_operation
    def signed_out(self, session: str) -> bool:
        query = sa.select(signouts.c.session).where(signouts.c.session == session)
        return read(self.engine, lambda conn: conn.execute(query).first() is not None)

    def unanswered(self, *, changed_before_ms: int, limit: int) -> list[str]:
        return unanswered(self.engine, changed_before_ms=changed_before_ms, limit=limit)

    def count_by_status(self) -> dict[str, int]:
        return count_by_status(self.engine)

    def ledger(self) -> SweepLedger:
        """The sweep ledger on this store's engine (one per store; a store rebuilt after a fork gets its own)."""
        if self._ledger is None or self._ledger.engine is not self.engine:
            self._ledger = SweepLedger(self.engine)
        return self._ledger

    @_reported
    def evict(self, *, now_ms: int, retention_ms: int, batch_size: int, into: Eviction | None = None) -> Eviction:
        tally = Eviction() if into is None else into  # outside the retry: committed batches stay counted
        evict(self.engine, tally, now_ms=now_ms, retention_ms=retention_ms, batch_size=batch_size)
        return tally
