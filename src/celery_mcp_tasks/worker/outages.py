"""Riding out a short task-store outage (a failover, a restart) in the process that runs a job.

A job's claim and its outcome are tried again for a while rather than given up at the first failure: given up,
the task waits in `working` for the stale timeout (five minutes by default) until the janitor sends the job
again, and a claim that failed would have failed the task although nothing ran. The wait is bounded by
`PATIENCE_S`, by half the stale timeout (so the janitor's re-send rarely meets a run still waiting here; when it
does, the compare-and-swap lets one of them write) and by what is left of the job's time limits.
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


def patience_s(stale_timeout_s: float, limit_left_s: float | None = None) -> float:
    """How long to wait: `PATIENCE_S`, at most half the stale timeout and, with a time limit, a second short of it."""
    bounds = [PATIENCE_S, stale_timeout_s / 2]
    if limit_left_s is not None:
        bounds.append(limit_left_s - 1.0)
    return max(min(bounds), 0.0)


def patiently(call: Callable[[], _T], within_s: float, waiting: Callable[[StoreUnavailable, float], None]) -> _T:
    """`call()`, tried again while it raises `StoreUnavailable`, the last time at `within_s`; then that exception.
    `waiting(exc, seconds_left)` once, at the first failure that is tried again (for a log line)."""
    deadline = time.monotonic() + within_s
    for n, step in enumerate(itertools.chain(_STEPS_S, itertools.repeat(_STEPS_S[-1]))):
        try:
            return call()
        except StoreUnavailable as exc:
            left = deadline - time.monotonic()
            if left <= 0:
                raise
            if n == 0:
                waiting(exc, left)
            time.sleep(min(step, left))
    raise AssertionError("unreachable")  # pragma: no cover - the steps never run out
