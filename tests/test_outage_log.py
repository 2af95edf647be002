"""A retrying loop says an outage once, its retries at DEBUG, and its end once."""

from __future__ import annotations

import logging

import pytest

from celery_mcp_tasks.outage_log import OutageLog

logger = logging.getLogger("tests.outage_log")


def _said(caplog: pytest.LogCaptureFixture) -> list[tuple[str, str]]:
    return [(r.levelname, r.getMessage()) for r in caplog.records if r.name == logger.name]


def test_an_outage_is_one_warning_its_retries_debug_and_its_end_one_line(caplog: pytest.LogCaptureFixture) -> None:
    outage = OutageLog(logger)
    with caplog.at_level(logging.DEBUG, logger=logger.name):
        outage.answered("back")  # no outage yet: nothing to say
        outage.failed("down (%s)", "A")
        outage.failed("down (%s)", "B")
        outage.answered("back")
        outage.answered("back")
        outage.failed("down (%s)", "C")
    assert _said(caplog) == [
        ("WARNING", "down (A)"),
        ("DEBUG", "down (B)"),
        ("INFO", "back"),
        ("WARNING", "down (C)"),
    ]


def test_forget_makes_the_next_failure_a_new_outages_first_without_a_line(caplog: pytest.LogCaptureFixture) -> None:
    outage = OutageLog(logger)
    with caplog.at_level(logging.DEBUG, logger=logger.name):
        outage.failed("down")
        outage.forget()
        outage.answered("back")
        outage.failed("down")
    assert _said(caplog) == [("WARNING", "down"), ("WARNING", "down")]


def test_a_failure_long_after_the_last_one_said_is_said_again(caplog: pytest.LogCaptureFixture) -> None:
    """A long outage is recalled every few minutes; and a dependency that came back with no try in between
    (the broker of a quiet server) and went away again hours later is not a DEBUG line of the old outage."""
    now = [0.0]
    outage = OutageLog(logger, again_after_s=300, clock=lambda: now[0])
    with caplog.at_level(logging.DEBUG, logger=logger.name):
        for at in (0.0, 100.0, 299.0, 300.0, 301.0, 10_000.0):
            now[0] = at
            outage.failed("down at %g", at)
    assert _said(caplog) == [
        ("WARNING", "down at 0"),
        ("DEBUG", "down at 100"),
        ("DEBUG", "down at 299"),
        ("WARNING", "down at 300"),
        ("DEBUG", "down at 301"),
        ("WARNING", "down at 10000"),
    ]
