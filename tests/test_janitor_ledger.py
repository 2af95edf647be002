"""The sweep on SQLite and PostgreSQL records itself, ends unanswered questions, and warns near the cap."""

from __future__ import annotations

import logging
import time
from typing import Any

import pytest
import sqlalchemy as sa

from celery_mcp_tasks.config import Settings
from celery_mcp_tasks.model import TaskRecord, TaskStatus, now_ms
from celery_mcp_tasks.service import TaskService
from celery_mcp_tasks.store.sql import SqlStore
from celery_mcp_tasks.worker.janitor import SweepReport, input_timeout_message, sweep
from tests.test_janitor import MINUTE, Sends, add

HOUR_S = 3600.0
SETTINGS = Settings(stale_timeout_s=60, input_timeout_s=HOUR_S)


class Seen:
    """An observer: what changed, as the metrics and traces would hear it."""

    def __init__(self) -> None:
        self.changes: list[tuple[TaskRecord | None, TaskRecord]] = []

    def task_changed(self, before: TaskRecord | None, after: TaskRecord) -> None:
        self.changes.append((before, after))


def service(store: SqlStore, **kwargs: Any) -> TaskService:
    return TaskService(store, dispatcher=Sends(), **kwargs)


def asking(store: SqlStore, key: str, *, quiet_ms: int, **changes: Any) -> TaskRecord:
    """An `input_required` task whose last change was `quiet_ms` ago."""
    values: dict[str, Any] = {
        "status": TaskStatus.INPUT_REQUIRED,
        "input_requests": {"q": {"method": "elicitation/create"}},
        "issued_keys": ("q",),
        "ttl_ms": None,
    }
    values.update(changes)
    return add(store, key, age_ms=quiet_ms, **values)


# -- the ledger -------------------------------------------------------------------------------


def test_every_sweep_records_its_time_counts_and_statuses(store: SqlStore) -> None:
    add(store, "gone", age_ms=2 * MINUTE, ttl_ms=MINUTE)
    add(store, "busy")
    before = now_ms()
    report = sweep(service(store), SETTINGS)
    sweep(service(store), SETTINGS)
    last = service(store).ledger().last()
    assert report == SweepReport(removed=1)
    assert last is not None and last.sweeps == 2
    assert last.swept_at is not None and before <= last.swept_at <= now_ms()
    assert last.duration_ms is not None and last.duration_ms >= 0
    assert last.report == {"removed": 0, "resent": 0, "failed": 0, "expired_inputs": 0}  # the last sweep's
    assert last.statuses == {"working": 1, "input_required": 0, "completed": 0, "failed": 0, "cancelled": 0}


def test_a_sweeps_start_is_before_its_count_however_late_its_record(store: SqlStore) -> None:
    """The row cap counts the rows created since the sweep began on top of its count (`store.quotas.RowBase`):
    a record that waited for a connection must not move that start past the count, or a row created between
    them is counted by neither."""
    janitor = service(store)
    sweep(janitor, SETTINGS)  # the ledger's row, and its clock, exist from here on
    ledger = janitor.ledger()
    counted_at: list[int] = []
    count = janitor.count_by_status
    write = ledger.record

    def count_then_read_the_clock() -> dict[str, int]:
        statuses = count()
        clock = ledger.last()
        assert clock is not None and clock.read_at is not None
        counted_at.append(clock.read_at)
        return statuses

    def record_late(*args: Any, **kwargs: Any) -> None:
        time.sleep(0.3)  # a wait for a pooled connection: the database's clock moves on meanwhile
        write(*args, **kwargs)

    janitor.count_by_status = count_then_read_the_clock  # type: ignore[method-assign]
    janitor.ledger = lambda: ledger  # type: ignore[method-assign]
    ledger.record = record_late  # type: ignore[method-assign]
    sweep(janitor, SETTINGS)
    last = ledger.last()
    assert last is not None and last.swept_at is not None and last.sweeps == 2
    assert last.swept_at <= counted_at[0]


def test_a_sweep_whose_record_cannot_be_written_still_reports(
    store: SqlStore, caplog: pytest.LogCaptureFixture
) -> None:
    add(store, "gone", age_ms=2 * MINUTE, ttl_ms=MINUTE)
    with store.engine.begin() as conn:
        conn.execute(sa.text("DROP TABLE mcp_tasks_sweep"))
    with caplog.at_level(logging.WARNING, logger="celery_mcp_tasks.janitor"):
        assert sweep(service(store), SETTINGS) == SweepReport(removed=1)
    assert [r.getMessage() for r in caplog.records] == [
        "could not record the janitor sweep in the store: StoreUnavailable"
    ]


# -- the input timeout ------------------------------------------------------------------------


def test_a_question_nobody_answered_within_the_timeout_fails_the_task(store: SqlStore) -> None:
    seen = Seen()
    asking(store, "forgotten", quiet_ms=int(HOUR_S * 1000) + MINUTE)
    asking(store, "recent", quiet_ms=MINUTE)
    report = sweep(service(store, observer=seen), SETTINGS)
    assert report == SweepReport(expired_inputs=1)
    failed = store.get("forgotten")
    assert failed is not None and failed.status is TaskStatus.FAILED
    assert failed.status_message == "No answer to the input request within 1h"
    assert failed.error == {"message": "No answer to the input request within 1h"}
    assert failed.input_requests == {}
    assert store.get("recent").status is TaskStatus.INPUT_REQUIRED  # type: ignore[union-attr]
    ((before, after),) = seen.changes
    assert before is not None and before.status is TaskStatus.INPUT_REQUIRED and after.status is TaskStatus.FAILED
    assert sweep(service(store), SETTINGS) == SweepReport()  # final: a second sweep leaves it alone


def test_an_expired_question_without_ttl_leaves_after_the_retention(store: SqlStore) -> None:
    """How an unlimited task stops holding a row-cap slot: failed by the timeout, then evicted."""
    asking(store, "forgotten", quiet_ms=int(HOUR_S * 1000) + MINUTE)
    sweep(service(store), SETTINGS)
    assert store.get("forgotten") is not None  # failed, kept for the retention so the client can read why
    sweep(service(store), Settings(stale_timeout_s=60, input_timeout_s=HOUR_S, retention_ms=0))
    assert store.get("forgotten") is None


def test_without_an_input_timeout_a_question_waits_forever(store: SqlStore) -> None:
    asking(store, "patient", quiet_ms=365 * 24 * 3_600_000)
    assert sweep(service(store), Settings(input_timeout_s=None)) == SweepReport()
    assert store.get("patient").status is TaskStatus.INPUT_REQUIRED  # type: ignore[union-attr]


def test_an_answer_that_lands_first_wins_over_the_timeout(store: SqlStore) -> None:
    asking(store, "answered", quiet_ms=int(HOUR_S * 1000) + MINUTE)
    bound = now_ms() - int(HOUR_S * 1000)
    svc = service(store)
    svc.answer_by_key("answered", {"q": {"action": "accept", "content": {}}})
    assert svc.expire_input("answered", changed_before_ms=bound, message="late") is False
    assert store.get("answered").status is TaskStatus.WORKING  # type: ignore[union-attr]


def test_a_partial_answer_starts_the_clock_again(store: SqlStore) -> None:
    two = {"a": {"method": "elicitation/create"}, "b": {"method": "elicitation/create"}}
    asking(store, "halfway", quiet_ms=int(HOUR_S * 1000) + MINUTE, input_requests=two, issued_keys=("a", "b"))
    service(store).answer_by_key("halfway", {"a": {"action": "accept", "content": {}}})
    assert sweep(service(store), SETTINGS) == SweepReport()
    assert store.get("halfway").status is TaskStatus.INPUT_REQUIRED  # type: ignore[union-attr]


def test_expired_questions_are_taken_in_batches(store: SqlStore) -> None:
    for n in range(7):
        asking(store, f"q{n}", quiet_ms=int(HOUR_S * 1000) + MINUTE)
    assert sweep(service(store), SETTINGS, batch_size=3).expired_inputs == 7


@pytest.mark.parametrize(
    ("seconds", "said"), [(86400, "24h"), (3600, "1h"), (1800, "30min"), (90, "90s"), (1.5, "1.5s"), (5400, "90min")]
)
def test_the_timeout_message_says_the_timeout_as_a_person_would(seconds: float, said: str) -> None:
    assert input_timeout_message(seconds) == f"No answer to the input request within {said}"


# -- the row cap ------------------------------------------------------------------------------


def test_a_sweep_warns_at_ninety_percent_of_the_row_cap_naming_the_setting(
    store: SqlStore, caplog: pytest.LogCaptureFixture
) -> None:
    for n in range(8):
        add(store, f"t{n}")
    with caplog.at_level(logging.WARNING, logger="celery_mcp_tasks.janitor"):
        sweep(service(store), Settings(max_rows=10))
    assert caplog.records == []
    add(store, "t8")
    with caplog.at_level(logging.WARNING, logger="celery_mcp_tasks.janitor"):
        sweep(service(store), Settings(max_rows=10))
    (line,) = caplog.records
    assert line.levelname == "WARNING"
    assert "9 tasks, 90% of MCP_TASKS_MAX_ROWS=10" in line.getMessage()
    assert "t8" not in caplog.text
