"""The row cap's count is taken at most once a second per process, and paid in the INSERT only near the cap."""

from __future__ import annotations

import pytest

from celery_mcp_tasks.store.quotas import ROOM_CHECK_S, RowGauge


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Counter:
    """The rows the store holds, and how many times they were counted."""

    def __init__(self, rows: int) -> None:
        self.rows, self.counts = rows, 0

    def __call__(self) -> int:
        self.counts += 1
        return self.rows


def test_the_rows_are_counted_once_a_second_at_most() -> None:
    clock, rows = Clock(), Counter(10)
    gauge = RowGauge(clock)
    assert not gauge.must_count(1_000, rows) and rows.counts == 1  # never counted: counted now
    clock.now += ROOM_CHECK_S / 2
    assert not gauge.must_count(1_000, rows) and rows.counts == 1
    clock.now += ROOM_CHECK_S / 2
    assert not gauge.must_count(1_000, rows) and rows.counts == 2


def test_a_creation_counts_in_its_insert_within_a_tenth_of_the_cap() -> None:
    assert not RowGauge(Clock()).must_count(100, Counter(89))
    assert RowGauge(Clock()).must_count(100, Counter(90))
    assert RowGauge(Clock()).must_count(1, Counter(0))  # a cap of one: every creation counts
    assert not RowGauge(Clock()).must_count(3, Counter(1))
    assert RowGauge(Clock()).must_count(3, Counter(2))


def test_this_process_s_creations_since_the_count_move_the_estimate() -> None:
    rows, gauge = Counter(85), RowGauge(Clock())
    assert not gauge.must_count(100, rows)
    for _ in range(4):
        gauge.created()
    assert not gauge.must_count(100, rows)  # 89
    gauge.created()
    assert gauge.must_count(100, rows) and rows.counts == 1  # 90, without another count


def test_a_count_that_failed_is_taken_again_by_the_next_creation() -> None:
    gauge = RowGauge(Clock())

    def broken() -> int:
        raise OSError("the database went away")

    with pytest.raises(OSError, match="went away"):
        gauge.must_count(100, broken)
    rows = Counter(5)
    assert not gauge.must_count(100, rows) and rows.counts == 1
