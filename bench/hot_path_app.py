"""The app bench/bench_hot_path.py serves: a no-op task tool, the floor beside it, and a context tool.

    celery-mcp-tasks serve bench.hot_path_app      celery -A bench.hot_path_app worker

- `noop`: an `@mcp_task` that does nothing (creation, completion and the synchronous path).
- `floor`: a plain SDK tool doing what a durable creation cannot avoid: one committed
  INSERT of a task-shaped row (into `bench_floor_task`, a copy of the store's table with
  the same columns and indexes, so the row cap, the janitor and the store never see it)
  and one `send_task` of the same message our dispatcher sends (to a queue no worker
  reads, `<MCP_TASKS_QUEUE>-floor`). A sync tool, so the SDK
  runs it on its worker thread: one thread hop, as the task path takes.
- `send_only`: the same `send_task` and nothing else (context: what the publish costs).

BENCH_MAX_STREAMS raises the listen handler's per-process stream bound (scale runs).
BENCH_COUNT=1 (the profile pass only: it costs a little on every call) counts, in this
process, SQL statements, transactions, thread-pool hops and Redis writes; the
`bench_counters` tool returns the counts since its previous call.
"""

from __future__ import annotations

import os
import secrets
import threading
import uuid
from collections import Counter
from typing import Any

import sqlalchemy as sa

from celery_mcp_tasks import McpTasks
from celery_mcp_tasks.model import now_ms
from celery_mcp_tasks.store import schema
from celery_mcp_tasks.store.engine import create_store_engine
from celery_mcp_tasks.worker.dispatch import _RETRY_POLICY
from celery_mcp_tasks.worker.job import DISPATCH_HEADER, HIDDEN_ARGS, KEY_HEADER

tasks = McpTasks("bench-hot-path")
celery = tasks.celery

if os.environ.get("BENCH_MAX_STREAMS") and tasks.listen is not None:
    tasks.listen.max_streams = int(os.environ["BENCH_MAX_STREAMS"])

FLOOR_TABLE = sa.Table("bench_floor_task", sa.MetaData(), *(column._copy() for column in schema.tasks.columns))
for _index in schema.tasks.indexes:  # the same indexes, under names of their own (PostgreSQL's are schema-wide)
    _names = [column.name for column in _index.columns]
    sa.Index(f"ix_bench_floor_task_{'_'.join(_names)}", *(FLOOR_TABLE.c[name] for name in _names))


@tasks.mcp_task
def noop(n: int = 0) -> str:
    """Does nothing: what is measured is the runtime around it."""
    return "ok"


_engine: tuple[int, sa.Engine] | None = None
_engine_lock = threading.Lock()


def floor_engine() -> sa.Engine:
    """One engine per process, made as the store makes its own (same factory, same pool); the table on first use."""
    global _engine
    with _engine_lock:
        if _engine is None or _engine[0] != os.getpid():
            engine = create_store_engine(tasks.settings.store_url)
            FLOOR_TABLE.create(engine, checkfirst=True)
            _engine = (os.getpid(), engine)
        return _engine[1]


def floor_row(n: int) -> dict[str, Any]:
    """A row shaped like a fresh task's: every column of the store's table, with a creation's values."""
    at = now_ms()
    ttl = tasks.settings.default_ttl_ms
    known: dict[str, Any] = {
        "key": secrets.token_hex(32),
        "tool": "noop",
        "status": "working",
        "status_message": "Queued",
        "created_at": at,
        "updated_at": at,
        "ttl_ms": ttl,
        "expires_at": at + ttl if ttl else None,
        "poll_interval_ms": tasks.settings.poll_interval_ms,
        "arguments": {"n": n},
        "input_requests": {},
        "input_responses": {},
        "issued_keys": [],
        "version": 1,
        "dispatches": 1,
        "heartbeat_at": at,
        "attempt": 0,
        "resends": 0,
        "parked": False,
    }
    row: dict[str, Any] = {}
    for column in FLOOR_TABLE.columns:
        if column.name in known:
            row[column.name] = known[column.name]
        elif column.nullable:
            row[column.name] = None
        elif column.server_default is None:
            raise RuntimeError(f"bench_floor_task.{column.name}: the floor row does not know this column")
    return row


def publish(n: int, key: str) -> None:
    """The message our dispatcher sends for a task (same name, options, headers and retry policy),
    to a queue of its own that no worker consumes: a running worker never spends time on it."""
    spec = tasks.tools["noop"]
    tasks.celery.send_task(
        spec.celery_name,
        queue=f"{tasks.settings.queue or 'celery'}-floor",
        kwargs={"n": n},
        task_id=str(uuid.uuid4()),
        headers={KEY_HEADER: key, DISPATCH_HEADER: 1},
        shadow=spec.name,
        **HIDDEN_ARGS,
        retry=True,
        retry_policy=_RETRY_POLICY,
    )


@tasks.server.tool()
def floor(n: int = 0) -> str:
    """The floor: one committed INSERT of a task-shaped row, then one send_task."""
    row = floor_row(n)
    with floor_engine().begin() as conn:
        conn.execute(FLOOR_TABLE.insert(), row)
    publish(n, row["key"])
    return "sent"


@tasks.server.tool()
def send_only(n: int = 0) -> str:
    """Context: the send_task alone, nothing stored."""
    publish(n, secrets.token_hex(32))
    return "sent"


# -- the profile pass's counters (BENCH_COUNT=1) ---------------------------------------

COUNTS: Counter[str] = Counter()


def _count(name: str) -> None:
    COUNTS[name] += 1  # a Counter update under the GIL: good enough for a benchmark's tallies


def install_counters() -> None:
    import anyio.to_thread
    import redis.connection

    @sa.event.listens_for(sa.Engine, "before_cursor_execute")
    def _statement(conn: Any, cursor: Any, statement: str, *_: Any) -> None:
        _count("sql statements")

    @sa.event.listens_for(sa.Engine, "begin")
    def _begin(conn: Any) -> None:
        _count("sql BEGIN")

    @sa.event.listens_for(sa.Engine, "commit")
    def _commit(conn: Any) -> None:
        _count("sql COMMIT")

    @sa.event.listens_for(sa.pool.Pool, "checkout")
    def _checkout(*_: Any) -> None:
        _count("pool checkouts")

    run_sync = anyio.to_thread.run_sync

    async def counted_run_sync(*args: Any, **kwargs: Any) -> Any:
        _count("thread-pool hops")
        return await run_sync(*args, **kwargs)

    anyio.to_thread.run_sync = counted_run_sync  # type: ignore[assignment]

    send = redis.connection.AbstractConnection.send_packed_command

    def counted_send(self: Any, command: Any, check_health: bool = True) -> None:
        _count("redis writes")
        send(self, command, check_health)  # type: ignore[no-untyped-call]

    redis.connection.AbstractConnection.send_packed_command = counted_send  # type: ignore[method-assign]

    @tasks.server.tool()
    async def bench_counters() -> dict[str, int]:
        """The counts since the previous call (then reset); async, so reading them takes no hop."""
        snapshot = dict(COUNTS)
        COUNTS.clear()
        return snapshot


if os.environ.get("BENCH_COUNT") == "1":
    install_counters()
