"""Riding out a short task-store outage (a failover, a restart) in the process that runs a job.

A job's claim and its outcome are tried again for a while rather than given up at the first failure: given up,
the task waits in `working` for the stale timeout (five minutes by default) until the janitor sends the job
again, and a claim that failed would have failed the task although nothing ran. The wait is bounded by
`PATIENCE_S` and by half the stale timeout, so the janitor's re-send never races a run still waiting here.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from typing import TypeVar

from celery_mcp_tasks.store.base import StoreUnavailable

PATIENCE_S = 30.0
"""The longest a job's claim or outcome waits for the store."""
_STEPS_S = (0.25, 0.5, 1.0, 2.0, 4.0)  # the waits between tries (the last one repeats)

_T = TypeVar("_T")


def patience_s(stale_timeout_s: float) -> float:
    return min(PATIENCE_S, stale_timeout_s / 2)


def patiently(call: Callable[[], _T], within_s: float, waiting: Callable[[StoreUnavailable, float], None]) -> _T:
    """`call()`, tried again while it raises `StoreUnavailable`, for up to `within_s`; then that exception.
    `waiting(exc, seconds_left)` once, at the first failure that is tried again (for a log line)."""
    deadline = time.monotonic() + within_s
    for step in itertools.chain(_STEPS_S, itertools.repeat(_STEPS_S[-1])):
        try:
            return call()
        except StoreUnavailable as exc:
            if time.monotonic() + step >= deadline:
                raise
            if step == _STEPS_S[0]:
                waiting(exc, deadline - time.monotonic())
            time.sleep(step)
    raise AssertionError("unreachable")  # pragma: no cover - the steps never run out
