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


def _probe(cwd: Path, source: str, *args: str) -> str:
    """What `source` prints in a fresh interpreter in `cwd` (where the_app.py is)."""
    done = subprocess.run(
        [sys.executable, "-c", source, *args],
        cwd=cwd,
        env={"PATH": "/usr/bin:/bin", "MCP_TASKS_DATA_DIR": str(cwd / "data")},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


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
    assert _probe(tmp_path, PROBE, "the_app") == expected


def test_a_command_quiets_http_and_migration_chatter_unless_the_app_chose_a_level(tmp_path: Path) -> None:
    (tmp_path / "the_app.py").write_text(
        "import logging\n"
        "from celery_mcp_tasks import McpTasks\n"
        "tasks = McpTasks('app')\n"
        "logging.getLogger('httpx').setLevel(logging.DEBUG)  # the app wants its HTTP client's lines\n"
    )
    probe = (
        "import logging, sys\n"
        "from celery_mcp_tasks.cli.shared import load_app\n"
        "load_app('the_app')\n"
        "print([logging.getLevelName(logging.getLogger(n).level) for n in ('httpx', 'httpx2', 'alembic')])\n"
    )
    assert _probe(tmp_path, probe) == "['DEBUG', 'WARNING', 'WARNING']"
