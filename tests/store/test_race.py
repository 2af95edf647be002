"""Two processes, 500 conflicting transitions each, on SQLite and PostgreSQL.

No update may be lost, and no final state may ever be overwritten: for every
task exactly one process wins the terminal transition, and the row says so.
"""

from __future__ import annotations

import multiprocessing as mp
from dataclasses import replace

from celery_mcp_tasks.model import TaskRecord, TaskStatus, TerminalTask
from celery_mcp_tasks.store import ANY
from celery_mcp_tasks.store.sql import SqlStore

ROUNDS = 500


def _count(url: str, barrier: mp.synchronize.Barrier) -> None:
    store = SqlStore.from_url(url)
    barrier.wait()
    for _ in range(ROUNDS):
        store.update(
            "counter", ANY, lambda r: replace(r, status_message=str(int(r.status_message) + 1), version=r.version + 1)
        )
    store.dispose()


def _finish(url: str, barrier: mp.synchronize.Barrier, me: str, results: mp.Queue) -> None:
    store = SqlStore.from_url(url)
    barrier.wait()
    won = []
    for n in range(ROUNDS):
        key = f"task-{n}"
        try:
            store.update(key, ANY, lambda r: r.with_progress(f"{me} working", 2))
            if me == "worker":
                store.update(key, ANY, lambda r: r.completed({"content": [], "by": me}, 3))
            else:
                store.update(key, ANY, lambda r: r.cancelled(3))
            won.append(key)
        except TerminalTask:
            pass
    results.put((me, won))
    store.dispose()


def _record(key: str, message: str | None = None) -> TaskRecord:
    return TaskRecord(
        key=key,
        owner=None,
        tool="t",
        status=TaskStatus.WORKING,
        created_at=1,
        updated_at=1,
        ttl_ms=None,
        status_message=message,
    )


def _run(target, args_per_process) -> None:
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=target, args=args) for args in args_per_process]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(timeout=240)
        assert proc.exitcode == 0


def test_concurrent_read_modify_writes_lose_no_update(store_url: str):
    store = SqlStore.from_url(store_url)
    store.create(_record("counter", "0"), max_rows=None)
    barrier = mp.get_context("spawn").Barrier(2)
    _run(_count, [(store_url, barrier), (store_url, barrier)])
    final = store.get("counter")
    assert final is not None and final.status_message == str(2 * ROUNDS)
    assert final.version == 1 + 2 * ROUNDS
    store.dispose()


def test_completion_racing_cancellation_never_overwrites_a_final_state(store_url: str):
    store = SqlStore.from_url(store_url)
    for n in range(ROUNDS):
        store.create(_record(f"task-{n}"), max_rows=None)
    ctx = mp.get_context("spawn")
    barrier, results = ctx.Barrier(2), ctx.Queue()
    _run(_finish, [(store_url, barrier, "worker", results), (store_url, barrier, "client", results)])
    won = dict(results.get(timeout=10) for _ in range(2))
    assert set(won["worker"]).isdisjoint(won["client"])
    assert len(won["worker"]) + len(won["client"]) == ROUNDS
    for key in won["worker"]:
        assert store.get(key).status is TaskStatus.COMPLETED  # type: ignore[union-attr]
    for key in won["client"]:
        assert store.get(key).status is TaskStatus.CANCELLED  # type: ignore[union-attr]
    store.dispose()
