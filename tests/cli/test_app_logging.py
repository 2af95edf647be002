"""The commands configure root logging only when the app they load did not (`cli.shared.load_app`)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration  # a fresh interpreter: the root logger as a process starts

PROBE = """
import logging, sys
from celery_mcp_tasks.cli.shared import load_app
from celery_mcp_tasks.ops.root_handler import ROOT_HANDLER
load_app(sys.argv[1])
print([h.get_name() == ROOT_HANDLER for h in logging.getLogger().handlers])
"""

CONFIGURES_AFTER = """
import logging
from celery_mcp_tasks import McpTasks
tasks = McpTasks("app")
logging.basicConfig(format="app %(message)s")  # after the construction: McpTasks configured nothing
"""


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        (CONFIGURES_AFTER, "[False]"),  # the app's own handler, not replaced, not doubled
        ("from celery_mcp_tasks import McpTasks\ntasks = McpTasks('app')\n", "[True]"),  # ours, where none
    ],
    ids=["app-configured", "app-silent"],
)
def test_a_command_keeps_the_apps_logging_and_adds_its_own_only_where_none(
    tmp_path: Path, source: str, expected: str
) -> None:
    (tmp_path / "the_app.py").write_text(source)
    done = subprocess.run(
        [sys.executable, "-c", PROBE, "the_app"],
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "MCP_TASKS_DATA_DIR": str(tmp_path / "data")},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert done.stdout.strip() == expected, done.stderr
