"""What a retrying loop says of a dependency that stops answering: one line per outage, not one per try.

The first failure is a WARNING (with the fix, where the caller knows it; an ERROR where calls fail), the tries
that follow are DEBUG, and one INFO line says when the dependency answers again. Used by the heartbeats, the
change listeners, the poll and the job dispatcher.
"""

from __future__ import annotations

import logging
import threading


class OutageLog:
    """One outage's log lines for one retrying loop; safe to share between threads."""

    def __init__(self, logger: logging.Logger, *, first: int = logging.WARNING) -> None:
        self._logger = logger
        self._first = first  # the level of an outage's first line
        self._lock = threading.Lock()  # a failure and a `forget` from another thread never interleave halfway
        self._failing = False

    def failed(self, msg: str, *args: object) -> None:
        """A try failed: WARNING (or `first`) if it is the outage's first, else DEBUG."""
        with self._lock:
            level = logging.DEBUG if self._failing else self._first
            self._failing = True
        self._logger.log(level, msg, *args, stacklevel=2)  # the line is the caller's

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
