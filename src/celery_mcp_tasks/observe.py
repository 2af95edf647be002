"""The Observer seam: told of every committed change as (before, after), for metrics, traces and logs.

It runs in the process that wrote and must not fail it (`safe_observe`). Pure: no I/O, wire, Celery or SDK.
"""

from __future__ import annotations

import logging
from typing import Protocol

from celery_mcp_tasks.model import TaskRecord

logger = logging.getLogger(__name__)


class Observer(Protocol):
    def task_changed(self, before: TaskRecord | None, after: TaskRecord) -> None:
        """`after` was committed; `before` is the row it replaced (None: `after` was just created)."""


def safe_observe(observer: Observer | None, before: TaskRecord | None, after: TaskRecord) -> None:
    if observer is None:
        return
    try:
        observer.task_changed(before, after)
    except Exception:  # the seam's contract: observing never fails the write's caller
        logger.exception("task observer raised; the change is stored")


class Observers(list[Observer]):
    """Every observer the composition root installed, heard in order; one that raises never stops the rest."""

    def task_changed(self, before: TaskRecord | None, after: TaskRecord) -> None:
        for observer in self:
            safe_observe(observer, before, after)
