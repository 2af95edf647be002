"""The Notifier seam: told about every task change, right after the write.

A notifier runs in the process that made the change (a web request, a Celery
worker, the janitor). It must not fail that process: `safe_notify` logs and
swallows whatever it raises. What it sends across processes is only a hint
(the row key and version), never the task id or its result; the receiving
side re-reads the row and re-checks the owner before anything reaches a client.
"""

from __future__ import annotations

import logging
from typing import Protocol

from celery_mcp_tasks.model import TaskRecord

logger = logging.getLogger(__name__)


class Notifier(Protocol):
    def task_changed(self, record: TaskRecord) -> None:
        """Called after `record` was committed. Must be quick; may raise (it is contained)."""
        ...


def listeners_possible(record: TaskRecord) -> bool:
    """False for a record just created: its id has not left the creating process yet,
    so no stream can follow it and a cross-process hint would be wasted on the hot path."""
    return record.version > 1


def safe_notify(notifier: Notifier | None, record: TaskRecord) -> None:
    if notifier is None:
        return
    try:
        notifier.task_changed(record)
    except Exception:  # the seam's contract: a notifier never fails the write's caller
        logger.exception("task notifier raised; the change is stored, listeners may see it late")
