"""The README's first command: `celery-mcp-tasks dev APP --call ...` on the embedded default."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import ROOT, free_port

pytestmark = pytest.mark.integration


def test_dev_runs_the_quickstart_from_working_to_completed(tmp_path: Path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MCP_TASKS_", "CELERY_"))}
    env["PYTHONPATH"] = str(ROOT)
    run = subprocess.run(
        [sys.executable, "-m", "celery_mcp_tasks.cli", "dev", "examples.quickstart.app", "--data-dir",
         str(tmp_path / "data"), "--port", str(free_port()), "--call", "write_report", '{"topic": "tides"}'],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=180,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    lines = run.stdout.splitlines()
    assert lines[0] == "created task: status=working"
    assert "status=working  (Writing section 3 of 3)" in lines
    assert "status=completed" in lines
    assert "A 3-section report on tides." in run.stdout
    assert (tmp_path / "data" / "tasks.db").is_file()  # SQLite, no servers
