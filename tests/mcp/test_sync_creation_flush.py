"""A synchronous call's hidden task is created without waiting for the WAL flush; a task a caller is told of is not.

The hidden task's id is never answered: what the caller hears is a later write (the outcome here), whose durable
commit flushes the creation too. So on PostgreSQL its INSERT carries `synchronous_commit` off for its own
transaction, while a creation answered with a task id, and every outcome, wait for the flush. SQLite waits for
no flush at a commit, so its statements are the same either way.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from starlette.testclient import TestClient

from celery_mcp_tasks import McpTasks
from celery_mcp_tasks.app import internals
from celery_mcp_tasks.config import Settings
from celery_mcp_tasks.model import task_key
from celery_mcp_tasks.protocol import IDEMPOTENCY_META_KEY
from tests.support import EXT, PROTOCOL, wait_until


@pytest.fixture
def served(store_url: str, tmp_path: Path) -> Iterator[tuple[McpTasks, TestClient, list[str]]]:
    """The app on a migrated store (no worker: the test settles the job), and every statement its store sends."""
    database = None if store_url.startswith("sqlite") else store_url
    secret = "an idempotency secret of this test only, long enough"  # a test value, not a secret
    settings = Settings(data_dir=tmp_path, database_url=database, sync_timeout_s=10, idempotency_secret=secret)
    tasks = McpTasks("flush", settings=settings, notifier=None)

    @tasks.mcp_task
    def slow(n: int) -> str:
        return str(n)

    sent: list[str] = []
    engine = internals(tasks).service().store.engine  # type: ignore[attr-defined]  # the Store protocol has no engine
    sa.event.listen(engine, "before_cursor_execute", lambda conn, cursor, sql, *_: sent.append(sql))
    with TestClient(tasks.asgi_app(), base_url="http://localhost") as client:
        yield tasks, client, sent


def call(client: TestClient, *, with_extension: bool, idempotency_key: str | None = None) -> dict[str, Any]:
    headers = {
        "Accept": "application/json, text/event-stream",
        "Content-Type": "application/json",
        "MCP-Protocol-Version": PROTOCOL,
        "Mcp-Method": "tools/call",
        "Mcp-Name": "slow",
    }
    meta = {
        "io.modelcontextprotocol/protocolVersion": PROTOCOL,
        "io.modelcontextprotocol/clientCapabilities": {"extensions": {EXT: {}}} if with_extension else {},
    }
    if idempotency_key is not None:
        meta[IDEMPOTENCY_META_KEY] = idempotency_key
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": "slow", "arguments": {"n": 1}, "_meta": meta},
    }
    response = client.post("/mcp", content=json.dumps(body), headers=headers)
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        messages = [json.loads(line[5:]) for line in response.text.splitlines() if line.startswith("data:")]
        return next(m for m in messages if "id" in m)
    message: dict[str, Any] = response.json()
    return message


def inserts(sent: list[str]) -> list[str]:
    return [sql for sql in sent if sql.lstrip().upper().startswith("INSERT")]


def test_only_a_synchronous_calls_hidden_task_skips_the_flush_unless_idempotent_and_no_outcome_does(
    served: tuple[McpTasks, TestClient, list[str]],
) -> None:
    tasks, client, sent = served
    engine = internals(tasks).service().store.engine  # type: ignore[attr-defined]  # the Store protocol has no engine
    postgres = engine.dialect.name == "postgresql"

    answer = call(client, with_extension=True)  # a task with the extension: its id is answered
    assert answer["result"]["resultType"] == "task"
    (announced,) = inserts(sent)
    assert "set_config" not in announced  # its id was answered: durable before that

    hidden = synchronously(tasks, client, sent, exclude=task_key(answer["result"]["taskId"]))
    assert ("set_config" in hidden) is postgres  # SQLite: no flush to skip

    idempotent = synchronously(tasks, client, sent, exclude=task_key(answer["result"]["taskId"]), key="order-1")
    assert "set_config" not in idempotent  # its key promises one job: a lost row would let a retry run it again


def synchronously(tasks: McpTasks, client: TestClient, sent: list[str], *, exclude: str, key: str | None = None) -> str:
    """A synchronous call of `slow`, its hidden task completed from another thread as a job would: the hidden
    task's INSERT (asserted: its outcome is durable)."""
    engine = internals(tasks).service().store.engine  # type: ignore[attr-defined]  # the Store protocol has no engine
    sent.clear()
    outcome_sql: list[str] = []
    failed: list[BaseException] = []

    def settle() -> None:
        try:
            wait_until(lambda: len(inserts(sent)) == 1, 10, "the hidden task's INSERT")
            with engine.connect() as conn:  # the id is never answered: the row's key, read behind the app's back
                query = sa.text("SELECT key FROM mcp_tasks_task WHERE key <> :first AND status = 'working'")
                found = conn.execute(query, {"first": exclude}).scalar_one()
            start = len(sent)
            tasks.task_handle(found).complete("done")
            outcome_sql.extend(sql for sql in sent[start:] if sql.lstrip().upper().startswith("UPDATE"))
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test's thread, where pytest sees it
            failed.append(exc)

    settler = threading.Thread(target=settle)
    settler.start()
    outcome = call(client, with_extension=False, idempotency_key=key)  # without it: the hidden task's outcome
    settler.join(timeout=10)
    if failed:
        raise failed[0]
    assert outcome["result"]["content"][0]["text"] == "done", outcome
    assert outcome_sql and not any("set_config" in sql for sql in outcome_sql)  # what the caller hears is durable
    (insert,) = inserts(sent)
    return insert
