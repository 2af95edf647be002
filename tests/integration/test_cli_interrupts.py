"""Ctrl-C before a command is up: one line, "interrupted", and status 130, never a traceback."""

from __future__ import annotations

import ast
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import ROOT, wait_until

pytestmark = pytest.mark.integration


def test_the_command_module_imports_nothing_heavy_before_main_can_catch_ctrl_c() -> None:
    """What the `celery-mcp-tasks` script imports before it calls `main()` is outside main's Ctrl-C handling:
    it must be quick. It used to load SQLAlchemy (~0.5 s): a Ctrl-C then printed a traceback."""
    code = "import sys, celery_mcp_tasks.cli; print(sorted({m.split('.')[0] for m in sys.modules}))"
    loaded = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    heavy = {"sqlalchemy", "celery", "kombu", "mcp", "anyio", "uvicorn", "httpx", "pydantic", "starlette"}
    assert heavy & set(ast.literal_eval(loaded.stdout)) == set()


@pytest.mark.parametrize("command", ["serve", "dev"])
def test_ctrl_c_while_the_app_is_still_importing_is_one_line_and_130(command: str, tmp_path: Path) -> None:
    marker = tmp_path / "importing"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MCP_TASKS_", "CELERY_"))}
    env.update(MCP_TASKS_TEST_IMPORTING=str(marker), MCP_TASKS_DATA_DIR=str(tmp_path / "data"))
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), str(ROOT)])  # this checkout, not an installed copy
    argv = [sys.executable, "-m", "celery_mcp_tasks.cli", command, "tests.apps.slow_import_app", "--port", "0"]
    proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_until(marker.exists, 60, "the app's import to begin")  # from here on, inside the app's import
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert err.splitlines() == ["celery-mcp-tasks: interrupted"]
    assert out == ""
