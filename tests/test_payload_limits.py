"""Payload limits in the service, on a real store: over the limit, nothing is created or changed,
and a result over it ends the task `failed` naming the limit, with nothing of the result kept."""

from __future__ import annotations

import json
import logging
from types import MappingProxyType

import pytest
import sqlalchemy as sa

from celery_mcp_tasks.model import TaskStatus
from celery_mcp_tasks.service import PayloadLimits, PayloadTooLarge, TaskService
from celery_mcp_tasks.store import codec
from celery_mcp_tasks.store.codec import MAX_NESTING, PayloadTooDeep, payload_bytes, too_deep
from celery_mcp_tasks.store.sql import SqlStore

ELICIT = {"method": "elicitation/create", "params": {"message": "ok?", "requestedSchema": {"type": "object"}}}
LIMITS = {"small": PayloadLimits(arguments=64, answers=64, result=128), "free": PayloadLimits()}


@pytest.fixture
def service(store: SqlStore) -> TaskService:
    return TaskService(store, limits=LIMITS.__getitem__)


def test_arguments_over_the_limit_create_nothing(service: TaskService, caplog: pytest.LogCaptureFixture):
    big = {"text": "x" * 100}
    with caplog.at_level(logging.WARNING), pytest.raises(PayloadTooLarge) as refused:
        service.create(owner=None, tool="small", arguments=big)
    message = str(refused.value)
    assert message == (
        f"Arguments too large: {payload_bytes(big)} bytes, over the limit of 64 bytes "
        "(MCP_TASKS_MAX_ARGUMENTS_BYTES, or @mcp_task(max_arguments_bytes=...))"
    )
    assert sum(service.store.count_by_status().values()) == 0
    assert "over the limit of 64 bytes" in caplog.text and "xxxx" not in caplog.text
    _, record = service.create(owner=None, tool="free", arguments=big)  # another tool, no limit
    assert record.arguments == big


def test_arguments_at_the_limit_are_accepted(service: TaskService):
    fits = {"t": "x" * (64 - payload_bytes({"t": ""}))}
    assert payload_bytes(fits) == 64
    _, record = service.create(owner=None, tool="small", arguments=fits)
    assert service.store.get(record.key).arguments == fits


def test_answers_over_the_limit_change_nothing(service: TaskService):
    task_id, record = service.create(owner="sub:a", tool="small", arguments={})
    asking = service.require_input(record.key, {"q": ELICIT})
    with pytest.raises(PayloadTooLarge, match=r"^Answers too large: \d+ bytes, over the limit of 64 bytes"):
        service.answer(task_id, "sub:a", {"q": {"action": "accept", "content": {"x": "y" * 80}}})
    after = service.store.get(record.key)
    assert after == asking and after.status is TaskStatus.INPUT_REQUIRED
    answered = service.answer(task_id, "sub:a", {"q": {"action": "accept", "content": {"x": "y"}}})
    assert answered.status is TaskStatus.WORKING and answered.input_responses["q"]["content"] == {"x": "y"}


def test_answers_given_before_the_task_existed_are_held_to_the_answers_limit(service: TaskService):
    """`prepare=` seeds a new task with the client's answers: the same limit as answers to `tasks/update`."""
    big = {"q": {"action": "accept", "content": {"x": "y" * 80}}}
    with pytest.raises(PayloadTooLarge, match=r"^Answers too large: \d+ bytes, over the limit of 64 bytes"):
        service.create(owner=None, tool="small", arguments={}, input_responses=big)
    assert sum(service.store.count_by_status().values()) == 0
    fits = {"q": {"action": "accept", "content": {"x": "y"}}}
    _, record = service.create(owner=None, tool="small", arguments={}, input_responses=fits)
    assert record.input_responses == fits


def test_a_result_over_the_limit_fails_the_task_naming_it_and_keeps_none_of_it(
    service: TaskService, caplog: pytest.LogCaptureFixture
):
    _, record = service.create(owner=None, tool="small", arguments={})
    result = {"content": [{"type": "text", "text": "z" * 200}]}
    with caplog.at_level(logging.WARNING):
        done = service.complete(record.key, result, expected=record)
    stored = service.store.get(record.key)
    assert stored == done and done.status is TaskStatus.FAILED and done.result is None
    assert done.error == {
        "message": f"The job's result was not stored: Result too large: {payload_bytes(result)} bytes, over the "
        "limit of 128 bytes (MCP_TASKS_MAX_RESULT_BYTES, or @mcp_task(max_result_bytes=...))"
    }
    assert "over the limit of 128 bytes" in caplog.text and "zzzz" not in caplog.text


def test_an_error_over_the_limits_keeps_its_code_and_its_message_start(service: TaskService):
    """`ctx.fail(error)` and a job's `MCPError`: the error is the failed task's outcome, held as a result is,
    by size and by depth (one nested past what Python's encoder recurses is refused, not raised)."""
    nested: object = "leaf"
    for _ in range(2_000):
        nested = [nested]
    for tool, data, reason in [("small", "d" * 200, "Error too large"), ("free", nested, "Error nested too deeply")]:
        _, record = service.create(owner=None, tool=tool, arguments={})
        done = service.fail(record.key, {"code": -32000, "message": "m" * 600, "data": data}, "Job failed")
        assert done.status is TaskStatus.FAILED and done.error is not None and set(done.error) == {"code", "message"}
        assert done.error["message"].startswith("m" * 500 + f" (the rest was not stored: {reason}"), done.error


def test_a_result_within_the_limit_completes(service: TaskService):
    _, record = service.create(owner=None, tool="small", arguments={})
    done = service.complete(record.key, {"content": []})
    assert done.status is TaskStatus.COMPLETED and done.result == {"content": []}


def test_the_size_measured_is_the_size_the_column_holds(service: TaskService, store: SqlStore):
    """The limit sees what is written: the compact JSON encoding (the engine's JSON serializer is `codec.encode`)."""
    arguments = {"t": "é" * 10, "n": [1, 2]}
    _, record = service.create(owner=None, tool="small", arguments=arguments)
    with store.engine.connect() as conn:
        query = sa.text("SELECT CAST(arguments AS TEXT) FROM mcp_tasks_task WHERE key = :k")
        text = conn.execute(query, {"k": record.key}).scalar_one()
    assert len(text.encode()) == payload_bytes(arguments) and json.loads(text) == arguments


def test_encode_is_compact() -> None:
    result = {"content": [{"type": "text", "text": "ok"}]}
    text = codec.encode(result)
    assert text == '{"content":[{"type":"text","text":"ok"}]}' and len(text.encode()) == payload_bytes(result)
    assert codec.encode(None) == "null" and codec.encode({}) == "{}" and codec.encode(()) == "[]"


def nested(levels: int) -> list[object]:
    """`levels` arrays, each inside the one before: `[[[...]]]`."""
    value: list[object] = []
    for _ in range(levels - 1):
        value = [value]
    return value


def test_nesting_is_counted_in_objects_and_arrays_alike() -> None:
    """In what `encode` writes as JSON objects and arrays: another Mapping is written as a string."""
    assert not too_deep(nested(MAX_NESTING)) and too_deep(nested(MAX_NESTING + 1))
    assert too_deep((nested(MAX_NESTING),)) and not too_deep(MappingProxyType({"a": nested(MAX_NESTING)}))
    assert not too_deep({"a": nested(MAX_NESTING - 1)}) and too_deep({"a": {"b": nested(MAX_NESTING - 1)}})
    assert not too_deep("[" * 1000) and not too_deep(None) and not too_deep({})
    wide = {str(i): [{"x": [i]}] for i in range(1000)}  # wide, not deep
    assert not too_deep(wide)


@pytest.mark.parametrize("limits", [LIMITS.__getitem__, None], ids=["limits", "no limits"])
def test_payloads_nested_too_deeply_are_refused_whatever_the_limits(
    store: SqlStore, limits: object, caplog: pytest.LogCaptureFixture
) -> None:
    """A few hundred brackets (~1 KB) would stop a prefork worker at every redelivery (its pool pickles the
    arguments) or leave a row no process can parse: refused like a payload over its limit, nothing stored. A
    job's result too: the SDK's client parses ~190 levels, and a task completed with a deeper result was one no
    client could read (`call` asked for it again and again); it fails, saying why."""
    service = TaskService(store, limits=limits)  # type: ignore[arg-type]
    deep = {"ok": "yes", "extra": nested(500)}
    with caplog.at_level(logging.WARNING), pytest.raises(PayloadTooDeep) as refused:
        service.create(owner=None, tool="free", arguments=deep)
    assert str(refused.value) == (f"Arguments nested too deeply: more than {MAX_NESTING} levels of objects and arrays")
    assert isinstance(refused.value, PayloadTooLarge)  # refused wherever a payload too large is
    with pytest.raises(PayloadTooDeep, match=r"^Answers nested too deeply"):
        service.create(owner=None, tool="free", arguments={}, input_responses={"q": deep})
    assert sum(store.count_by_status().values()) == 0
    assert "a creation was refused: Arguments nested too deeply" in caplog.text

    task_id, record = service.create(owner="sub:a", tool="free", arguments={"ok": "yes"})
    asking = service.require_input(record.key, {"q": ELICIT})
    with pytest.raises(PayloadTooDeep, match=r"^Answers nested too deeply"):
        service.answer(task_id, "sub:a", {"q": {"action": "accept", "content": {"x": "y"}, "extra": nested(500)}})
    assert store.get(record.key) == asking

    resumed = service.answer(task_id, "sub:a", {"q": {"action": "accept", "content": {"x": "y"}}})
    tree = {"content": [], "structuredContent": {"tree": nested(200)}}
    failed = service.complete(record.key, tree, expected=resumed)
    assert failed.status is TaskStatus.FAILED and failed.result is None
    assert failed.status_message == (
        f"The job's result was not stored: Result nested too deeply: more than {MAX_NESTING} levels of objects and "
        "arrays"
    )
