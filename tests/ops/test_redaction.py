"""Task-id redaction: real ids from `new_task_id` wherever they stand, and what only looks like one is kept."""

from __future__ import annotations

import io
import logging
import uuid
from typing import Any

import pytest

from celery_mcp_tasks.model import new_task_id, task_key
from celery_mcp_tasks.ops.redaction import REDACTED, RedactTaskIds, redact

SHAPED = "Yt3kQ9vLmN2pR7sX4wZ8aB1cD5eF6gH0iJ-_uVoKqEw"
"""43 base64url characters, mixed case, a possible last one: what an id looks like."""


def _record(msg: Any, *args: Any) -> logging.LogRecord:
    return logging.LogRecord("x", logging.INFO, __file__, 1, msg, args or None, None)


def test_every_task_id_is_redacted_wherever_it_stands() -> None:
    for _ in range(2000):
        task_id = new_task_id()
        for text in (task_id, f"task {task_id} done", f'{{"taskId":"{task_id}"}}', f"/mcp?taskId={task_id}&x=1"):
            assert task_id not in redact(text) and REDACTED in redact(text)


@pytest.mark.parametrize(
    "shape",
    ["mcp-{}", "key_{}", "{}_x", "{}-1", "--{}__", "a-{}-b", "job_{}.log", "{}_{}", "{}-{}"],
)
def test_a_task_id_next_to_a_dash_or_an_underscore_is_redacted(shape: str) -> None:
    """`-` and `_` are id characters too: a 43-character window inside a longer base64url run is still found.

    The id and, nearly always, only the id: where a window overlapping it could be an id itself
    (~1% of ids: it ends in a possible last character right before a `-` or `_` of the id), both go.
    """
    exact = 0
    for _ in range(500):
        ids = [new_task_id(), new_task_id()]
        text = shape.format(*ids[: shape.count("{}")])
        cleaned = redact(text)
        assert not any(task_id[-8:] in cleaned for task_id in ids) and REDACTED in cleaned, (text, cleaned)
        exact += cleaned == shape.format(*[REDACTED] * shape.count("{}"))
    assert exact >= 450


def test_an_id_that_begins_with_a_dash_or_underscore_is_found_right_after_a_letter() -> None:
    found = 0
    while found < 100:
        task_id = new_task_id()
        if task_id[0] not in "-_":
            continue
        found += 1
        cleaned = redact(f"task{task_id}")  # its own first character is the separator
        assert task_id[-8:] not in cleaned and cleaned.endswith(REDACTED)


def test_a_window_that_is_not_an_id_never_hides_an_overlapping_one_that_could_be() -> None:
    """Single-case digits and letters, then `-`, then an id-shaped token: the first 43 characters are a
    window too (ending in a possible last character, before `_`), one-case so not an id; it overlaps the id."""
    token = "abcdefghijklmnopqrstuvwxyzabcdek_QRSTUVWXYw"
    assert len(token) == 43 and redact(token) == REDACTED
    assert redact(f"0123456789-{token}") == f"0123456789-{REDACTED}"


@pytest.mark.parametrize(
    "kept",
    [
        task_key("any id"),  # a row key: 64 hex digits
        f"{task_key('one')}_{task_key('two')}-{task_key('three')}",  # row keys joined by id characters
        "8c5b2f7e-1a0d-5f3e-9b4c-2d6e8f0a1b3c",  # a Celery message id (a UUID)
        f"{uuid.uuid4()}-{uuid.uuid4()}_{uuid.uuid4()}",  # UUIDs joined: windows of 43 at their dashes
        f"{str(uuid.uuid4()).upper()}-{str(uuid.uuid4()).upper()}",  # upper-case UUIDs
        "a_rather_long_snake_case_identifier_of_43ch",  # one case only
        SHAPED + "A",  # 44 characters: not an id's shape
        SHAPED[:-1] + "x",  # 43, but an id never ends in `x` (its last character holds 4 bits)
        "celery_mcp_tasks.worker.job.McpJob.signature_from_request",
    ],
    ids=["row-key", "row-keys", "uuid", "uuids", "upper-uuids", "snake-case", "44-chars", "impossible-last", "dotted"],
)
def test_what_only_looks_long_is_kept(kept: str) -> None:
    assert redact(f"see {SHAPED} here") == f"see {REDACTED} here"
    assert redact(f"see {kept} here") == f"see {kept} here"


def test_the_filter_redacts_message_and_traceback_and_keeps_the_template() -> None:
    task_id = new_task_id()
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(RedactTaskIds())
    logger = logging.getLogger("tests.logs.redact")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        logger.warning("unknown task %s", task_id)
        try:
            raise KeyError(task_id)
        except KeyError:
            logger.exception("lookup failed")
    finally:
        logger.removeHandler(handler)
        logger.propagate = True
    written = stream.getvalue()
    assert task_id not in written
    assert f"unknown task {REDACTED}" in written and f"KeyError: '{REDACTED}'" in written


def test_an_id_in_the_template_or_a_non_string_argument_redacts_the_whole_message() -> None:
    task_id = new_task_id()
    for made in (_record(f"task {task_id} %s", "x"), _record("failed: %s", KeyError(task_id))):
        RedactTaskIds().filter(made)
        assert made.args is None and task_id not in made.getMessage() and REDACTED in made.getMessage()
