"""The key ring's SQL side: the start-up check (`ring_check`) and re-encryption (`reencrypt`).

`reencrypt` (`celery-mcp-tasks db reencrypt`) seals every row's payloads with the ring's first key, safe while
web processes and workers run: a row is rewritten with `UPDATE ... SET <payloads> WHERE key AND version`, the
version left alone. The row's meaning does not change, so a writer that read it before still writes on top (its
own columns win), and a write that landed first moves the version, so the rewrite misses and is recomputed.
Clients hear of nothing. A row sealed with a key no longer in the ring is left as it is and counted.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from celery_mcp_tasks.store.codec import (
    ENCRYPTION_SETTING,
    PAYLOADS,
    SEALED_HEAD_CHARS,
    SEALED_PREFIX,
    KeyRing,
    UnreadablePayload,
    open_columns,
    sealed_key_id,
)
from celery_mcp_tasks.store.engine import read, write
from celery_mcp_tasks.store.schema import tasks

_ATTEMPTS = 16
_NEWEST = 50
_READ = sa.select(tasks.c.key, tasks.c.version, tasks.c.created_at, *(tasks.c[name] for name in PAYLOADS))


def _newest_sealed(conn: Connection) -> list[tuple[str, str]]:
    """(row key, stored arguments) of the newest rows whose arguments are sealed, newest first.

    Newest by creation: a row's arguments are sealed once, by the process that created it. By last change, a
    task created before a key change and finished after it (a long job, a late answer) came first, its
    arguments sealed with the key of before."""
    query = sa.select(tasks.c.key, tasks.c.arguments).order_by(tasks.c.created_at.desc(), tasks.c.key.desc())
    found = conn.execute(query.limit(_NEWEST)).all()  # read whole: the cursor is done before a caller returns
    return [(str(key), stored) for key, stored in found if sealed_key_id(stored) is not None]


def newest_sealed_key(conn: Connection) -> str | None:
    """The id of the key that sealed the arguments of the tasks created last: the one the running processes
    seal with (None: nothing sealed among the newest rows)."""
    newest = _newest_sealed(conn)
    return sealed_key_id(newest[0][1]) if newest else None


def ring_check(conn: Connection, ring: KeyRing | None) -> str | None:
    """Why a process with `ring` must not start on this store (one line naming the setting), or None.

    Decided on the newest sealed row: a process that cannot open what was written last has the wrong ring, or
    none. Older rows sealed with a key retired since read as failed tasks instead.
    """
    for key, stored in _newest_sealed(conn):
        key_id = sealed_key_id(stored)
        if ring is None:
            return (
                f"{ENCRYPTION_SETTING}: unset, but the task store holds encrypted payloads; "
                "set it to the key ring they were written with"
            )
        try:
            ring.open(stored, row=str(key), column="arguments")
        except UnreadablePayload:
            return (
                f"{ENCRYPTION_SETTING}: none of its keys opens the task store's newest payloads (written with key "
                f"{key_id}); set the ring the other processes use"
            )
        return None
    return None


def sealed_census(conn: Connection) -> dict[str | None, int]:
    """How many rows hold a payload each key sealed (key id -> rows; None: a payload in clear), in one grouped
    scan of every payload column. A write seals only the columns it sets, so one row can hold two keys'
    payloads (a job finished by a process still sealing with the old key): it counts under both."""

    def heads(name: str) -> Any:
        text = sa.cast(tasks.c[name], sa.Text)  # JSON text: a sealed value is a string, so a quote comes first
        head = sa.case((text.startswith(f'"{SEALED_PREFIX}'), sa.func.substr(text, 2, SEALED_HEAD_CHARS)), else_=None)
        return sa.select(tasks.c.key.label("row"), head.label("head")).where(tasks.c[name].is_not(None), text != "null")

    found = sa.union_all(*(heads(name) for name in PAYLOADS)).subquery()
    query = sa.select(found.c.head, sa.func.count(sa.distinct(found.c.row))).group_by(found.c.head)
    return {sealed_key_id(head): int(count) for head, count in conn.execute(query)}


@dataclass
class Reencryption:
    """What a pass did: rows rewritten, already current, unreadable (a retired key), and rows that kept changing."""

    rewritten: int = 0
    current: int = 0
    unreadable: int = 0
    busy: int = 0


def reencrypt(
    engine: Engine, ring: KeyRing, *, batch_size: int = 500, progress: Callable[[Reencryption], None] | None = None
) -> Reencryption:
    """Seal every row's payloads with `ring`'s first key, in batches of `batch_size` rows."""
    tally = Reencryption()
    after = ""
    while True:
        batch = read(engine, _rows, _READ.where(tasks.c.key > after).order_by(tasks.c.key).limit(batch_size))
        if not batch:
            return tally
        after = batch[-1]["key"]
        for row in batch:
            _rekey(engine, ring, row, tally)
        if progress is not None:
            progress(tally)


def _rows(conn: Connection, query: Any) -> list[dict[str, Any]]:
    return [dict(row) for row in conn.execute(query).mappings()]


def _rekey(engine: Engine, ring: KeyRing, row: dict[str, Any], tally: Reencryption) -> None:
    for _ in range(_ATTEMPTS):
        stale = [name for name in PAYLOADS if not ring.is_current(row[name])]
        if not stale:
            tally.current += 1
            return
        key = row["key"]
        try:
            opened = open_columns(ring, key, dict(row))
        except UnreadablePayload:
            tally.unreadable += 1
            return
        values = {name: ring.seal(opened[name], row=key, column=name) for name in stale}
        # That version of that task: a later task under the key (created again after this one expired) may
        # have reached the same version since the read, with payloads of its own.
        query = (
            tasks.update()
            .where(tasks.c.key == key, tasks.c.version == row["version"], tasks.c.created_at == row["created_at"])
            .values(values)
        )
        if write(engine, query) == 1:
            tally.rewritten += 1
            return
        fresh = read(engine, _rows, _READ.where(tasks.c.key == key))  # another writer moved the row: recompute
        if not fresh:  # evicted meanwhile: nothing left to protect
            return
        row = fresh[0]
    tally.busy += 1
