"""The janitor on Celery beat: installed so a user's schedule cannot drop it, and opt-out."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from celery import Celery, signals
from celery.beat import Scheduler, Service

from celery_mcp_tasks import McpTasks
from celery_mcp_tasks.config import Settings
from celery_mcp_tasks.migrate import upgrade
from celery_mcp_tasks.worker.janitor import JANITOR_TASK
from tests.support import Backend, process_env, spawn, wait_until


def runtime(tmp_path: Path, **settings: object) -> McpTasks:
    upgrade(Settings(data_dir=tmp_path).store_url)  # beat_init refuses an unmigrated store
    return McpTasks("beat-unit", celery=Celery("beat-unit"), settings=Settings(data_dir=tmp_path, **settings))


def beat_schedule_at_init(app: Celery) -> dict[str, object]:
    """The schedule a beat process runs once `beat_init` has fired."""
    service = Service(app, scheduler_cls=Scheduler)
    signals.beat_init.send(sender=service)
    return service.scheduler.schedule


def test_the_janitor_is_scheduled_every_interval_never_expires_and_claims_its_interval(tmp_path: Path) -> None:
    tasks = runtime(tmp_path, janitor_interval_s=30.0)
    entry = tasks.celery.conf.beat_schedule[JANITOR_TASK]
    # No expiry: a sweep waiting behind a backlog longer than an interval still runs; the claim (half an interval:
    # a message that waited longer than the one before still sweeps) drops the ones that piled up and come together.
    assert entry == {"task": "celery_mcp_tasks.janitor", "schedule": 30.0, "kwargs": {"claim_interval_s": 15.0}}
    assert tasks.celery.tasks[entry["task"]].name == JANITOR_TASK  # the entry names a task the worker has
    assert runtime(tmp_path / "b", janitor_interval_s=5.0).celery.conf.beat_schedule[JANITOR_TASK]["schedule"] == 5.0


def test_a_user_schedule_assigned_after_configure_does_not_drop_it(tmp_path: Path) -> None:
    tasks = runtime(tmp_path, janitor_interval_s=30.0)
    tasks.celery.conf.beat_schedule = {"user.job": {"task": "user.job", "schedule": 10.0}}
    assert JANITOR_TASK not in tasks.celery.conf.beat_schedule
    schedule = beat_schedule_at_init(tasks.celery)
    assert {"user.job", JANITOR_TASK} <= set(schedule)
    assert schedule[JANITOR_TASK].schedule.run_every.total_seconds() == 30.0


def test_a_user_schedule_from_config_from_object_keeps_it(tmp_path: Path) -> None:
    class UserConfig:
        beat_schedule = {"user.job": {"task": "user.job", "schedule": 10.0}}  # noqa: RUF012 - a config object as Celery reads it

    tasks = runtime(tmp_path, janitor_interval_s=30.0)
    tasks.celery.config_from_object(UserConfig)
    assert {"user.job", JANITOR_TASK} <= set(tasks.celery.conf.beat_schedule)


def test_opting_out_leaves_the_schedule_alone_but_keeps_the_task(tmp_path: Path) -> None:
    tasks = runtime(tmp_path, janitor_interval_s=None)
    assert JANITOR_TASK not in (tasks.celery.conf.beat_schedule or {})
    assert JANITOR_TASK not in beat_schedule_at_init(tasks.celery)
    assert JANITOR_TASK in tasks.celery.tasks  # a sweep can still be run by hand
    assert Settings.from_env({"MCP_TASKS_JANITOR_INTERVAL_S": "off"}).janitor_interval_s is None


@pytest.mark.integration
def test_a_real_beat_sends_the_janitor_next_to_the_users_own_schedule(tmp_path: Path) -> None:
    backend = Backend("embedded", {"MCP_TASKS_DATA_DIR": str(tmp_path), "MCP_TASKS_JANITOR_INTERVAL_S": "0.5"})
    upgrade(backend.store_url)  # beat refuses an unmigrated store
    beat = spawn(
        "beat",
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "tests.apps.beat_app",
            "beat",
            "--loglevel",
            "INFO",
            "-s",
            str(tmp_path / "schedule"),
        ],
        process_env(backend),
        tmp_path,
    )
    try:
        wait_until(
            lambda: beat.text().count(f"Sending due task {JANITOR_TASK}") >= 2 or beat.popen.poll() is not None,
            30,
            "beat to send the janitor twice",
        )
        assert "Sending due task user.job" in beat.text()
        assert "re-inserting the janitor" in beat.text()
    finally:
        beat.stop()
