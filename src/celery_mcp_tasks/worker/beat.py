"""The janitor's Celery side: its task and its beat schedule (the sweep itself is `celery_mcp_tasks.janitor`).

The beat entry is added in `on_after_configure` (or at once when the app is
already configured) and re-inserted at `beat_init`: either alone can be
clobbered by a user's own `beat_schedule` assignment. Each sweep message
expires after one interval, so sweeps missed while no worker ran do not pile
up. `MCP_TASKS_JANITOR_INTERVAL_S=off` opts out of the schedule; the task
stays registered for a hand-run sweep.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from celery import Celery, signals

logger = logging.getLogger("celery_mcp_tasks.janitor")

JANITOR_TASK = "celery_mcp_tasks.janitor"


def janitor_entry(interval_s: float) -> dict[str, Any]:
    return {"task": JANITOR_TASK, "schedule": interval_s, "options": {"expires": interval_s}}


def install_janitor(app: Celery, run_sweep: Callable[[], Any], interval_s: float | None) -> None:
    @app.task(name=JANITOR_TASK, ignore_result=True, shared=False)  # type: ignore[untyped-decorator]  # Celery ships no types
    def janitor() -> None:
        run_sweep()

    if interval_s is None:
        return
    entry = janitor_entry(interval_s)

    def add(conf: Any) -> None:
        schedule = conf.beat_schedule or {}
        if JANITOR_TASK not in schedule:  # a copy: the default dict may be shared between apps
            conf.beat_schedule = {**schedule, JANITOR_TASK: entry}

    def _add(sender: Celery, **_: Any) -> None:
        add(sender.conf)

    app.on_after_configure.connect(_add, weak=False)  # connected by call, as in the bridge: Celery is untyped

    if app.configured:
        add(app.conf)

    def _ensure(sender: Any = None, **_: Any) -> None:
        scheduler = getattr(sender, "scheduler", None)
        if scheduler is None or scheduler.app is not app or JANITOR_TASK in scheduler.schedule:
            return
        logger.info("re-inserting the janitor into a beat schedule that dropped it")
        scheduler.update_from_dict({JANITOR_TASK: entry})

    signals.beat_init.connect(_ensure, weak=False)
