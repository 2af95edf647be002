"""How `McpTasks(notifier=...)` and MCP_TASKS_NOTIFY decide what each process publishes."""

from __future__ import annotations

from pathlib import Path

from celery_mcp_tasks import McpTasks
from celery_mcp_tasks.app import internals
from celery_mcp_tasks.config import Settings
from celery_mcp_tasks.model import TaskRecord
from celery_mcp_tasks.notify.postgres import PG_HINT, PgNotifier

PG = "postgresql://u@db/tasks"


class Recorder:
    def __init__(self) -> None:
        self.seen: list[TaskRecord] = []

    def task_changed(self, record: TaskRecord) -> None:
        self.seen.append(record)


def _settings(tmp_path: Path, **settings: object) -> Settings:
    return Settings(data_dir=tmp_path, **settings)  # type: ignore[arg-type]


def test_by_default_postgres_publishes_inside_the_write_and_needs_no_notifier(tmp_path: Path) -> None:
    tasks = McpTasks("wiring", settings=_settings(tmp_path, database_url=PG, broker_url="redis://r/0"))
    assert internals(tasks).push.mode == "postgres"
    assert internals(tasks).push.change_hint is PG_HINT
    assert internals(tasks).push.notifier is None
    assert isinstance(internals(tasks).push.publisher, PgNotifier)  # for a custom notifier that keeps push


def test_by_default_a_networked_broker_publishes_after_the_write(tmp_path: Path) -> None:
    tasks = McpTasks("wiring", settings=_settings(tmp_path, broker_url="redis://r/0"))
    assert internals(tasks).push.mode == "broker"
    assert internals(tasks).push.change_hint is None
    assert internals(tasks).push.notifier is internals(tasks).push.publisher is not None


def test_the_embedded_default_publishes_nothing_and_polls(tmp_path: Path) -> None:
    tasks = McpTasks("wiring", settings=_settings(tmp_path))
    assert (internals(tasks).push.mode, internals(tasks).push.notifier, internals(tasks).push.change_hint) == (
        "poll",
        None,
        None,
    )


def test_none_turns_push_off_everywhere(tmp_path: Path) -> None:
    tasks = McpTasks("wiring", settings=_settings(tmp_path, database_url=PG), notifier=None)
    assert (internals(tasks).push.mode, internals(tasks).push.notifier, internals(tasks).push.change_hint) == (
        "off",
        None,
        None,
    )


def test_a_custom_notifier_replaces_the_publisher(tmp_path: Path) -> None:
    mine = Recorder()
    tasks = McpTasks("wiring", settings=_settings(tmp_path, database_url=PG), notifier=mine)
    assert internals(tasks).push.mode == "postgres"  # web processes still listen
    assert internals(tasks).push.notifier is mine
    assert internals(tasks).push.change_hint is None


def test_the_custom_notifier_hears_every_write_of_this_process(tmp_path: Path) -> None:
    mine = Recorder()
    tasks = McpTasks("wiring", settings=_settings(tmp_path), notifier=mine)
    service = internals(tasks).service()
    service.store.create_schema()  # type: ignore[attr-defined]
    _, record = service.create(owner=None, tool="t", arguments={}, dispatch=False)
    service.progress(record.key, "on it")
    assert [r.status_message for r in mine.seen] == [None, "on it"]


def test_listen_is_ours_unless_the_server_serves_none(tmp_path: Path) -> None:
    assert internals(McpTasks("wiring", settings=_settings(tmp_path))).listen is not None
    assert internals(McpTasks("wiring", settings=_settings(tmp_path), subscriptions=False)).listen is None
