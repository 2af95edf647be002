"""The walking skeleton, end to end: a web process and a separate Celery worker,
on the embedded default and on PostgreSQL + Redis, driven over real HTTP."""

from __future__ import annotations

import hashlib
import re

import anyio
import pytest
import sqlalchemy as sa
from mcp import Client
from mcp.client import advertise

from celery_mcp_tasks.store.engine import normalize_url
from tests.support import EXT, Deployment, McpHttp, celery_id_of, run_ended

pytestmark = pytest.mark.integration

ID_PATTERN = re.compile(r"[A-Za-z0-9_-]{43}")


def test_a_task_is_created_at_once_found_at_once_and_completes(client: McpHttp):
    reply = client.call_tool("slow_compute", {"seconds": 1, "label": "skeleton"})
    created = reply["result"]
    assert created["resultType"] == "task" and created["status"] == "working"
    assert ID_PATTERN.fullmatch(created["taskId"])
    assert set(created) >= {"taskId", "status", "createdAt", "lastUpdatedAt", "ttlMs"}
    assert not {"result", "error", "inputRequests", "task"} & set(created)

    first = client.get(created["taskId"])  # durable before the reply: an immediate get finds it
    assert first["status"] in ("working", "completed") and first["taskId"] == created["taskId"]

    done = client.wait_for(created["taskId"])
    assert done["status"] == "completed" and done["resultType"] == "complete"
    assert done["result"]["content"][0]["text"] == "Computed skeleton after 1 second(s)"
    assert done["result"]["isError"] is False


def test_the_reply_does_not_wait_for_the_job(client: McpHttp):
    """The job still runs when the CreateTaskResult arrives (how fast creation is: bench/bench_task.py)."""
    task_id = client.create("slow_compute", {"seconds": 60, "label": "long"})
    assert client.get(task_id)["status"] == "working"
    client.task("tasks/cancel", task_id)
    assert client.get(task_id)["status"] == "cancelled"


def test_a_job_that_raises_ends_failed_with_a_jsonrpc_error(client: McpHttp):
    failed = client.wait_for(client.create("protocol_error_job"))
    assert failed["status"] == "failed" and failed["error"]["code"] == -32603
    assert "RuntimeError" in failed["statusMessage"] and "result" not in failed


def test_the_official_sdk_client_drives_a_task(conformance: Deployment):
    """The SDK client with the extension advertised; tasks/* requests set Mcp-Name via name_param."""
    from typing import Any, Literal

    from mcp_types import Request, RequestParams
    from pydantic import ConfigDict, TypeAdapter

    class GetParams(RequestParams):
        model_config = ConfigDict(populate_by_name=True)
        taskId: str

    class GetTask(Request[GetParams, Literal["tasks/get"]]):
        method: Literal["tasks/get"] = "tasks/get"
        name_param = "taskId"

    raw = TypeAdapter(dict[str, Any])

    async def scenario() -> dict[str, Any]:
        async with Client(conformance.url, mode="2026-07-28", extensions=[advertise(EXT)]) as sdk:
            created = await sdk.session.send_request(
                _call_tool_request("slow_compute", {"seconds": 0, "label": "sdk"}), raw
            )
            assert created["resultType"] == "task"
            for _ in range(600):
                task = await sdk.session.send_request(GetTask(params=GetParams(taskId=created["taskId"])), raw)
                if task["status"] == "completed":
                    return task
                await anyio.sleep(0.1)
            raise AssertionError("the task did not complete")

    task = anyio.run(scenario)
    assert task["result"]["content"][0]["text"] == "Computed sdk after 0 second(s)"


def _call_tool_request(name: str, arguments: dict) -> object:
    from mcp_types import CallToolRequest, CallToolRequestParams

    return CallToolRequest(params=CallToolRequestParams(name=name, arguments=arguments))


def test_no_task_id_reaches_any_log(conformance: Deployment, client: McpHttp):
    ids = [client.create("slow_compute", {"seconds": 0}) for _ in range(3)]
    ids.append(client.create("protocol_error_job"))
    for task_id in ids:
        client.wait_for(task_id)
    client.task("tasks/cancel", ids[0])
    worker = conformance.first_worker()
    for task_id in ids:  # the worker logged each of these jobs (received, and how its run ended)...
        assert f"[{celery_id_of(client, task_id)}] received" in worker.text()
        run_ended(worker, client, task_id)
    logs = conformance.logs()
    for task_id in ids:
        assert task_id not in logs  # ...and never a task id


def test_the_store_keeps_only_a_hash_of_the_task_id(conformance: Deployment, client: McpHttp):
    """A database dump opens no task: the row key is sha256(id) and the raw id is stored nowhere."""
    task_id = client.create("slow_compute", {"seconds": 0, "label": "dump"})
    client.wait_for(task_id)
    engine = sa.create_engine(normalize_url(conformance.backend.store_url))
    try:
        with engine.connect() as conn:
            rows = [dict(row._mapping) for row in conn.execute(sa.text("SELECT * FROM mcp_tasks_task"))]
    finally:
        engine.dispose()
    assert hashlib.sha256(task_id.encode()).hexdigest() in {row["key"] for row in rows}
    assert task_id not in repr(rows)
