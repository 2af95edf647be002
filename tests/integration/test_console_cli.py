"""`celery-mcp-tasks tasks ls|show|cancel` in a real terminal (a tmux pane running bash), against a running
console: what an operator types and what the screen shows, and `--json` parsed raw off the screen."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from celery_mcp_tasks.model import task_key
from tests.support import ROOT, Backend, Deployment, McpHttp, process_env, tool, wait_until

pytestmark = pytest.mark.integration

APP = "examples.conformance.app"
TOKEN = "console-cli-test-token-0123456789"
DONE = re.compile(r"^== exit (\d+)$", re.MULTILINE)


class Shell:
    """bash in a tmux pane (a tmux server of its own), 160 columns wide, as an operator's terminal."""

    def __init__(self, socket: Path, env: dict[str, str]) -> None:
        self.binary = tool("tmux", "Debian: apt-get install tmux")
        self.socket = socket
        self.env = {**env, "TERM": "xterm-256color"}
        bash = f"env PS1='$ ' {tool('bash', 'Debian: apt-get install bash')} --norc --noprofile -i"
        self._tmux("-f", "/dev/null", "new-session", "-d", "-s", "ops", "-x", "160", "-y", "50", "-c", str(ROOT), bash)
        wait_until(lambda: self.screen(visible=True).strip() == "$", 30, "the shell's prompt", interval=0.1)

    def _tmux(self, *args: str) -> str:
        done = subprocess.run(
            [self.binary, "-S", str(self.socket), *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
        return done.stdout

    def screen(self, *, visible: bool = False) -> str:
        """The pane (`visible`: only what is on it now, else with its scrollback), wrapped lines joined."""
        return self._tmux("capture-pane", "-p", "-J", *(() if visible else ("-S", "-")), "-t", "ops")

    def run(self, command: str) -> tuple[int, str]:
        """Type `command` and Enter on a cleared screen; its exit status and what it printed."""
        self._tmux("send-keys", "-t", "ops", "clear", "Enter")
        wait_until(lambda: self.screen(visible=True).strip() == "$", 30, "a cleared screen", interval=0.05)
        self._tmux("clear-history", "-t", "ops")
        self._tmux("send-keys", "-t", "ops", "-l", f'{command}; echo "== exit $?"')
        self._tmux("send-keys", "-t", "ops", "Enter")
        found = wait_until(lambda: DONE.search(self.screen()), 60, f"{command!r} to end", interval=0.1)
        screen = self.screen()
        printed = screen[screen.index("\n") + 1 : DONE.search(screen).start()]  # type: ignore[union-attr]
        return int(found.group(1)), printed

    def close(self) -> None:
        subprocess.run([self.binary, "-S", str(self.socket), "kill-server"], capture_output=True, timeout=30)


@pytest.fixture(scope="module")
def console(backend: Backend, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Deployment, str]]:
    with Deployment(APP, backend, tmp_path_factory.mktemp(f"console-cli-{backend.name}")) as deployment:
        deployment.web()
        deployment.worker()
        yield deployment, deployment.console(TOKEN)


@pytest.fixture
def shell(console: tuple[Deployment, str], tmp_path: Path) -> Iterator[Shell]:
    deployment, root = console
    env = process_env(deployment.backend, MCP_TASKS_CONSOLE_TOKEN=TOKEN, MCP_TASKS_CONSOLE_URL=root)
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '/usr/bin:/bin')}"  # the venv's entry point
    opened = Shell(tmp_path / "tmux.sock", env)
    yield opened
    opened.close()


def test_an_operator_lists_shows_and_cancels_a_task_by_the_row_prefix_the_list_shows(
    console: tuple[Deployment, str], shell: Shell
) -> None:
    deployment, root = console
    mcp = McpHttp(deployment.url)
    try:
        task_id = mcp.create("slow_compute", {"seconds": 60})
    finally:
        mcp.close()
    key = task_key(task_id)
    tasks = f"celery-mcp-tasks tasks {{}} --url {shlex.quote(root)}"

    def listed() -> str | None:  # at MCP_TASKS_CONSOLE_URL (the shell's): no --url
        status, printed = shell.run("celery-mcp-tasks tasks ls --tool slow_compute --status working")
        return printed if status == 0 and key[:12] in printed else None

    printed = wait_until(listed, 30, "the task in `tasks ls`", interval=0.5)
    lines = printed.splitlines()
    assert lines[0].split() == ["ROW", "STATUS", "TOOL", "OWNER", "CREATED", "(UTC)", "PROGRESS", "MESSAGE"]
    row = next(line for line in lines if line.startswith(key[:12]))
    assert row.split()[1:3] == ["working", "slow_compute"]
    row_prefix = row.split()[0]  # what an operator reads off the screen and types back

    status, printed = shell.run(tasks.format("show") + f" {row_prefix}")
    assert status == 0, printed
    shown = {line[:12].strip(): line[13:].strip() for line in printed.splitlines() if line.strip()}
    assert shown["row key"] == key and shown["status"] == "working" and shown["tool"] == "slow_compute"
    assert shown["queue"] == deployment.queue

    status, printed = shell.run(tasks.format("show") + f" {row_prefix} --json")
    assert status == 0, printed
    detail = json.loads(printed)  # the raw screen is the API's JSON, nothing else
    assert detail["key"] == key and detail["status"] == "working" and detail["revealed"] is False

    status, printed = shell.run(tasks.format("cancel") + f" {row_prefix}")
    assert (status, printed.strip()) == (0, f"{key[:12]}: The task is cancelled")
    status, printed = shell.run(tasks.format("cancel") + f" {row_prefix}")
    assert status == 1 and printed.strip().count("\n") == 0 and "already cancelled" in printed and "409" in printed

    status, printed = shell.run(tasks.format("ls") + " --tool slow_compute --status cancelled --json")
    assert status == 0, printed
    page = json.loads(printed)
    assert [r["status"] for r in page["rows"] if r["key"] == key] == ["cancelled"]

    for refused in ("0123456", "running-task", task_id[:-1]):  # too short, no key, an id mistyped: never sent
        status, printed = shell.run(tasks.format("show") + f" {refused}")
        assert status == 2 and printed.strip().count("\n") == 0 and "neither a row key" in printed, printed
    status, printed = shell.run(tasks.format("show") + " 0123abcd")  # a prefix no row's key starts with
    assert status == 1 and printed.strip().count("\n") == 0 and "404" in printed, printed

    assert task_id not in deployment.logs()
