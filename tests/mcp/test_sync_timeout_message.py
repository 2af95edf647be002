"""What a synchronous call that gave up its job says: the bound that ended it, and a fix the caller can use."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from celery_mcp_tasks.mcp.sync import _timed_out
from tests.builders import record


def tool(mode: str = "optional", sync_timeout_s: float | None = None) -> Any:
    return SimpleNamespace(name="report", mode=mode, sync_timeout_s=sync_timeout_s)


@pytest.mark.parametrize("mode", ["optional", "required"])
def test_a_job_no_worker_started_names_the_setting_and_asks_for_a_worker(mode: str) -> None:
    said = _timed_out(tool(mode=mode), record(started_at=None), 300)
    assert said == (
        "Tool report did not finish in time, and its job was cancelled: no worker started its job within 300 s "
        "(MCP_TASKS_SYNC_TIMEOUT_S): check that a worker consumes its queue; call it with the tasks extension "
        "to wait as long as it runs"
    )


def test_a_tool_that_cannot_be_a_task_is_not_told_to_become_one() -> None:
    said = _timed_out(tool(mode="forbidden", sync_timeout_s=2.5), record(started_at=1), 2.5)
    assert said == (
        "Tool report did not finish in time, and its job was cancelled: its job reported nothing for 2.5 s "
        "(the tool's sync_timeout_s)"
    )
