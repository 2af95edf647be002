"""The top level is what a user writes: the runtime, the job's context, the input-request builders and the
exceptions a job or a caller catches. Everything else lives in its submodule."""

from __future__ import annotations

from pathlib import Path

import pytest

import celery_mcp_tasks

WRITTEN_BY_USERS = {
    "McpTasks",
    "TaskContext",
    "elicit",
    "elicit_url",
    "sample",
    "list_roots",
    "ConfigError",
    "DuplicateInputKeys",
    "InputTimeout",
    "InvalidInputRequest",
    "StoreUnavailable",
    "TerminalTask",
}


def test_the_top_level_exports_what_a_user_writes_and_nothing_else() -> None:
    assert set(celery_mcp_tasks.__all__) == WRITTEN_BY_USERS
    for name in WRITTEN_BY_USERS:
        assert getattr(celery_mcp_tasks, name) is not None


@pytest.mark.parametrize("name", ["Settings", "TaskStatus", "SweepReport", "MetricHook", "Notifier", "RunInProgress"])
def test_internals_are_not_at_the_top_level(name: str) -> None:
    with pytest.raises(AttributeError):
        getattr(celery_mcp_tasks, name)


@pytest.mark.parametrize("name", ["TaskRecord", "Superseded"])
def test_names_the_readme_once_showed_still_import_with_a_deprecation_warning(name: str) -> None:
    from celery_mcp_tasks import model

    with pytest.warns(DeprecationWarning, match="import it from celery_mcp_tasks.model"):
        value = getattr(celery_mcp_tasks, name)
    assert value is getattr(model, name)


MCP_TASKS_MEMBERS = {  # what README.md and docs/ show; the commands and tests reach the rest via `internals(tasks)`
    "mcp_task",
    "celery",
    "server",
    "asgi_app",
    "ops_app",
    "console_app",
    "lifespan",
    "task_handle",
    "name",
    "settings",
}


def test_mcp_tasks_exposes_what_the_docs_use_and_nothing_else(tmp_path: Path) -> None:
    from celery_mcp_tasks.config import Settings

    tasks = celery_mcp_tasks.McpTasks("surface", settings=Settings(data_dir=tmp_path))
    assert {name for name in dir(tasks) if not name.startswith("_")} == MCP_TASKS_MEMBERS


def test_every_public_member_is_one_the_docs_show() -> None:
    """A member the docs stop showing goes private (or the docs show it): the two never drift apart."""
    root = Path(__file__).resolve().parent.parent
    shown = "\n".join(
        path.read_text()
        for path in [root / "README.md", *(root / "docs").rglob("*.md"), *(root / "examples").rglob("*.py")]
    )
    unshown = sorted(name for name in MCP_TASKS_MEMBERS if f"tasks.{name}" not in shown)
    assert not unshown, f"McpTasks members no page or example shows: {unshown}"


def test_the_internals_the_commands_use_are_reached_through_internals(tmp_path: Path) -> None:
    from celery_mcp_tasks.app import internals
    from celery_mcp_tasks.config import Settings
    from celery_mcp_tasks.migrate import upgrade
    from celery_mcp_tasks.service import TaskService
    from celery_mcp_tasks.worker.janitor import SweepReport

    settings = Settings(data_dir=tmp_path)
    tasks = celery_mcp_tasks.McpTasks("inside", settings=settings)
    inside = internals(tasks)
    assert isinstance(inside.service(), TaskService)
    assert inside.service() is inside.service()  # one per process
    upgrade(settings.store_url)
    inside.preflight("worker")  # the schema is current: no refusal
    ledger = inside.ledger()
    assert ledger is not None and ledger.last() is None  # no sweep recorded yet
    report = inside.sweep()
    assert report == SweepReport()  # nothing to sweep in an empty store


def test_the_metric_argument_the_readme_once_showed_is_a_swept_plugin_with_a_deprecation_warning(
    tmp_path: Path,
) -> None:
    from celery_mcp_tasks.app import internals
    from celery_mcp_tasks.config import Settings
    from celery_mcp_tasks.migrate import upgrade
    from celery_mcp_tasks.plugin import overrides

    seen: list[tuple[str, dict[str, int]]] = []
    settings = Settings(data_dir=tmp_path)
    with pytest.warns(DeprecationWarning, match="metric=") as warned:
        tasks = celery_mcp_tasks.McpTasks("metric", settings=settings, metric=lambda n, c: seen.append((n, c)))
    assert warned[0].filename == __file__  # points at the caller's line
    assert [type(p).__name__ for p in internals(tasks).plugins if overrides(p, "swept")] == ["_SweptHook"]
    upgrade(settings.store_url)
    internals(tasks).sweep()
    assert seen and seen[0][0] == "celery_mcp_tasks.janitor.sweep"


def test_a_store_built_hook_written_as_the_docs_first_showed_still_gets_the_store(tmp_path: Path) -> None:
    """`store_built(self, store)` (the docs' first form) is called with the store alone, with a DeprecationWarning;
    the documented `store_built(self, store, engine)` gets both."""
    from celery_mcp_tasks.app import internals
    from celery_mcp_tasks.config import Settings
    from celery_mcp_tasks.plugin import Plugin

    seen: list[tuple[str, object]] = []

    class Old(Plugin):
        def store_built(self, store):  # type: ignore[no-untyped-def,override]
            seen.append(("old", store))

    class New(Plugin):
        def store_built(self, store, engine):  # type: ignore[no-untyped-def]
            seen.append(("new", engine))

    with pytest.warns(DeprecationWarning, match=r"Old\.store_built\(store\) is deprecated"):
        tasks = celery_mcp_tasks.McpTasks("hooks", settings=Settings(data_dir=tmp_path), plugins=[Old(), New()])
    service = internals(tasks).service()
    assert [name for name, _ in seen] == ["old", "new"]
    assert seen[0][1] is service.store
    assert seen[1][1] is service.store.engine  # type: ignore[attr-defined]


def test_a_plugin_may_use_the_service_in_its_setup_and_store_hooks_still_run(tmp_path: Path) -> None:
    from celery_mcp_tasks.config import Settings
    from celery_mcp_tasks.plugin import Plugin, Runtime

    built: list[object] = []

    class Eager(Plugin):
        def setup(self, runtime: Runtime) -> None:
            built.append(runtime.service().store)  # builds this process's service now

        def store_built(self, store, engine):  # type: ignore[no-untyped-def]
            built.append(store)

    celery_mcp_tasks.McpTasks("eager", settings=Settings(data_dir=tmp_path), plugins=[Eager()])
    assert len(built) == 2 and built[0] is built[1]  # the hook ran on the store setup got
