"""The extension over real HTTP, as a user meets it: the synchronous path's outcomes and bounds,
a task past its TTL, a question before the task exists (`prepare=`), and sampling and roots
input answered through `tasks/update`.

`tests.apps.runtime_app` served twice (the default sync bound, and MCP_TASKS_SYNC_TIMEOUT_S=1)
with one worker and no beat, so nothing evicts an expired task behind the test's back.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from celery_mcp_tasks.store.engine import normalize_url
from celery_mcp_tasks.store.sql import SqlStore
from tests.support import EXT, Backend, Deployment, McpHttp, wait_until

pytestmark = pytest.mark.integration

APP = "tests.apps.runtime_app"
WITHOUT_EXT: dict[str, Any] = {
    "elicitation": {}
}  # a 2026-07-28 client that did not opt in: optional tools run synchronously
EVERY_KIND: dict[str, Any] = {"elicitation": {}, "sampling": {}, "roots": {}, "extensions": {EXT: {}}}
EXPIRED = {"code": -32602, "message": "Failed to retrieve task: Task has expired"}
NOT_FOUND = {"code": -32602, "message": "Failed to retrieve task: Task not found"}


@pytest.fixture(scope="module")
def deployment(backend: Backend, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    with Deployment(APP, backend, tmp_path_factory.mktemp(f"extension-{backend.name}")) as deployment:
        deployment.web("web")
        deployment.worker()  # no beat: no janitor runs
        yield deployment


@pytest.fixture(scope="module")
def short_sync_url(deployment: Deployment) -> str:
    return deployment.web("web-short-sync", MCP_TASKS_SYNC_TIMEOUT_S="1")


@pytest.fixture
def client(deployment: Deployment) -> Iterator[McpHttp]:
    http = McpHttp(deployment.url)
    yield http
    http.close()


@pytest.fixture
def short_sync(short_sync_url: str) -> Iterator[McpHttp]:
    http = McpHttp(short_sync_url)
    yield http
    http.close()


def rows_of(deployment: Deployment, tool: str) -> dict[str, dict[str, Any]]:
    """Every row of `tool` in the store (other modules' included: the backend's store is shared), by key."""
    engine = sa.create_engine(normalize_url(deployment.backend.store_url))
    try:
        with engine.connect() as conn:
            found = (
                conn.execute(
                    sa.text("SELECT key, status, status_message, arguments FROM mcp_tasks_task WHERE tool = :tool"),
                    {"tool": tool},
                )
                .mappings()
                .all()
            )
    finally:
        engine.dispose()
    rows = {}
    for row in map(dict, found):
        if isinstance(row["arguments"], str):  # JSON is text on SQLite
            row["arguments"] = json.loads(row["arguments"])
        rows[row["key"]] = row
    return rows


def hidden_row(deployment: Deployment, tool: str, **arguments: Any) -> dict[str, Any]:
    """The one row of `tool` whose arguments include `arguments` (a synchronous call's hidden task)."""
    (row,) = [row for row in rows_of(deployment, tool).values() if arguments.items() <= row["arguments"].items()]
    return row


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


# -- the synchronous path: what the job's outcome becomes ------------------------------------------


def test_a_job_that_raises_answers_the_synchronous_call_with_an_internal_error_carrying_its_message(
    deployment: Deployment, client: McpHttp
) -> None:
    message = unique("disk full")
    reply = client.call_tool("explode", {"message": message}, capabilities=WITHOUT_EXT)
    assert "result" not in reply
    assert reply["error"]["code"] == -32603
    assert reply["error"]["message"] == f"Job failed: RuntimeError: {message}"
    assert hidden_row(deployment, "explode", message=message)["status"] == "failed"


def test_a_tool_error_result_reaches_the_synchronous_caller_as_a_result_with_is_error(
    deployment: Deployment, client: McpHttp
) -> None:
    message = unique("no such customer")
    result = client.call_tool("refuse", {"message": message}, capabilities=WITHOUT_EXT)["result"]
    assert result["isError"] is True and result["content"] == [{"type": "text", "text": message}]
    assert hidden_row(deployment, "refuse", message=message)["status"] == "completed"  # a result, not a failure


def test_a_raised_tool_error_is_a_result_with_is_error_too(deployment: Deployment, client: McpHttp) -> None:
    message = unique("quota exceeded")
    reply = client.call_tool("refuse_by_raising", {"message": message}, capabilities=WITHOUT_EXT)
    assert hidden_row(deployment, "refuse_by_raising", message=message)["status"] == "completed"
    assert reply.get("result", {}).get("isError") is True, reply
    plain = client.call_tool("refuse_by_raising_plainly", {"message": message}, capabilities=WITHOUT_EXT)
    assert plain["result"]["content"] == [
        {"type": "text", "text": f"Error executing tool refuse_by_raising_plainly: {message}"}
    ]
    assert reply["result"]["content"] == [
        {"type": "text", "text": f"Error executing tool refuse_by_raising: {message}"}
    ]


def test_a_raised_tool_error_ends_the_task_completed_with_is_error(client: McpHttp) -> None:
    message = unique("quota exceeded")
    done = client.wait_for(client.create("refuse_by_raising", {"message": message}))
    assert done["status"] == "completed" and done["result"]["isError"] is True
    assert done["result"]["content"] == [{"type": "text", "text": f"Error executing tool refuse_by_raising: {message}"}]


def test_a_raised_protocol_error_fails_the_task_and_the_synchronous_call_with_its_own_code(
    deployment: Deployment, client: McpHttp
) -> None:
    message = unique("no such region")
    plain = client.call_tool("refuse_by_protocol_plainly", {"message": message}, capabilities=WITHOUT_EXT)
    assert plain["error"] == {"code": -32602, "message": message, "data": {"field": "message"}}
    reply = client.call_tool("refuse_by_protocol", {"message": message}, capabilities=WITHOUT_EXT)
    assert reply["error"] == plain["error"]
    assert hidden_row(deployment, "refuse_by_protocol", message=message)["status"] == "failed"
    failed = client.wait_for(client.create("refuse_by_protocol", {"message": message}))
    assert failed["status"] == "failed" and failed["error"] == plain["error"]


def test_a_2026_synchronous_caller_answers_the_jobs_questions_by_mrtr_rounds(
    deployment: Deployment, client: McpHttp
) -> None:
    """Each question is an `InputRequiredResult`; its sealed `requestState` names the hidden task for the retry."""
    before = set(rows_of(deployment, "two_rounds"))  # it takes no arguments to tell its row by
    asked = client.call_tool("two_rounds", {}, capabilities=WITHOUT_EXT)["result"]
    assert asked["resultType"] == "input_required" and "taskId" not in asked
    assert asked["inputRequests"]["name"]["method"] == "elicitation/create"
    (key,) = [key for key in rows_of(deployment, "two_rounds") if key not in before]
    assert key not in asked["requestState"]  # sealed by the SDK: opaque to the client
    assert rows_of(deployment, "two_rounds")[key]["status"] == "input_required"

    def retry(state: str, **answers: dict[str, Any]) -> dict[str, Any]:
        params = {"name": "two_rounds", "arguments": {}, "inputResponses": answers, "requestState": state}
        return client.rpc("tools/call", params, name="two_rounds", capabilities=WITHOUT_EXT)

    tampered = retry(asked["requestState"][:-4] + "AAAA", name={"action": "accept", "content": {"name": "Ada"}})
    assert tampered["error"]["code"] == -32602
    again = retry(asked["requestState"], name={"action": "accept", "content": {"name": "Ada"}})["result"]
    assert again["resultType"] == "input_required" and list(again["inputRequests"]) == ["colour"]
    done = retry(again["requestState"], colour={"action": "accept", "content": {"colour": "blue"}})["result"]
    assert done["content"][0]["text"].startswith("Ada likes blue")
    assert rows_of(deployment, "two_rounds")[key]["status"] == "completed"


def test_a_2026_synchronous_caller_gets_a_url_question_without_an_elicitation_id(client: McpHttp) -> None:
    """2026-07-28 has no `elicitationId`: the MRTR round carries the URL question as a task would."""
    urls = {"elicitation": {"url": {}}}
    asked = client.call_tool("sign_in", {}, capabilities=urls)["result"]
    assert asked["resultType"] == "input_required", asked
    assert asked["inputRequests"]["signed_in"]["params"] == {
        "mode": "url",
        "message": "Sign in to ACME",
        "url": "https://acme.example/oauth",
    }
    params = {"inputResponses": {"signed_in": {"action": "accept"}}, "requestState": asked["requestState"]}
    done = client.rpc("tools/call", {"name": "sign_in", "arguments": {}, **params}, name="sign_in", capabilities=urls)
    assert done["result"]["content"][0]["text"] == "sign-in: accept", done


def test_a_job_whose_question_the_client_cannot_answer_fails_the_synchronous_call_and_is_cancelled(
    deployment: Deployment, client: McpHttp
) -> None:
    before = set(rows_of(deployment, "asks_undeclared"))
    error = client.call_tool("asks_undeclared", {}, capabilities=WITHOUT_EXT)["error"]  # it asks for sampling
    assert error == {
        "code": -32603,
        "message": (
            "Tool asks_undeclared needs input from the user, and this client did not declare sampling: call it "
            "from a client that does, or with the tasks extension"
        ),
    }
    (row,) = [row for key, row in rows_of(deployment, "asks_undeclared").items() if key not in before]
    assert (row["status"], row["status_message"]) == ("cancelled", "The job needs input; call it as a task")


# -- the synchronous path: its bounds --------------------------------------------------------------


def test_the_servers_sync_timeout_ends_the_call_cancels_the_task_and_the_job_stops(
    deployment: Deployment, short_sync: McpHttp, tmp_path: Path
) -> None:
    marker = tmp_path / "work"
    error = short_sync.call_tool("work", {"seconds": 60, "marker": str(marker)}, capabilities=WITHOUT_EXT)["error"]
    assert error == {
        "code": -32603,
        "message": "Tool work did not finish in time, and its job was cancelled: its job reported nothing for 1 s "
        "(MCP_TASKS_SYNC_TIMEOUT_S); call it with the tasks extension to wait as long as it runs",
    }
    row = hidden_row(deployment, "work", marker=str(marker))
    assert (row["status"], row["status_message"]) == ("cancelled", "Timed out waiting synchronously")
    wait_until(lambda: Path(f"{marker}.stopped").exists(), 15, "the job to see the cancel and stop")


def test_a_tools_own_sync_timeout_wins_over_the_servers_both_ways(
    deployment: Deployment, client: McpHttp, short_sync: McpHttp, tmp_path: Path
) -> None:
    marker = tmp_path / "impatient"
    # The server allows 60 s; the tool, 1 s.
    error = client.call_tool("impatient", {"seconds": 60, "marker": str(marker)}, capabilities=WITHOUT_EXT)["error"]
    assert "reported nothing for 1 s (the tool's sync_timeout_s)" in error["message"]
    assert hidden_row(deployment, "impatient", marker=str(marker))["status"] == "cancelled"
    wait_until(lambda: Path(f"{marker}.stopped").exists(), 15, "the job to stop")
    # The server allows 1 s; the tool, 60 s.
    result = short_sync.call_tool("patient", {"seconds": 2}, capabilities=WITHOUT_EXT)["result"]
    assert result["content"] == [{"type": "text", "text": "waited 2s"}]


# -- a task past its TTL, before the janitor evicts it ------------------------------------------------


def test_a_task_past_its_ttl_reads_expired_on_every_method_until_it_is_evicted(
    deployment: Deployment, client: McpHttp
) -> None:
    task_id = client.create("short_lived")  # ttl_ms=1500
    assert client.wait_for(task_id)["status"] == "completed"
    expired = wait_until(lambda: (r := client.task("tasks/get", task_id)).get("error") and r, 30, "the TTL to pass")
    assert expired["error"] == EXPIRED
    assert client.task("tasks/cancel", task_id)["error"] == EXPIRED
    assert client.task("tasks/update", task_id, inputResponses={"k": {}})["error"] == EXPIRED
    assert task_id not in json.dumps(expired)

    store = SqlStore.from_url(deployment.backend.store_url)
    try:
        from celery_mcp_tasks.model import now_ms, task_key

        record = store.get(task_key(task_id))
        assert record is not None and record.status.value == "completed"  # still there: only expired, not evicted
        evicted = store.evict(now_ms=now_ms(), retention_ms=3_600_000, batch_size=100)  # what the janitor does
        assert evicted.removed >= 1
    finally:
        store.dispose()
    assert client.task("tasks/get", task_id)["error"] == NOT_FOUND


# -- prepare=: a question before the task exists ---------------------------------------------------------


def test_prepare_asks_before_any_task_exists_then_seeds_the_task_with_the_answer(
    deployment: Deployment, client: McpHttp
) -> None:
    greeting = unique("Ahoy")
    asked = client.call_tool("greet_after_asking", {"greeting": greeting})["result"]
    assert asked["resultType"] == "input_required" and "taskId" not in asked
    assert list(asked["inputRequests"]) == ["user_name"]
    assert asked["inputRequests"]["user_name"]["method"] == "elicitation/create"
    assert not [
        row for row in rows_of(deployment, "greet_after_asking").values() if row["arguments"]["greeting"] == greeting
    ]  # nothing stored, nothing sent

    answer = {"action": "accept", "content": {"name": "Ada"}}
    created = client.rpc(
        "tools/call",
        {"name": "greet_after_asking", "arguments": {"greeting": greeting}, "inputResponses": {"user_name": answer}},
        name="greet_after_asking",
    )["result"]
    assert created["resultType"] == "task"
    done = client.wait_for(created["taskId"])
    assert done["status"] == "completed"
    assert done["result"]["content"][0]["text"] == f"{greeting}, Ada! (answers: user_name)"


# -- sampling and roots, asked mid-flight and answered through tasks/update ---------------------------------


def test_sampling_and_roots_requests_are_asked_as_built_and_their_answers_resume_the_job(
    deployment: Deployment,
) -> None:
    client = McpHttp(deployment.url, capabilities=EVERY_KIND)
    try:
        task_id = client.create("ask_model_and_roots")
        asked = client.wait_for(task_id, "input_required")
        assert asked["statusMessage"] == "Waiting for the model and the roots"
        assert asked["inputRequests"] == {
            "summary": {
                "method": "sampling/createMessage",
                "params": {
                    "messages": [{"role": "user", "content": {"type": "text", "text": "Summarize the plan"}}],
                    "maxTokens": 50,
                },
            },
            "roots": {"method": "roots/list", "params": {}},
        }
        ack = client.task(
            "tasks/update",
            task_id,
            inputResponses={
                "summary": {"role": "assistant", "content": {"type": "text", "text": "Ship on Friday"}, "model": "m-1"},
                "roots": {"roots": [{"uri": "file:///srv/app", "name": "app"}, {"uri": "file:///srv/docs"}]},
            },
        )
        assert ack["result"]["resultType"] == "complete"
        done = client.wait_for(task_id)
        assert done["status"] == "completed"
        assert done["result"]["content"][0]["text"] == "Ship on Friday over file:///srv/app, file:///srv/docs"
    finally:
        client.close()


def test_a_tool_needing_sampling_and_roots_is_refused_when_the_client_cannot_give_them(
    deployment: Deployment, client: McpHttp
) -> None:
    error = client.call_tool("ask_model_and_roots", {})["error"]  # the client declared elicitation only
    assert error["code"] == -32021
    assert error["data"] == {"requiredCapabilities": {"roots": {}, "sampling": {}}}
