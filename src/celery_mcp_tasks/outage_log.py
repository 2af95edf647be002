"""What a retrying loop says of a dependency that stops answering: one line per outage, not one per try.

The first failure is a WARNING (with the fix, where the caller knows it; an ERROR where calls fail), the tries
that follow are DEBUG, and one INFO line says when the dependency answers again. Used by the heartbeats, the
change listeners, the poll and the job dispatcher.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

REMIND_S = 300.0
"""A failure is said at the first level again once this long has passed since the last time it was."""


class OutageLog:
    """One outage's log lines for one retrying loop; safe to share between threads."""

    def __init__(
        self,
        logger: logging.Logger,
        *,
        first: int = logging.WARNING,
        again_after_s: float = REMIND_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._logger = logger
        self._first = first  # the level of an outage's first line
        self._again_after_s = again_after_s
        self._clock = clock
        self._lock = threading.Lock()  # a failure and a `forget` from another thread never interleave halfway
        self._failing = False
        self._said_at = float("-inf")  # when a failure was last said at `first`

    def failed(self, msg: str, *args: object) -> None:
        """A try failed: WARNING (or `first`) if it is the outage's first, or the first for `again_after_s` (the
        outage goes on, or it ended without a try that got through and this is the next), else DEBUG."""
        with self._lock:
            now = self._clock()
            level = logging.DEBUG if self._failing and now - self._said_at < self._again_after_s else self._first
            if level != logging.DEBUG:
                self._said_at = now
            self._failing = True
        self._logger.log(level, msg, *args, stacklevel=2)  # the line is the caller's

    @property
    def failing(self) -> bool:
        """Whether the last try failed (a hint for callers whose line costs something to build)."""
        return self._failing

    def answered(self, msg: str, *args: object) -> None:
        """A try got through: says `msg` (INFO) if it ends an outage, else nothing."""
        with self._lock:
            ended, self._failing = self._failing, False
        if ended:
            self._logger.info(msg, *args, stacklevel=2)

    def forget(self) -> None:
        """Start afresh, without a line: the next failure is a new outage's first."""
        with self._lock:
            self._failing = False
