"""The wire module: how a record looks on the wire, and the input requests a job can build."""

import pytest

from celery_mcp_tasks.protocol import (
    INPUT_CAPABILITIES,
    PROGRESS_META_KEY,
    InvalidInputRequest,
    answer_problem,
    answers,
    elicit,
    format_timestamp,
    list_roots,
    render_create_result,
    render_error,
    render_task,
    sample,
    tool_result,
    validate_input_requests,
)
from tests.builders import record

# -- rendering -----------------------------------------------------------------------------------


def test_timestamps_are_utc_with_milliseconds():
    assert format_timestamp(0) == "1970-01-01T00:00:00.000Z"
    assert format_timestamp(1_790_000_000_123) == "2026-09-21T14:13:20.123Z"


def test_create_result_is_flat_with_only_task_fields():
    result = render_create_result("ID", record(status_message="Queued"))
    assert result == {
        "resultType": "task",
        "taskId": "ID",
        "status": "working",
        "createdAt": format_timestamp(1000),
        "lastUpdatedAt": format_timestamp(1000),
        "ttlMs": 60_000,
        "pollIntervalMs": 500,
        "statusMessage": "Queued",
    }


def test_numeric_progress_rides_in_meta_only_once_reported():
    assert "_meta" not in render_task("ID", record(status_message="Started"))
    counted = record().with_progress("2 of 3", 2000, current=2, total=3)
    assert render_task("ID", counted)["_meta"] == {PROGRESS_META_KEY: {"progress": 2, "total": 3}}
    assert render_task("ID", counted.completed({"content": []}, 3000))["_meta"] == {
        PROGRESS_META_KEY: {"progress": 3, "total": 3}  # the work is done: the bar is full
    }
    assert render_task("ID", counted.failed({"message": "boom"}, 3000))["_meta"] == {
        PROGRESS_META_KEY: {"progress": 2, "total": 3}  # how far it got
    }
    unbounded = counted.with_progress("more", 4000, current=2.5)
    assert render_task("ID", unbounded)["_meta"] == {PROGRESS_META_KEY: {"progress": 2.5}}  # no total: unknown
    assert "_meta" not in render_create_result("ID", counted)


@pytest.mark.parametrize("ttl", [None, 0])
def test_ttl_is_never_zero_on_the_wire(ttl):
    assert render_task("ID", record(ttl_ms=ttl))["ttlMs"] is None


def test_each_status_renders_only_its_own_payload():
    asked = record().requiring_input({"k1": {"method": "roots/list", "params": {}}}, 2000)
    assert render_task("ID", asked)["inputRequests"] == {"k1": {"method": "roots/list", "params": {}}}
    done = record().completed({"content": []}, 2000)
    assert "result" in render_task("ID", done) and "error" not in render_task("ID", done)
    failed = record().failed({"code": -32603, "message": "boom"}, 2000)
    rendered = render_task("ID", failed)
    assert rendered["error"] == {"code": -32603, "message": "boom"} and rendered["statusMessage"] == "boom"
    assert "result" not in rendered and "inputRequests" not in rendered
    assert set(render_task("ID", record().cancelled(2000))) == {
        "taskId",
        "status",
        "createdAt",
        "lastUpdatedAt",
        "ttlMs",
        "pollIntervalMs",
        "statusMessage",
    }


def test_a_stored_failure_renders_as_internal_error_unless_it_names_its_code():
    assert render_error({"message": "Could not enqueue the job", "data": "ConnectionError"}) == {
        "code": -32603,
        "message": "Could not enqueue the job",
        "data": "ConnectionError",
    }
    assert render_error({"code": -32000, "message": "mine"}) == {"code": -32000, "message": "mine"}
    assert render_error(None, "The job did not complete") == {"code": -32603, "message": "The job did not complete"}
    # Rows written before the domain stopped storing codes (revision 0001) render the same.
    assert render_task("ID", record().failed({"code": -32603, "message": "boom"}, 2))["error"] == {
        "code": -32603,
        "message": "boom",
    }


# -- input requests --------------------------------------------------------------------------------


def test_elicit_builds_a_form_with_every_field_required_unless_told():
    assert elicit("Ship it?", {"ok": bool, "note": str, "n": int, "x": float}) == {
        "method": "elicitation/create",
        "params": {
            "message": "Ship it?",
            "requestedSchema": {
                "type": "object",
                "properties": {
                    "ok": {"type": "boolean"},
                    "note": {"type": "string"},
                    "n": {"type": "integer"},
                    "x": {"type": "number"},
                },
                "required": ["ok", "note", "n", "x"],
            },
        },
    }
    schema = elicit("Why?", {"why": {"type": "string", "maxLength": 80}}, required=[])["params"]["requestedSchema"]
    assert schema == {"type": "object", "properties": {"why": {"type": "string", "maxLength": 80}}, "required": []}


def test_sample_and_list_roots_build_the_requests_the_client_answers():
    assert sample("Summarize", max_tokens=50, temperature=0.2) == {
        "method": "sampling/createMessage",
        "params": {
            "messages": [{"role": "user", "content": {"type": "text", "text": "Summarize"}}],
            "maxTokens": 50,
            "temperature": 0.2,
        },
    }
    assert list_roots() == {"method": "roots/list", "params": {}}


def test_a_refused_answer_says_which_field_and_what_it_must_be_never_the_value_sent():
    question = elicit("Size?", {"size": {"type": "string", "enum": ["s", "m"]}, "count": int})
    assert answer_problem(question, {"action": "accept", "content": {"size": "s", "count": 2}}) is None
    assert answer_problem(question, {"action": "maybe"}) == "action: Input should be 'accept', 'decline' or 'cancel'"
    wrong_size = answer_problem(question, {"action": "accept", "content": {"size": "secret-xl", "count": 2}})
    assert wrong_size == 'content.size: must satisfy enum ["s", "m"]'
    wrong_count = answer_problem(question, {"action": "accept", "content": {"size": "s", "count": "secret"}})
    assert wrong_count == 'content.count: must satisfy type "integer"'
    assert answer_problem(question, {"action": "accept", "content": {"size": "s"}}) == (
        "content: 'count' is a required property"
    )
    assert answer_problem(list_roots(), {"roots": "secret"}) == "roots: Input should be a valid list"


def test_a_refused_answer_names_no_key_the_client_chose_and_a_schema_it_cannot_read_decides_nothing():
    loose = elicit("Name?", {"name": str})
    loose["params"]["requestedSchema"]["additionalProperties"] = {"type": "integer"}
    extra = answer_problem(loose, {"action": "accept", "content": {"name": "Ada", "secret-key": "v"}})
    assert extra == 'content: must satisfy type "integer"'
    nested = answer_problem(loose, {"action": "accept", "content": {"secret-key": [{"deep": 1}]}})
    assert nested == "content: holds a value of another type than the result's"
    closed = {
        "method": "elicitation/create",
        "params": {"message": "?", "requestedSchema": {"properties": {"a": False}}},
    }
    assert answer_problem(closed, {"action": "accept", "content": {"a": "x"}}) == "content: not allowed"
    dangling = {"method": "elicitation/create", "params": {"message": "?", "requestedSchema": {"$ref": "#/nowhere"}}}
    assert answer_problem(dangling, {"action": "accept", "content": {"a": "x"}}) is None


def test_a_result_set_by_hand_is_the_sdks_and_complete():
    assert tool_result("done") == {
        "content": [{"type": "text", "text": "done"}],
        "isError": False,
        "resultType": "complete",
    }
    with pytest.raises(ValueError, match="resultType"):
        tool_result({"content": [], "resultType": "input_required"})


def test_an_answer_fits_only_the_kind_of_request_it_answers():
    """What tasks/update accepts for an outstanding key: the result type of that request's method."""
    question = elicit("Name?", {"name": str})
    assert answers(question, {"action": "accept", "content": {"name": "Ada"}})
    assert answers(question, {"action": "decline"})
    assert not answers(question, {"action": "bogus"}) and not answers(question, {"roots": []})
    assert answers(list_roots(), {"roots": [{"uri": "file:///tmp"}]}) and not answers(
        list_roots(), {"action": "accept"}
    )
    text = {"role": "assistant", "model": "m", "content": {"type": "text", "text": "hi"}}
    tool_use = {
        "role": "assistant",
        "model": "m",
        "stopReason": "toolUse",
        "content": [{"type": "tool_use", "id": "c1", "name": "lookup", "input": {"q": "x"}}],
    }
    plain = sample("Summarize", max_tokens=50)
    with_tools = sample("Look it up", max_tokens=50, tools=[{"name": "lookup", "inputSchema": {"type": "object"}}])
    assert answers(plain, text) and not answers(plain, tool_use)
    assert answers(with_tools, tool_use) and answers(with_tools, text)


def test_an_accepted_form_fits_only_if_its_content_fits_the_forms_schema():
    question = elicit("Who and how many?", {"name": str, "count": int, "size": {"type": "string", "enum": ["s", "l"]}})
    assert answers(question, {"action": "accept", "content": {"name": "Ada", "count": 2, "size": "s"}})
    for content in (
        {"name": "Ada", "count": "2", "size": "s"},
        {"name": "Ada", "size": "s"},
        {"name": "Ada", "count": 2, "size": "xl"},
    ):
        assert not answers(question, {"action": "accept", "content": content}), content
    assert answers(question, {"action": "decline"}) and answers(question, {"action": "cancel"})
    assert answers(question, {"action": "decline", "content": None}) and answers(question, {"action": "cancel"})
    for action in ("decline", "cancel"):  # content is an accepted answer's only: never past the check to the job
        assert answer_problem(question, {"action": action, "content": {"count": "zz"}}) == (
            f"content: only an accepted answer carries content, not a {action}"
        )
    optional = elicit("Name, and a nickname if any?", {"name": str, "nick": str}, required=["name"])
    assert answers(optional, {"action": "accept", "content": {"name": "Ada", "nick": None}})  # left empty: null
    assert not answers(optional, {"action": "accept", "content": {"name": None}})
    unreadable = {"method": "elicitation/create", "params": {"message": "?", "requestedSchema": {"type": 12}}}
    assert answers(
        unreadable, {"action": "accept", "content": {"any": "thing"}}
    )  # a schema it cannot read decides nothing


@pytest.mark.parametrize(
    "build",
    [
        lambda: elicit("Pick", {"when": list}),  # a field type with no JSON schema
        lambda: sample("Summarize", max_tokens="many"),  # type: ignore[arg-type]
        lambda: validate_input_requests({}),
        lambda: validate_input_requests({"": list_roots()}),
        lambda: validate_input_requests({"k": "roots please"}),
        lambda: validate_input_requests({"k": {"method": "sampling/createMessage", "params": {}}}),
    ],
    ids=["field-type", "max-tokens", "empty", "empty-key", "not-a-mapping", "invalid-params"],
)
def test_a_malformed_input_request_is_refused_in_the_job_that_built_it(build):
    with pytest.raises(InvalidInputRequest):
        build()


def test_each_input_request_names_the_client_capability_it_needs():
    asked = {"a": elicit("?", {"ok": bool}), "b": sample("?", max_tokens=5), "c": list_roots()}
    assert validate_input_requests(asked) == asked
    needs = {key: INPUT_CAPABILITIES[request["method"]] for key, request in asked.items()}
    assert needs == {"a": "elicitation", "b": "sampling", "c": "roots"}
