"""The floor of bench/bench_task.py: the least a durable task can cost, built without this package.

    python -m bench.floor_app PORT                  the web process: a plain MCP SDK server on uvicorn
    celery -A bench.floor_app worker -P prefork     the plain Celery worker

- `create` (web): a plain `MCPServer` tool, served as `celery-mcp-tasks serve` serves
  ours (the SDK's `streamable_http_app()`, one uvicorn process, same loop and parser,
  log level warning). It does ONE prepared autocommit INSERT of a task-shaped row
  through psycopg (kept connections, as many as calls run at once) and one `send_task`; a sync tool, so
  the SDK runs it on its thread pool: the one hop our creation takes too.
- `noop` (worker): runs nothing and completes the row with ONE prepared autocommit
  UPDATE (`WHERE key = %s AND status = 'working'`, checked by rowcount) through psycopg
  (a kept connection per pool process). `acks_late`, as ours: the message outlives a
  killed worker, which a durable task needs.

The table is the store's own (`celery_mcp_tasks.store.schema`'s metadata, created by
the bench in a database of its own), so columns and indexes are identical; the row
carries the values a fresh task's row carries. Nothing here goes through SQLAlchemy,
kombu's extras or this package at run time: the floor must be as lean as it can be, a
slower floor flatters us.

Environment: BENCH_FLOOR_DATABASE_URL (the floor's database), CELERY_BROKER_URL,
BENCH_FLOOR_QUEUE (its queue).
"""

from __future__ import annotations

import json
import os
import secrets
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from celery import Celery

from celery_mcp_tasks.store.schema import tasks as TABLE

DATABASE_URL = os.environ.get("BENCH_FLOOR_DATABASE_URL", "").replace("postgresql+psycopg://", "postgresql://", 1)
TTL_MS = 3_600_000
POLL_MS = 1_000
RESULT = json.dumps({"content": [{"type": "text", "text": "ok"}], "isError": False})

celery = Celery("bench-floor")
celery.conf.broker_url = os.environ.get("CELERY_BROKER_URL")
celery.conf.task_default_queue = os.environ.get("BENCH_FLOOR_QUEUE", "bench-floor")
celery.conf.broker_connection_retry_on_startup = True


def _fresh(key: str, n: int) -> dict[str, Any]:
    """The values a fresh task's row gets (JSON pre-encoded)."""
    at = int(time.time() * 1000)
    return {
        "key": key,
        "tool": "noop",
        "status": "working",
        "status_message": "Queued",
        "created_at": at,
        "updated_at": at,
        "ttl_ms": TTL_MS,
        "expires_at": at + TTL_MS,
        "poll_interval_ms": POLL_MS,
        "arguments": json.dumps({"n": n}),
        "input_requests": "{}",
        "input_responses": "{}",
        "issued_keys": "[]",
        "version": 1,
        "dispatches": 1,
        "heartbeat_at": at,
    }


def _filler() -> dict[str, Any]:
    """A value for each column the store's table requires that `_fresh` does not name (one added since);
    nullable columns and those with a server default are left to the database, as a creation leaves them."""
    named = _fresh("k", 0)
    filler: dict[str, Any] = {}
    for column in TABLE.columns:
        if column.name not in named and not column.nullable and column.server_default is None:
            python_type = column.type.python_type
            filler[column.name] = "{}" if python_type is dict else python_type()
    return filler


_FILLER = _filler()  # worked out once: a creation on the floor does no more than bind its row


def _row_values(key: str, n: int) -> dict[str, Any]:
    """Every column a creation writes: the fresh values, plus the filler."""
    return {**_fresh(key, n), **_FILLER} if _FILLER else _fresh(key, n)


_COLUMNS = list(_row_values("k", 0))
INSERT = f"INSERT INTO {TABLE.name} ({', '.join(_COLUMNS)}) VALUES ({', '.join(f'%({name})s' for name in _COLUMNS)})"
COMPLETE = (
    f"UPDATE {TABLE.name} SET status = 'completed', status_message = NULL, result = %s, "
    "version = version + 1, updated_at = %s WHERE key = %s AND status = 'working'"
)


class Connections:
    """Kept autocommit connections, last returned first out (the warmest), made only when all are in use:
    as many as calls run at once, never one per thread of the SDK's pool (a PostgreSQL backend's start
    would land inside the measured window). Made after a fork, in the process that uses them."""

    def __init__(self) -> None:
        self.idle: list[psycopg.Connection[Any]] = []
        self.lock = threading.Lock()

    @contextmanager
    def one(self) -> Iterator[psycopg.Connection[Any]]:
        with self.lock:
            conn = self.idle.pop() if self.idle else None
        if conn is None:
            conn = psycopg.connect(DATABASE_URL, autocommit=True)
        try:
            yield conn
        finally:
            with self.lock:
                self.idle.append(conn)


connections = Connections()


@celery.task(name="bench.floor.noop", acks_late=True, ignore_result=True)  # type: ignore[untyped-decorator]
def noop(key: str, n: int = 0) -> None:
    """The no-op, then its row completed: one UPDATE."""
    with connections.one() as conn:
        done = conn.execute(COMPLETE, (RESULT, int(time.time() * 1000), key), prepare=True)
    if done.rowcount != 1:
        raise RuntimeError("the floor's row was not working")


def serve(port: int) -> None:
    import uvicorn
    from mcp.server.mcpserver import MCPServer

    server: MCPServer[Any] = MCPServer("bench-floor")

    @server.tool(structured_output=False)  # ours answers a CreateTaskResult: no structured output to build
    def create(n: int = 0) -> str:
        """One committed INSERT of a task-shaped row, then one send_task."""
        key = secrets.token_hex(32)
        with connections.one() as conn:
            conn.execute(INSERT, _row_values(key, n), prepare=True)
        celery.send_task("bench.floor.noop", args=(key,), kwargs={"n": n})
        return "sent"

    app = server.streamable_http_app(streamable_http_path="/mcp", host="127.0.0.1")
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", timeout_graceful_shutdown=5)


if __name__ == "__main__":
    serve(int(sys.argv[1]))
