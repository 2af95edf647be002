import re

import pytest

from celery_mcp_tasks.model import (
    DuplicateInputKeys,
    InvalidInputResponse,
    InvalidTransition,
    TaskRecord,
    TaskStatus,
    TerminalTask,
    new_task_id,
    task_key,
)
from celery_mcp_tasks.protocol import format_timestamp, render_create_result, render_task


def record(**changes: object) -> TaskRecord:
    values: dict[str, object] = dict(key="k", owner=None, tool="t", status=TaskStatus.WORKING, created_at=1_000,
                                     updated_at=1_000, ttl_ms=60_000, poll_interval_ms=500)
    values.update(changes)
    return TaskRecord(**values)  # type: ignore[arg-type]


def test_task_id_is_43_char_base64url_and_unique():
    ids = {new_task_id() for _ in range(1000)}
    assert len(ids) == 1000
    assert all(re.fullmatch(r"[A-Za-z0-9_-]{43}", i) for i in ids)


def test_row_key_is_a_one_way_hash_not_the_id():
    task_id = new_task_id()
    assert task_key(task_id) != task_id and len(task_key(task_id)) == 64
    assert task_key(task_id) == task_key(task_id)


def test_timestamps_are_utc_with_milliseconds():
    assert format_timestamp(0) == "1970-01-01T00:00:00.000Z"
    assert format_timestamp(1_790_000_000_123) == "2026-09-21T14:13:20.123Z"


def test_create_result_is_flat_with_only_task_fields():
    result = render_create_result("ID", record(status_message="Queued"))
    assert result == {"resultType": "task", "taskId": "ID", "status": "working", "createdAt": format_timestamp(1000),
                      "lastUpdatedAt": format_timestamp(1000), "ttlMs": 60_000, "pollIntervalMs": 500,
                      "statusMessage": "Queued"}


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
    assert set(render_task("ID", record().cancelled(2000))) == {"taskId", "status", "createdAt", "lastUpdatedAt",
                                                                "ttlMs", "pollIntervalMs", "statusMessage"}


@pytest.mark.parametrize("final", ["completed", "failed", "cancelled"])
def test_terminal_states_are_final(final):
    ended = {"completed": lambda r: r.completed({"content": []}, 2),
             "failed": lambda r: r.failed({"code": -32603, "message": "x"}, 2),
             "cancelled": lambda r: r.cancelled(2)}[final](record())
    for move in (lambda r: r.with_progress("x", 3), lambda r: r.completed({}, 3), lambda r: r.cancelled(3),
                 lambda r: r.failed({"code": 1, "message": "m"}, 3),
                 lambda r: r.requiring_input({"a": {}}, 3)):
        with pytest.raises(TerminalTask):
            move(ended)


def test_every_transition_bumps_the_version_and_last_updated():
    nxt = record().with_progress("half way", 5000)
    assert nxt.version == 2 and nxt.updated_at == 5000 and nxt.status_message == "half way"


def test_partial_answer_keeps_remaining_keys_then_last_answer_resumes():
    asked = record().requiring_input({"a": {"m": 1}, "b": {"m": 2}}, 2)
    partial, resumed = asked.answered({"a": {"action": "accept"}, "zzz": {"ignored": True}}, 3)
    assert not resumed and partial.status is TaskStatus.INPUT_REQUIRED and list(partial.input_requests) == ["b"]
    assert partial.input_responses == {"a": {"action": "accept"}}
    done, resumed = partial.answered({"b": {"action": "decline"}}, 4)
    assert resumed and done.status is TaskStatus.WORKING and done.input_requests == {}
    assert set(done.input_responses) == {"a", "b"}


def test_answers_for_nothing_outstanding_change_nothing():
    with pytest.raises(InvalidTransition):
        record().answered({"a": {}}, 3)
    asked = record().requiring_input({"a": {}}, 2)
    with pytest.raises(InvalidTransition):
        asked.answered({"other": {}}, 3)


def test_input_keys_are_single_use_for_the_whole_life():
    asked = record().requiring_input({"a": {}}, 2)
    resumed, _ = asked.answered({"a": {}}, 3)
    with pytest.raises(DuplicateInputKeys) as raised:
        resumed.requiring_input({"a": {}, "b": {}}, 4)
    assert raised.value.keys == ["a"]


def test_only_answers_to_outstanding_keys_must_be_objects():
    asked = record().requiring_input({"a": {}}, 2)
    with pytest.raises(InvalidInputResponse):
        asked.answered({"a": "yes"}, 3)
    nxt, resumed = asked.answered({"a": {"action": "accept"}, "stranger": "not checked"}, 3)
    assert resumed and "stranger" not in nxt.input_responses
