"""A synchronous call keeps only the latest record it read, however long its job runs (issue 20)."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Callable
from dataclasses import replace
from types import SimpleNamespace
from typing import Any, TypeVar

import anyio
import pytest

from celery_mcp_tasks.mcp import sync
from celery_mcp_tasks.model import TaskRecord, TaskStatus
from tests.builders import SendOnly

T = TypeVar("T")
READS = 200


class Rows:
    """A service whose row reports progress on every read, then completes; it remembers what it served weakly."""

    def __init__(self, first: TaskRecord) -> None:
        self.current = first
        self.served: list[weakref.ref[TaskRecord]] = []

    def record(self, key: str) -> TaskRecord:
        n = self.current.version
        if n >= READS:
            nxt = replace(self.current, status=TaskStatus.COMPLETED, result={"content": []}, version=n + 1)
        else:
            nxt = replace(self.current, status_message=f"step {n}", version=n + 1)
        self.current = nxt
        self.served.append(weakref.ref(nxt))
        return nxt


class Session:
    async def report_progress(self, *args: Any) -> None:
        pass


FIRST = TaskRecord(key="k", owner=None, tool="t", status=TaskStatus.WORKING, created_at=1, updated_at=1, ttl_ms=None)


async def follow(rows: Any, latest: sync._Latest, sync_timeout_s: float | None = None) -> Any:
    """`SyncCalls._follow` over `rows` (a service's reads and cancels), polling, for a tool with that bound."""

    async def run(fn: Callable[[], T], method: str, *, logged: bool = True) -> T:
        return fn()

    calls = sync.SyncCalls(lambda: rows, run, sync_timeout_s=60, hub=None, sealed_state=None)  # type: ignore[arg-type]
    tool = SimpleNamespace(name="t", sync_timeout_s=sync_timeout_s, mode="optional")
    return await calls._follow(tool, SimpleNamespace(session=Session()), latest, None)  # type: ignore[arg-type]


@pytest.mark.anyio
async def test_the_wait_keeps_one_record_not_every_one_it_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sync, "_POLL_FIRST_S", 0.0)
    monkeypatch.setattr(sync, "_POLL_MAX_S", 0.0)
    rows = Rows(FIRST)
    latest = sync._Latest(FIRST)
    result = await follow(rows, latest)
    assert result == {"content": []}
    assert latest.record.status is TaskStatus.COMPLETED and latest.record.version == READS + 1
    gc.collect()
    alive = [ref for ref in rows.served if ref() is not None]
    assert len(rows.served) == READS and len(alive) <= 2  # the last one (and the row's own copy), not 200


@pytest.mark.anyio
async def test_the_claims_hint_is_not_read_the_outcomes_is(tmp_path: Any) -> None:
    """The job's claim says nothing a synchronous caller is shown: its hint costs no read; the outcome's does."""
    import sqlalchemy as sa

    from celery_mcp_tasks.migrate import upgrade
    from celery_mcp_tasks.model import Run
    from celery_mcp_tasks.notify.hub import Hub
    from celery_mcp_tasks.service import TaskService
    from celery_mcp_tasks.store.sql import SqlStore

    url = f"sqlite:///{tmp_path / 'tasks.db'}"
    upgrade(url)
    store = SqlStore.from_url(url)
    service = TaskService(store, dispatcher=SendOnly(lambda record: None))
    _, created = service.create(owner=None, tool="t", arguments={})
    reads: list[str] = []
    sa.event.listen(store.engine, "before_cursor_execute", lambda conn, cursor, sql, *_: reads.append(sql))
    hub = Hub()
    hub.bind()
    watch = hub.watch([created.key])

    async def run(fn: Callable[[], T], method: str, *, logged: bool = True) -> T:
        return fn()

    calls = sync.SyncCalls(lambda: service, run, sync_timeout_s=60, hub=lambda: hub, sealed_state=None)
    tool = SimpleNamespace(name="t", sync_timeout_s=None)
    ctx = SimpleNamespace(session=Session())
    outcome: list[Any] = []
    try:
        async with anyio.create_task_group() as tg:

            async def follow() -> None:
                outcome.append(await calls._follow(tool, ctx, sync._Latest(created), watch))  # type: ignore[arg-type]

            tg.start_soon(follow)
            claimed = service.begin(created.key, Run(1), stale_before_ms=0, expected=created)
            hub.hint(created.key, claimed.version)
            await anyio.wait_all_tasks_blocked()
            assert not [sql for sql in reads if sql.lstrip().upper().startswith("SELECT")]  # the claim: no read
            done = service.complete(created.key, {"content": []}, run=Run(1), expected=claimed)
            hub.hint(created.key, done.version)
    finally:
        watch.close()
        store.dispose()
    assert outcome == [{"content": []}]
    assert len([sql for sql in reads if sql.lstrip().upper().startswith("SELECT")]) == 1  # the outcome: one read


class EndsAtTheDeadline:
    """A row unchanged on the first read, completed on the next: the job ended while its caller's bound ran out."""

    def __init__(self, first: TaskRecord) -> None:
        self.reads = [first, replace(first, status=TaskStatus.COMPLETED, result={"content": []}, version=2)]
        self.cancelled: list[str] = []

    def record(self, key: str) -> TaskRecord:
        return self.reads.pop(0) if len(self.reads) > 1 else self.reads[0]

    def cancel_by_key(self, key: str, message: str) -> None:
        self.cancelled.append(message)


@pytest.mark.anyio
async def test_a_job_that_ended_as_the_bound_ran_out_is_answered_not_cancelled(monkeypatch: pytest.MonkeyPatch) -> None:
    """The bound is checked against the row read again at that moment: its outcome is the answer."""
    monkeypatch.setattr(sync, "_POLL_FIRST_S", 1.0)  # the one poll sleeps until the bound is out
    rows = EndsAtTheDeadline(FIRST)
    result = await follow(rows, sync._Latest(FIRST), sync_timeout_s=0.05)
    assert result == {"content": []} and rows.cancelled == []
