"""Every method, error and edge case of the Tasks extension on the wire, over real HTTP,
against the conformance app served by `celery-mcp-tasks serve` with a separate worker."""

from __future__ import annotations

import base64

import httpx
import pytest
import sqlalchemy as sa

from celery_mcp_tasks.store.engine import normalize_url
from tests.support import EXT, Deployment, McpHttp, celery_id_of, free_port, run_ended, wait_until, without_meta

pytestmark = pytest.mark.integration

NOT_FOUND = "Failed to retrieve task: Task not found"
NO_EXT = {"elicitation": {}, "sampling": {}}


def rows(deployment: Deployment) -> int:
    engine = sa.create_engine(normalize_url(deployment.backend.store_url))
    with engine.connect() as conn:
        count = conn.execute(sa.text("SELECT count(*) FROM mcp_tasks_task")).scalar_one()
    engine.dispose()
    return count


def error_of(response) -> dict:  # type: ignore[no-untyped-def]
    body = response.json()
    assert "error" in body and "result" not in body, body
    return body["error"]


# -- bad input leaves nothing behind ----------------------------------------------------


def test_an_unknown_tool_gets_invalid_params_and_stores_nothing(conformance: Deployment, client: McpHttp):
    before = rows(conformance)
    error = error_of(client.raw("tools/call", {"name": "no_such_tool", "arguments": {}}, name="no_such_tool"))
    assert error["code"] == -32602 and error["message"] == "Unknown tool: no_such_tool"
    assert rows(conformance) == before


@pytest.mark.parametrize(
    ("arguments", "reason"),
    [
        ({"seconds": "soon"}, "Input should be a valid integer"),
        ({"seconds": -1}, "Input should be greater than or equal to 0"),
        ({}, "Field required"),
    ],
)
def test_bad_arguments_are_a_tool_error_the_model_can_read_and_store_nothing(
    conformance: Deployment, client: McpHttp, arguments, reason
):
    before = rows(conformance)
    body = client.raw("tools/call", {"name": "slow_compute", "arguments": arguments}, name="slow_compute").json()
    result = body["result"]
    assert result["isError"] is True, body
    text = result["content"][0]["text"]
    assert text.startswith("Error executing tool slow_compute: ") and "seconds" in text and reason in text, text
    assert rows(conformance) == before


def test_unknown_task_is_not_found_and_the_id_is_never_echoed(client: McpHttp):
    probe = "unknown-task-id-that-must-not-be-echoed"
    for method, extra in (("tasks/get", {}), ("tasks/cancel", {}), ("tasks/update", {"inputResponses": {}})):
        response = client.raw(method, {"taskId": probe, **extra}, name=probe)
        error = error_of(response)
        assert error == {"code": -32602, "message": NOT_FOUND}
        assert probe not in response.text


@pytest.mark.parametrize(
    ("headers", "accepted"),
    [
        ({"Mcp-Name": None}, False),
        ({"Mcp-Name": "someone-else"}, False),
        ({"Mcp-Name": "=?base64?{b64}?="}, True),
        ({"Mcp-Name": "=?base64?{b64}"}, False),
        ({"Mcp-Name": "=?base64?not!!base64?="}, False),
    ],
)
def test_mcp_name_must_equal_the_task_id(client: McpHttp, headers, accepted):
    task_id = client.create("slow_compute", {"seconds": 0})
    b64 = base64.b64encode(task_id.encode()).decode()
    value = headers["Mcp-Name"]
    sent = {} if value is None else {"Mcp-Name": value.format(id=task_id, b64=b64)}
    response = client.raw("tasks/get", {"taskId": task_id}, headers=sent)
    if accepted:
        assert response.status_code == 200 and response.json()["result"]["taskId"] == task_id
    else:
        assert response.status_code == 400 and error_of(response)["code"] == -32020
        assert task_id not in response.text


def test_mcp_name_is_compared_without_surrounding_whitespace(client: McpHttp):
    """httpx refuses to send such a header; the standard library's client does not."""
    import http.client
    import json
    from urllib.parse import urlsplit

    task_id = client.create("slow_compute", {"seconds": 0})
    url = urlsplit(client.url)
    body = {
        "jsonrpc": "2.0",
        "id": 7,
        "method": "tasks/get",
        "params": {
            "taskId": task_id,
            "_meta": {
                "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                "io.modelcontextprotocol/clientCapabilities": {"extensions": {EXT: {}}},
            },
        },
    }
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
    conn.request(
        "POST",
        url.path,
        body=json.dumps(body),
        headers={
            "Content-Type": "application/json",
            "Accept": "application/json, text/event-stream",
            "MCP-Protocol-Version": "2026-07-28",
            "Mcp-Method": "tasks/get",
            "Mcp-Name": f"  {task_id}\t ",
        },
    )
    response = conn.getresponse()
    reply = json.loads(response.read())
    conn.close()
    assert response.status == 200 and reply["result"]["taskId"] == task_id


@pytest.mark.parametrize("method", ["tools/call", "tasks/get"])
def test_an_unreadable_base64_mcp_name_is_a_header_mismatch_not_a_server_error(client: McpHttp, method):
    """The SDK's decoder raises (instead of answering "malformed") for a non-ASCII byte inside the base64 form:
    such a request is refused before the SDK reads it, as any other malformed routing header is."""
    task_id = client.create("slow_compute", {"seconds": 0})
    params = {"name": "slow_compute", "arguments": {"seconds": 0}} if method == "tools/call" else {"taskId": task_id}
    response = client.raw(method, params, headers={"Mcp-Name": b"=?base64?\xc3\xa9?="})  # type: ignore[dict-item]
    assert response.status_code == 400 and error_of(response)["code"] == -32020
    assert client.task("tasks/get", task_id)["result"]["taskId"] == task_id  # the connection and server go on


def test_an_unreadable_base64_param_header_is_a_header_mismatch_not_a_server_error(client: McpHttp):
    """The same decoder reads `Mcp-Param-*` headers (a tool's `x-mcp-header` arguments)."""
    params = {"name": "test_custom_headers", "arguments": {"region": "eu"}}
    bad = {"Mcp-Param-Region": b"=?base64?\xc3\xa9?="}
    response = client.raw("tools/call", params, name="test_custom_headers", headers=bad)  # type: ignore[arg-type]
    assert response.status_code == 400 and error_of(response)["code"] == -32020
    good = client.raw("tools/call", params, name="test_custom_headers", headers={"Mcp-Param-Region": "eu"})
    assert good.status_code == 200 and "error" not in good.json(), good.text


def test_a_lone_surrogate_in_the_arguments_is_kept_as_the_replacement_character(client: McpHttp):
    """JSON may carry `"\\ud800"`, which is no character and UTF-8 cannot hold: the call is a task (was a -32603),
    its job runs, and what the store keeps and answers holds U+FFFD in its place, with the extension and without."""
    task_id = client.create("slow_compute", {"seconds": 0, "label": "\ud800"})
    wait_until(lambda: client.task("tasks/get", task_id)["result"]["status"] == "completed", 30, "the job to complete")
    done = client.task("tasks/get", task_id)["result"]["result"]
    assert done["content"][0]["text"] == "Computed \ufffd after 0 second(s)"
    waited = client.call_tool("slow_compute", {"seconds": 0, "label": "\ud800"}, capabilities=NO_EXT)["result"]
    assert waited["content"][0]["text"] == "Computed \ufffd after 0 second(s)"


def test_tasks_methods_need_the_extension_before_any_lookup(client: McpHttp):
    for method in ("tasks/get", "tasks/cancel", "tasks/update"):
        response = client.raw(
            method, {"taskId": "gate-test", "inputResponses": {}}, name="gate-test", capabilities=NO_EXT
        )
        assert response.status_code == 400
        error = error_of(response)
        assert error["code"] == -32021
        assert error["data"]["requiredCapabilities"] == {"extensions": {EXT: {}}}


@pytest.mark.parametrize("method", ["tasks/list", "tasks/result"])
def test_enumeration_methods_do_not_exist(client: McpHttp, method: str):
    response = client.raw(method, {"taskId": "x"} if method == "tasks/result" else {})
    assert response.status_code == 404 and error_of(response)["code"] == -32601


# -- task modes and capabilities ----------------------------------------------------------


def test_required_tool_without_the_extension_is_refused_before_a_task_exists(conformance: Deployment, client: McpHttp):
    before = rows(conformance)
    response = client.raw(
        "tools/call", {"name": "failing_job", "arguments": {}}, name="failing_job", capabilities=NO_EXT
    )
    assert response.status_code == 400
    assert error_of(response)["data"] == {"requiredCapabilities": {"extensions": {EXT: {}}}}
    assert rows(conformance) == before


def test_a_tool_needing_elicitation_is_refused_when_the_client_cannot_elicit(conformance: Deployment, client: McpHttp):
    before = rows(conformance)
    response = client.raw(
        "tools/call",
        {"name": "confirm_delete", "arguments": {"filename": "x"}},
        name="confirm_delete",
        capabilities={"extensions": {EXT: {}}},
    )
    assert response.status_code == 400
    error = error_of(response)
    assert error["code"] == -32021 and error["data"] == {"requiredCapabilities": {"elicitation": {}}}
    assert rows(conformance) == before


def test_an_optional_tool_without_the_extension_runs_and_answers_plainly(client: McpHttp):
    reply = client.call_tool("slow_compute", {"seconds": 1, "label": "sync"}, capabilities=NO_EXT)
    result = reply["result"]
    assert result["resultType"] == "complete" and "taskId" not in result
    assert result["content"][0]["text"] == "Computed sync after 1 second(s)"


def test_the_legacy_task_param_is_ignored(client: McpHttp):
    reply = client.rpc(
        "tools/call",
        {"name": "greet", "arguments": {"name": "legacy"}, "task": {"ttl": 60000, "pollInterval": 100}},
        name="greet",
    )
    assert reply["result"]["content"][0]["text"] == "Hello, legacy!" and "taskId" not in reply["result"]


# -- tasks/update ---------------------------------------------------------------------------


def test_update_validates_records_at_once_ignores_strangers_and_resumes(client: McpHttp):
    task_id = client.create("multi_input")
    asked = client.wait_for(task_id, "input_required")
    assert set(asked["inputRequests"]) == {"first", "second"}

    bad = client.task("tasks/update", task_id, inputResponses=["not", "an", "object"])
    assert bad["error"]["code"] == -32602
    bad_value = client.task("tasks/update", task_id, inputResponses={"first": "not an object"})
    assert bad_value["error"] == {"code": -32602, "message": "the input response 'first' must be an object"}
    # An object, but no answer to an elicitation (an ElicitResult): refused as the synchronous path refuses it.
    # So is an accepted form whose content does not fit the question's requestedSchema ({"name": string}, required).
    misfits = {
        "action: Input should be 'accept', 'decline' or 'cancel'": {"action": "bogus"},
        "action: Field required": {"roots": []},
        "content: Input should be a valid dictionary": {"action": "accept", "content": "yes"},
        'content.name: must satisfy type "string"': {"action": "accept", "content": {"name": 12}},
        "content: 'name' is a required property": {"action": "accept", "content": {}},
    }
    for why, misfit in misfits.items():
        wrong = client.task("tasks/update", task_id, inputResponses={"first": misfit})
        assert wrong["error"] == {
            "code": -32602,
            "message": f"the input response 'first' is not an answer to its elicitation/create request: {why}",
        }, misfit
    assert set(client.get(task_id)["inputRequests"]) == {"first", "second"}  # nothing recorded

    ack = client.task(
        "tasks/update",
        task_id,
        inputResponses={"first": {"action": "accept", "content": {"name": "one"}}, "never-issued": {"ignored": True}},
    )
    assert ack["result"] == {"resultType": "complete", "_meta": ack["result"]["_meta"]}
    partial = client.get(task_id)  # read right after the ack: the answered key is already gone
    assert partial["status"] == "input_required" and list(partial["inputRequests"]) == ["second"]

    again = client.task(
        "tasks/update", task_id, inputResponses={"first": {"action": "accept", "content": {"name": "twice"}}}
    )
    assert "result" in again  # an already answered key is ignored, not an error
    client.task("tasks/update", task_id, inputResponses={"second": {"action": "accept", "content": {"name": "two"}}})
    done = client.wait_for(task_id)
    assert done["status"] == "completed"
    assert done["result"]["content"][0]["text"] == "Received first=one and second=two"

    late = client.task("tasks/update", task_id, inputResponses={"second": {"action": "decline"}})
    assert late["result"]["resultType"] == "complete" and client.get(task_id)["status"] == "completed"


# -- tasks/cancel ---------------------------------------------------------------------------


def test_cancel_is_synchronous_final_and_idempotent(conformance: Deployment, client: McpHttp):
    task_id = client.create("slow_compute", {"seconds": 30})
    wait_until(
        lambda: f"[{celery_id_of(client, task_id)}] received" in conformance.first_worker().text(),
        30,
        "the worker to take the job",
    )
    ack = client.task("tasks/cancel", task_id)["result"]
    assert set(ack) <= {"resultType", "_meta"} and ack["resultType"] == "complete"
    cancelled = client.get(task_id)  # no waiting: the store already says so
    assert cancelled["status"] == "cancelled" and cancelled["statusMessage"] == "Cancelled by the client"
    assert client.task("tasks/cancel", task_id)["result"]["resultType"] == "complete"
    # The job notices within 100 ms and returns (or, not started yet, is skipped): its late result changes nothing.
    run_ended(conformance.first_worker(), client, task_id)
    assert without_meta(client.get(task_id)) == without_meta(cancelled)


def test_cancel_racing_a_completion_leaves_exactly_one_final_state(conformance: Deployment, client: McpHttp):
    for _ in range(5):
        task_id = client.create("slow_compute", {"seconds": 0, "label": "race"})
        client.task("tasks/cancel", task_id)
        first = client.wait_for(task_id)
        run_ended(conformance.first_worker(), client, task_id)  # whatever the job did, it has done it now
        assert without_meta(client.get(task_id)) == without_meta(first)  # never flips, never rewritten
        if first["status"] == "completed":  # the job won: its own result, untouched by the cancel
            assert first["result"]["content"][0]["text"] == "Computed race after 0 second(s)"
        else:
            assert (first["status"], first["statusMessage"]) == ("cancelled", "Cancelled by the client")
            assert "result" not in first


def test_cancel_of_a_finished_task_acks_and_changes_nothing(client: McpHttp):
    task_id = client.create("slow_compute", {"seconds": 0})
    done = client.wait_for(task_id)
    assert client.task("tasks/cancel", task_id)["result"]["resultType"] == "complete"
    assert client.get(task_id)["status"] == done["status"] == "completed"


# -- the row cap ----------------------------------------------------------------------------


def test_the_row_cap_answers_task_limit_reached(backend, tmp_path):  # type: ignore[no-untyped-def]
    """The caller reads "Task limit reached" with the setting and the limit; the operator a line naming the setting,
    and the refusal counter."""
    ops_port = free_port()
    with Deployment("examples.conformance.app", backend, tmp_path) as capped:
        capped.web("capped", MCP_TASKS_MAX_ROWS="1", MCP_TASKS_METRICS="on", MCP_TASKS_OPS_PORT=str(ops_port))
        http = McpHttp(capped.url)
        base = rows(capped)
        replies = [http.call_tool("slow_compute", {"seconds": 60}) for _ in range(base + 2)]
        errors = [r["error"] for r in replies if "error" in r]
        assert errors and errors[-1] == {
            "code": -32603,
            "message": "Task limit reached: the server stores at most 1 task (MCP_TASKS_MAX_ROWS); retry once older"
            " tasks expire",
            "data": {"limit": "max_rows", "allowed": 1, "retryAfterMs": None},
        }
        http.close()
        line = "1 task creation refused since the last such line (the last of tool 'slow_compute'): the store holds"
        wait_until(lambda: line in capped.logs(), 10, "the refusal's line")
        assert "MCP_TASKS_MAX_ROWS=1 rows" in capped.logs()
        assert capped.logs().count("refused since the last such line") == 1  # a line a minute at most
        metrics = httpx.get(f"http://127.0.0.1:{ops_port}/metrics", timeout=10).text
        assert f'mcp_tasks_refused_total{{limit="max_rows",tool="slow_compute"}} {len(errors)}.0' in metrics
