"""The web process logs one plain line per record, even though `rich` is installed (the SDK would wrap them)."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration  # a fresh interpreter: the root logger as a process starts


def test_an_app_adds_no_root_handler_and_its_lines_stay_plain():
    """Constructing McpTasks configures no logging (the SDK server's rich `basicConfig` is kept off the
    root logger); a warning then goes out through Python's last-resort handler, one line, not wrapped."""
    probe = (
        "import logging\n"
        "from celery_mcp_tasks import McpTasks\n"
        "McpTasks('probe')\n"
        "handlers = logging.getLogger().handlers\n"
        "print([type(h).__name__ for h in handlers])\n"
        "logging.getLogger('celery_mcp_tasks.mcp').warning('x' * 150 + ' end')\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.strip() == "[]"
    assert "x" * 150 + " end" in done.stderr.splitlines()  # one line, not padded or wrapped
