"""Re-reads of a followed row, shared by the listen streams of one owner.

Read stream by stream, 10 000 streams on one task were 10 000 reads of the row (measured: ~1 000
reads/s through the pool, the last stream served ~10 s after the write). Here a stream joins a read of
the same (row, owner) whose query has not started yet, so it was read after its hint arrived; a read
under way is never joined (it may predate the hint). The owner stays in the query, so streams of
another principal never share a read; the rendering (with its digest) is made once per read.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Awaitable, Callable
from typing import Any

import anyio

from celery_mcp_tasks.model import TaskRecord
from celery_mcp_tasks.protocol import render_task


def digest(rendered: dict[str, Any]) -> bytes:
    """The client-visible state, fingerprinted (a write clients cannot see leaves it unchanged)."""
    return hashlib.blake2b(json.dumps(rendered, sort_keys=True, default=str).encode(), digest_size=16).digest()


class SharedRead:
    """One owner-scoped read of a row and what it rendered to; `record` is None when not the owner's (or gone)."""

    __slots__ = ("_rendered", "done", "failed", "ok", "record", "started")

    def __init__(self) -> None:
        self.started = False  # set by the worker thread just before the query
        self.ok = False
        self.record: TaskRecord | None = None
        self.failed: Exception | None = None
        self.done = anyio.Event()
        self._rendered: tuple[dict[str, Any], bytes] | None = None

    def rendered(self, task_id: str) -> tuple[dict[str, Any], bytes]:
        """`render_task` and its digest, made once for every stream sharing the read (same row, same id)."""
        assert self.record is not None
        if self._rendered is None:
            rendered = render_task(task_id, self.record)
            self._rendered = (rendered, digest(rendered))
        return self._rendered


class SharedReads:
    """The reads in flight, by (row key, owner). One per listen handler; everything here runs on the loop."""

    def __init__(self, run: Callable[[Callable[[], TaskRecord | None]], Awaitable[TaskRecord | None]]) -> None:
        self._run = run
        self._pending: dict[tuple[str, str | None], SharedRead] = {}

    @property
    def in_flight(self) -> int:
        return len(self._pending)

    async def read(self, key: str, owner: str | None, fetch: Callable[[], TaskRecord | None]) -> SharedRead:
        """The row as `fetch` (owner-scoped) reads it, from a query that started after this call."""
        slot = (key, owner)
        while (pending := self._pending.get(slot)) is not None and not pending.started:
            await pending.done.wait()
            if pending.ok:
                return pending
            if pending.failed is not None:
                # the store failed for everyone: each stream retries on its own schedule
                raise pending.failed.with_traceback(None)
            # The reading stream was cancelled before its query ran: join the next unstarted read of the slot
            # (the first of us to get here leads it), so its other streams still share one read.
        return await self._lead(slot, fetch)

    async def _lead(self, slot: tuple[str, str | None], fetch: Callable[[], TaskRecord | None]) -> SharedRead:
        read = SharedRead()
        self._pending[slot] = read

        def query() -> TaskRecord | None:
            read.started = True
            return fetch()

        try:
            read.record = await self._run(query)
            read.ok = True
        except Exception as exc:
            read.failed = exc
            raise
        finally:
            if self._pending.get(slot) is read:
                del self._pending[slot]
            read.done.set()
        return read
