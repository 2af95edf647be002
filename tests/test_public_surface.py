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


MCP_TASKS_MEMBERS = {
    # what the docs show
    "mcp_task",
    "celery",
    "server",
    "asgi_app",
    "ops_app",
    "console_app",
    "lifespan",
    "task_handle",
    # what the commands, the pytest plugin and plugins build on
    "name",
    "settings",
    "service",
    "ledger",
    "sweep",
    "preflight",
}


def test_mcp_tasks_exposes_what_the_docs_use_and_nothing_else(tmp_path: Path) -> None:
    from celery_mcp_tasks.config import Settings

    tasks = celery_mcp_tasks.McpTasks("surface", settings=Settings(data_dir=tmp_path))
    assert {name for name in dir(tasks) if not name.startswith("_")} == MCP_TASKS_MEMBERS
