"""An `McpTasks` a process drops takes its Celery signal receivers with it: constructing one (a test suite
builds hundreds, an application may build one per tenant) never grows Celery's process-wide signal lists."""

from __future__ import annotations

import gc
import weakref
from pathlib import Path
from typing import Any

from celery import Celery, signals

from celery_mcp_tasks import McpTasks
from celery_mcp_tasks.config import Settings
from celery_mcp_tasks.ops import Prometheus, Tracing

SIGNALS = {
    name: getattr(signals, name)
    for name in (
        "celeryd_init",
        "celeryd_after_setup",
        "beat_init",
        "worker_init",
        "worker_ready",
        "worker_shutdown",
        "worker_process_init",
        "worker_process_shutdown",
    )
}


def live_receivers() -> dict[str, int]:
    def alive(receiver: Any) -> bool:
        return not isinstance(receiver, weakref.ReferenceType) or receiver() is not None

    return {name: sum(alive(receiver) for _, receiver in signal.receivers) for name, signal in SIGNALS.items()}


def build(tmp_path: Path, name: str, plugins: tuple[Any, ...] = (), **settings: Any) -> McpTasks:
    # Not made the current app: Celery keeps its current app in a thread-local, which would hold it.
    celery = Celery(name, set_as_current=False)
    tasks = McpTasks(
        name, celery=celery, settings=Settings(data_dir=tmp_path, **settings), notifier=None, plugins=plugins
    )

    @tasks.mcp_task
    def report() -> str:
        return "ok"

    return tasks


def test_a_dropped_mcptasks_leaves_no_receiver_on_celery_signals(tmp_path: Path) -> None:
    kept = build(tmp_path, "kept")  # whatever a process installs once is installed by now
    gc.collect()  # what earlier tests dropped
    before = live_receivers()

    def opted_in() -> tuple[Any, ...]:
        return (Prometheus(), Tracing(exporter="console"))  # each connects receivers of its own

    for janitor, plugins in (("beat", tuple), ("worker", tuple), ("beat", opted_in)):
        dropped = build(tmp_path, f"dropped-{janitor}", plugins(), janitor=janitor)
        assert live_receivers() != before  # it listens while it lives
        dropped_ref = weakref.ref(dropped)
        del dropped
        gc.collect()
        assert dropped_ref() is None, "something process-wide still holds the dropped McpTasks"
        assert live_receivers() == before
    assert kept.celery.main == "kept"
