"""The row cap's count: in a creation's INSERT once a second, or near the cap; a creation is one statement."""

from __future__ import annotations

from celery_mcp_tasks.store.quotas import ROOM_CHECK_S, RowGauge


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def counted(gauge: RowGauge, max_rows: int, rows: int) -> None:
    """A creation whose INSERT counts `rows` and stores its row."""
    capped, mark = gauge.plan(max_rows)
    assert capped and mark is not None
    gauge.counted(rows, mark)
    gauge.created()


def test_the_rows_are_counted_once_a_second_far_from_the_cap() -> None:
    clock = Clock()
    gauge = RowGauge(clock)
    counted(gauge, 1_000, 10)  # never counted: this INSERT counts, and says what it saw
    clock.now += ROOM_CHECK_S / 2
    assert gauge.plan(1_000) == (False, None)  # a plain INSERT
    clock.now += ROOM_CHECK_S / 2
    assert gauge.plan(1_000)[0]


def test_near_the_cap_every_insert_counts_and_this_process_s_creations_move_the_estimate() -> None:
    gauge = RowGauge(Clock())
    counted(gauge, 100, 85)  # 86 with this one
    for _ in range(4):  # 86, 87, 88, 89
        assert gauge.plan(100) == (False, None)
        gauge.created()
    assert gauge.plan(100) == (True, None)  # 90: within a tenth of the cap, counted in the INSERT
    tiny = RowGauge(Clock())
    counted(tiny, 1, 0)
    assert tiny.plan(1)[0]  # a cap of one: every creation counts


def test_a_count_planned_before_the_last_one_does_not_replace_it() -> None:
    gauge = RowGauge(Clock())
    _, early = gauge.plan(100)
    gauge.created()
    gauge.uncounted()  # e.g. the store was down: the next creation counts again
    _, late = gauge.plan(100)
    assert early is not None and late is not None and late > early
    gauge.counted(20, late)
    gauge.counted(95, early)  # an older count, arriving last
    assert gauge.plan(100) == (False, None)  # still 20 + 0 created since the late count was planned


def test_an_insert_that_failed_to_count_makes_the_next_one_count() -> None:
    gauge = RowGauge(Clock())
    counted(gauge, 100, 5)
    assert gauge.plan(100) == (False, None)
    gauge.uncounted()
    assert gauge.plan(100)[0]


def test_a_process_counts_again_after_a_tenth_of_the_cap_of_its_own_creations() -> None:
    """Two web processes that both counted an empty store would each create 90 % of the cap unseen by the other
    (a review saw 87 rows under a cap of 50): each counts again after a tenth of the cap of its own creations."""
    gauge = RowGauge(Clock())  # the clock stands still: only the creations can make it count again
    counted(gauge, 50, 0)
    for _ in range(4):  # 1 + 4 = 5 created since that count was planned: a tenth of 50
        assert gauge.plan(50) == (False, None)
        gauge.created()
    capped, mark = gauge.plan(50)
    assert capped and mark == 5
    gauge.counted(30, mark)  # the other process's creations, seen now
    gauge.created()
    for _ in range(4):  # 31..34
        assert gauge.plan(50) == (False, None)
        gauge.created()
    assert gauge.plan(50) == (True, 10)  # five more of its own: it counts again
