"""An `McpTasks` lives as long as its Celery app, and its receivers on Celery's process-wide signals with it:
building many (a test suite builds hundreds, an application one per tenant) does not keep them all alive."""

from __future__ import annotations

import gc
import weakref
from pathlib import Path
from typing import Any

from celery import Celery, signals

from celery_mcp_tasks import McpTasks
from celery_mcp_tasks.config import Settings
from celery_mcp_tasks.ops import Prometheus, Tracing
from celery_mcp_tasks.worker.janitor import JANITOR_TASK

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


STARTUP = {"celeryd_init": 1, "celeryd_after_setup": 1, "beat_init": 1}  # the checks and the banner
DISPATCHER = {"worker_ready": 1}  # the pool warnings
BEAT_JANITOR = {"beat_init": 1}
WORKER_JANITOR = {"worker_ready": 1, "worker_shutdown": 1}
METRICS = {"celeryd_init": 1, "celeryd_after_setup": 1, "worker_process_shutdown": 1, "worker_shutdown": 1}
TRACING = {"worker_init": 1, "worker_process_init": 1, "worker_process_shutdown": 1, "worker_shutdown": 1}


def added(*parts: dict[str, int], times: int = 1) -> dict[str, int]:
    total = dict.fromkeys(SIGNALS, 0)
    for part in parts:
        for name, count in part.items():
            total[name] += count * times
    return total


def opted_in() -> tuple[Any, ...]:
    return (Prometheus(), Tracing(exporter="console"))  # each connects receivers of its own


CASES = [
    ("beat", tuple, added(STARTUP, DISPATCHER, BEAT_JANITOR)),
    ("worker", tuple, added(STARTUP, DISPATCHER, WORKER_JANITOR)),
    ("beat", opted_in, added(STARTUP, DISPATCHER, BEAT_JANITOR, METRICS, TRACING)),
]


def since(before: dict[str, int]) -> dict[str, int]:
    return {name: count - before[name] for name, count in live_receivers().items()}


def test_its_celery_app_keeps_an_mcptasks_listening_and_dropping_both_leaves_no_receiver(tmp_path: Path) -> None:
    """`celery -A module worker` may find only `tasks.celery`: the app keeps its McpTasks, and so every receiver
    of it, alive; once the app goes too, nothing of them is left on Celery's process-wide signals."""
    kept = build(tmp_path, "kept")  # whatever a process installs once is installed by now
    gc.collect()  # what earlier tests dropped
    before = live_receivers()
    for janitor, plugins, expected in CASES:
        celery = build(tmp_path, f"dropped-{janitor}", plugins(), janitor=janitor).celery
        gc.collect()
        assert since(before) == expected  # only its Celery app holds it: every receiver still listens
        owner_ref = weakref.ref(celery.tasks[JANITOR_TASK])  # something of the app, to see it go
        del celery
        gc.collect()
        assert owner_ref() is None, "something process-wide still holds the dropped app and its McpTasks"
        assert live_receivers() == before
    assert kept.celery.main == "kept"


def test_a_plugin_shared_by_two_apps_listens_for_both(tmp_path: Path) -> None:
    """One plugin object in several `McpTasks` (one per tenant): each app's worker hooks stay connected."""
    gc.collect()
    before = live_receivers()
    shared = opted_in()
    first = build(tmp_path, "tenant-a", shared)
    second = build(tmp_path, "tenant-b", shared)
    gc.collect()
    assert since(before) == added(STARTUP, DISPATCHER, BEAT_JANITOR, METRICS, TRACING, times=2)
    assert first.celery is not second.celery
