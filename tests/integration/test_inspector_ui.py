"""MCP Inspector's web UI, in its default (earlier-era) mode, driven in headless Chromium.

`mcp-inspector --server-url URL` (no `--protocol-era`: `legacy`) speaks 2025-11-25, so a
task tool is called synchronously. While the call is pending the UI shows the job's
progress (a "Tool progress" notice per `notifications/progress`; the Inspector sends a
progressToken by default), and a job's question (asked on the request's own stream as
`elicitation/create`) opens its "Elicitation Request" form; submitting it lets the job
finish, and its result appears under *Results*.

tests/interop/inspector_ui.mjs does the clicking with npm's `playwright-core` (no browser
download) and Debian's `chromium` at /usr/bin/chromium; it prints one JSON line of what it
saw and saves screenshots. The Inspector, playwright-core and Node come from npm
(tests/support_node.py). Without Chromium or npm the test skips, and fails under
MCP_TASKS_TEST_REQUIRE_TOOLS=1 (`.ci/run` installs both).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.integration.test_inspector import INSPECTOR, LAUNCHER
from tests.support import Backend, Deployment, Proc, free_port, spawn, tool, wait_until
from tests.support_node import NodePackages, npm_packages

pytestmark = pytest.mark.integration

PLAYWRIGHT = "playwright-core@1.65.1"
CHROMIUM = Path("/usr/bin/chromium")  # Debian's `chromium` package
SCRIPT = Path(__file__).resolve().parent.parent / "interop" / "inspector_ui.mjs"
ADDRESS = re.compile(r"(http://127\.0\.0\.1:\d+/?\?MCP_INSPECTOR_API_TOKEN=\w+)")


@dataclass
class Browser:
    node: str
    script: Path

    def run(self, inspector_url: str, shots: Path, timeout: float = 200) -> dict[str, Any]:
        """inspector_ui.mjs against `inspector_url`: its JSON line (the script bounds itself to 150 s)."""
        done = subprocess.run(
            [self.node, str(self.script), inspector_url, str(shots), str(CHROMIUM)],
            check=False,
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=self.script.parent,
            env={**os.environ, "NODE_NO_WARNINGS": "1"},
        )
        try:
            report: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            raise AssertionError(
                f"no JSON from inspector_ui.mjs (exit {done.returncode}):\n{done.stdout}\n{done.stderr}"
            ) from None
        assert done.returncode == 0 and report["ok"], f"{report}\nscreenshots: {shots}\n{done.stderr}"
        return report


@pytest.fixture(scope="session")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Browser:
    tool("chromium", "Debian: apt-get install chromium", path=str(CHROMIUM))
    packages = npm_packages([PLAYWRIGHT], what="playwright-core", min_node=(20, 0))  # its engines
    # ESM resolves bare imports from the script's own directory: run a copy beside the install's node_modules.
    scripts = tmp_path_factory.mktemp("inspector-ui")
    (scripts / "node_modules").symlink_to(packages.root / "node_modules", target_is_directory=True)
    shutil.copy(SCRIPT, scripts / SCRIPT.name)
    return Browser(packages.node, scripts / SCRIPT.name)


@pytest.fixture(scope="module")
def interop(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    """tests.apps.interop_app (`count_up` reports progress, `ask_name` asks a question) on the embedded backend."""
    backend = Backend("embedded", {"MCP_TASKS_DATA_DIR": str(tmp_path_factory.mktemp("inspector-ui-embedded"))})
    with Deployment("tests.apps.interop_app", backend, tmp_path_factory.mktemp("inspector-ui-logs")) as deployment:
        deployment.web()
        deployment.worker()
        yield deployment


def start_inspector_web(packages: NodePackages, server_url: str, home: Path, log_dir: Path) -> tuple[Proc, str]:
    """`mcp-inspector --server-url URL` (the default era): the process and the address it prints."""
    env = {
        **os.environ,
        "HOME": str(home),  # its catalog, storage and secrets go to ~/.mcp-inspector
        "PATH": f"{Path(packages.node).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "CLIENT_PORT": str(free_port()),  # the web UI (it needs a fixed port)
        "MCP_SANDBOX_PORT": "0",  # the MCP Apps sandbox and app origin: any free port
        "MCP_APP_ORIGIN_PORT": "0",
        "MCP_AUTO_OPEN_ENABLED": "false",
        "MCP_INSPECTOR_API_TOKEN": secrets.token_hex(16),
        "MCP_INSPECTOR_SECRET_STORE": "memory",
    }
    argv = [packages.node, str(packages.root / LAUNCHER), "--web", "--server-url", server_url]
    proc = spawn("inspector-web", argv, env, log_dir)

    def address() -> str | None:
        found = ADDRESS.search(proc.text())
        return found.group(1) if found else None

    wait_until(lambda: address() or proc.popen.poll() is not None, 60, "the Inspector's web UI to start")
    url = address()
    if url is None:
        proc.stop()
        raise RuntimeError(f"the Inspector's web UI exited:\n{proc.text()}")
    return proc, url


@pytest.fixture(scope="module")
def inspector_web(interop: Deployment, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    packages = npm_packages([INSPECTOR], what="MCP Inspector", min_node=(22, 19))  # the Inspector's engines
    proc, url = start_inspector_web(
        packages, interop.url, tmp_path_factory.mktemp("inspector-ui-home"), interop.log_dir
    )
    try:
        yield url
    finally:
        proc.stop()


def test_the_inspector_ui_in_default_mode_shows_progress_and_the_question_of_a_synchronous_call(
    browser: Browser, inspector_web: str, tmp_path: Path
) -> None:
    report = browser.run(inspector_web, tmp_path)
    assert report["protocol"] == "MCP 2025-11-25" and report["messagesBadge"], report  # the earlier era

    # count_up(steps=3): the job's own messages and numbers, shown while tools/call was still pending.
    notices = report["progressWhilePending"]
    assert len(notices) >= 2, report  # every notice updates in place: at least two distinct steps were seen
    for notice in notices:
        step = re.fullmatch(r"Tool progress\nstep (\d) of 3 — (\d) / 3 \(\d+%\)", notice)
        assert step and step.group(1) == step.group(2), notices
    assert report["countUpResult"] == "counted to 3"

    # ask_name: the question, as a form, answered in the UI; the job then finished with the answer.
    assert "What is your name?" in report["dialogText"] and report["formField"], report
    assert report["askNameResult"] == "Hello, Ada!"
