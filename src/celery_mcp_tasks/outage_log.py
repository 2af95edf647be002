"""What a retrying loop says of a dependency that stops answering: one line per outage, not one per try.

The first failure is a WARNING (with the fix, where the caller knows it), the retries that follow are DEBUG, and
one INFO line says when the dependency answers again. Used by the heartbeats, the change listeners and the poll.
"""

from __future__ import annotations

import logging
import threading


class OutageLog:
    """One outage's log lines for one retrying loop; safe to share between threads."""

    def __init__(self, logger: logging.Logger) -> None:
        self._logger = logger
        self._lock = threading.Lock()  # a failure and a `forget` from another thread never interleave halfway
        self._failing = False

    def failed(self, msg: str, *args: object) -> None:
        """A try failed: WARNING if it is the outage's first, else DEBUG."""
        with self._lock:
            level = logging.DEBUG if self._failing else logging.WARNING
            self._failing = True
        self._logger.log(level, msg, *args)

    def answered(self, msg: str, *args: object) -> None:
        """A try got through: says `msg` (INFO) if it ends an outage, else nothing."""
        with self._lock:
            ended, self._failing = self._failing, False
        if ended:
            self._logger.info(msg, *args)

    def forget(self) -> None:
        """Start afresh, without a line: the next failure is a new outage's first."""
        with self._lock:
            self._failing = False
