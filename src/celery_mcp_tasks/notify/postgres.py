"""PostgreSQL transport: `pg_notify` inside the writing transaction, `LISTEN` in each web process.

The hint rides the write: delivered at commit, dropped on rollback (a listener never hears of a row it
cannot read yet), one statement in a transaction open anyway (~1 ms end to end). The listener is an async
psycopg connection on the event loop (the same ~0.8 ms p50 as a thread on `conn.notifies()`, without a
thread that cannot be interrupted at shutdown). Payload: `"<row key>:<version>"`, never a task id.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import anyio
import sqlalchemy as sa
from sqlalchemy.engine import Engine, make_url

from celery_mcp_tasks.model import TaskRecord
from celery_mcp_tasks.notify.base import listeners_possible
from celery_mcp_tasks.notify.hub import Hub
from celery_mcp_tasks.outage_log import OutageLog
from celery_mcp_tasks.store.base import ChangeHint
from celery_mcp_tasks.store.engine import APPLICATION_NAME, application_name, libpq_deadlines

logger = logging.getLogger(__name__)

CHANNEL = "mcp_tasks_changed"
"""One channel per database: every deployment sharing the table shares its hints."""

_NOTIFY = sa.text("SELECT pg_notify(:channel, :payload)")
_RETRY_MAX_S = 5.0
_IDLE_S = 5.0
"""How often a listening connection checks whether anything still follows a task."""


def parse_hint(payload: str) -> tuple[str, int] | None:
    key, _, version = payload.partition(":")
    if len(key) != 64 or not version.isdigit():
        return None
    return key, int(version)


def hint_payload(record: TaskRecord) -> str | None:
    """The hint for `record`'s write, or None when no stream can be following it yet."""
    return f"{record.key}:{record.version}" if listeners_possible(record) else None


PG_HINT = ChangeHint(CHANNEL, hint_payload)
"""What the store sends with each write (folded into the writing statement, delivered at its commit)."""


class PgNotifier:
    """The same hint as a `Notifier`, sent after the write in its own statement.

    Not used by default (the store's `PG_HINT` is part of the write); it is what a custom
    notifier calls to keep push on PostgreSQL while doing its own work.
    """

    def __init__(self, engine: Callable[[], Engine]) -> None:
        self._engine = engine

    def task_changed(self, record: TaskRecord) -> None:
        payload = hint_payload(record)
        if payload is not None:
            with self._engine().begin() as conn:
                conn.execute(_NOTIFY, {"channel": CHANNEL, "payload": payload})


def libpq_url(url: str) -> str:
    """A SQLAlchemy URL (`postgresql+psycopg://...`) as a libpq connection string."""
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


class PgListener:
    """`LISTEN` on one connection per web process, only while some watch follows a row; feeds the hub until cancelled.

    Every write sends its hint whether or not anyone listens, and each hint heard costs the database a wake-up
    and this process a read on its loop: so it stops `_IDLE_S` to twice that after the last watch closed.
    Starting to listen asks every watch to re-read: a change committed before the LISTEN took effect was heard
    by no one (hints sent while the connection was down are lost alike; it reconnects with backoff).
    """

    def __init__(self, url: str, hub: Hub) -> None:
        self._conninfo = libpq_url(url)
        self._named = application_name(url, f"{APPLICATION_NAME} listener")
        self._hub = hub
        self.ready = anyio.Event()
        self.listening = False

    async def run(self) -> None:
        import psycopg  # the `postgres` extra; imported only where PostgreSQL is used

        delay = 0.1
        outage = OutageLog(logger)  # said once an outage, and once more when it is over
        while True:
            try:
                # A vanished peer is noticed in seconds (libpq_deadlines): then it reconnects and every watch re-reads.
                conninfo = psycopg.conninfo.make_conninfo(self._conninfo, **libpq_deadlines(), **self._named)
                conn: Any = await psycopg.AsyncConnection.connect(conninfo, autocommit=True)
                async with conn:
                    delay = 0.1
                    outage.answered("task change listener reached PostgreSQL again")
                    await self._serve(conn)
            except Exception as exc:  # noqa: BLE001 - never let the listener take the web app down: back off, reconnect
                outage.failed("task change listener lost PostgreSQL (%s); reconnecting", type(exc).__name__)
            finally:
                self.listening = False
            await anyio.sleep(delay)
            delay = min(delay * 2, _RETRY_MAX_S)

    async def _serve(self, conn: Any) -> None:
        """On one connection: LISTEN while followed, UNLISTEN once idle, again and again."""
        while True:
            if not self._hub.followed:
                self.ready.set()
                await self._hub.until_followed()
            await conn.execute(f"LISTEN {CHANNEL}")
            self.listening = True
            self._hub.resync()  # whatever changed before the LISTEN took effect was heard by no one
            self.ready.set()
            idle_periods = 0
            while idle_periods < 2:  # unfollowed through one whole period: stop
                async for note in conn.notifies(timeout=_IDLE_S):
                    hint = parse_hint(note.payload)
                    if hint is not None:
                        self._hub.hint(*hint)
                idle_periods = 0 if self._hub.followed else idle_periods + 1
            await conn.execute(f"UNLISTEN {CHANNEL}")
            self.listening = False
