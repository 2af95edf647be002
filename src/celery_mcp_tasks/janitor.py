"""The janitor's sweep: evict expired tasks, settle tasks whose job was lost.

Idempotent and safe to run twice at once (every write is a compare-and-swap;
eviction takes bounded batches). It reports counts as a log event and through
an optional metric hook, never task ids.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass

from celery_mcp_tasks.config import Settings
from celery_mcp_tasks.model import TerminalTask, now_ms
from celery_mcp_tasks.service import TaskService, internal_error
from celery_mcp_tasks.store.base import TaskNotFound

logger = logging.getLogger("celery_mcp_tasks.janitor")

MetricHook = Callable[[str, dict[str, int]], None]


@dataclass(frozen=True)
class SweepReport:
    removed: int = 0
    redispatched: int = 0
    failed: int = 0


def sweep(service: TaskService, settings: Settings, *, batch_size: int = 1000,
          metric: MetricHook | None = None, max_dispatches: Callable[[str], int] | None = None) -> SweepReport:
    at = now_ms()
    removed = service.store.cleanup(now_ms=at, retention_ms=settings.retention_ms, batch_size=batch_size)
    redispatched = failed = 0
    stale_before = at - int(settings.stale_timeout_s * 1000)
    for record in service.store.stale(heartbeat_before_ms=stale_before, limit=batch_size):
        limit = max_dispatches(record.tool) if max_dispatches else settings.max_dispatches
        try:
            if record.dispatches < limit:
                service.redispatch(record.key, f"Restarted after the job was lost (attempt {record.dispatches + 1})")
                redispatched += 1
            else:
                message = f"The job was lost: no worker reported for {settings.stale_timeout_s:g}s after {record.dispatches} attempt(s)"
                service.fail(record.key, internal_error(message), message)
                failed += 1
        except (TerminalTask, TaskNotFound):
            continue  # settled meanwhile: nothing to do
    report = SweepReport(removed=removed, redispatched=redispatched, failed=failed)
    logger.info("janitor sweep: removed=%d redispatched=%d failed=%d", removed, redispatched, failed)
    if metric is not None:
        try:
            metric("celery_mcp_tasks.janitor.sweep", asdict(report))
        except Exception:
            logger.exception("janitor metric hook raised")
    return report
