"""A server whose tools derive idempotency keys needs the secret the ids are derived from."""

from __future__ import annotations

from pathlib import Path

import pytest

from celery_mcp_tasks import ConfigError, McpTasks
from celery_mcp_tasks.app import internals
from celery_mcp_tasks.config import Settings


def _app(tmp_path: Path, **settings: object) -> McpTasks:
    tasks = McpTasks("derives", settings=Settings(data_dir=tmp_path, **settings))  # type: ignore[arg-type]

    @tasks.mcp_task(idempotency_key="arguments")
    def pay(order: str) -> str:
        return order

    return tasks


def test_serve_refuses_to_start_without_the_secret_naming_the_setting_and_the_tools(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as refused:
        internals(_app(tmp_path)).preflight("serve", need_schema=False)
    assert str(refused.value).startswith("MCP_TASKS_IDEMPOTENCY_SECRET: task tools pay derive idempotency keys")


def test_with_the_secret_it_starts_and_a_worker_never_needs_it(tmp_path: Path) -> None:
    internals(_app(tmp_path, idempotency_secret="x" * 32)).preflight("serve", need_schema=False)
    internals(_app(tmp_path / "w")).preflight("worker", need_schema=False)


def test_a_tool_option_that_is_neither_a_function_nor_arguments_is_refused_at_import(tmp_path: Path) -> None:
    tasks = McpTasks("bad", settings=Settings(data_dir=tmp_path))
    with pytest.raises(ValueError, match="idempotency_key must be a function of the arguments or 'arguments'"):
        tasks.mcp_task(idempotency_key="order")(lambda order: order)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_active must be a whole number >= 1"):
        tasks.mcp_task(max_active=0)(lambda order: order)
