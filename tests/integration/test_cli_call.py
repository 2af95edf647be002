"""`celery-mcp-tasks call` against a real deployment: plain lines, --json, --no-wait/--resume, a real terminal.

The terminal tests run the CLI under a pseudo-terminal it owns as its controlling
terminal: Ctrl-C is the \\x03 byte the terminal turns into SIGINT, answers are typed;
and in tmux, a terminal as a person has it (send-keys C-c, capture-pane).
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import select
import shlex
import signal
import struct
import subprocess
import sys
import termios
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import ROOT, Backend, Deployment, McpHttp, free_port, tool, wait_until

pytestmark = pytest.mark.integration

PID_LINE = re.compile(r"status=working  \(pid=\d+: working\)")
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b[()][A-Z0-9]")


@pytest.fixture(scope="module")
def runtime(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    tmp = tmp_path_factory.mktemp("cli-call")
    backend = Backend("embedded", {"MCP_TASKS_DATA_DIR": str(tmp / "data")})
    with Deployment("tests.apps.runtime_app", backend, tmp) as deployment:
        deployment.web()
        deployment.worker()
        yield deployment


@pytest.fixture(scope="module")
def authed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    tmp = tmp_path_factory.mktemp("cli-call-auth")
    backend = Backend("embedded", {"MCP_TASKS_DATA_DIR": str(tmp / "data")})
    with Deployment("tests.apps.push_app", backend, tmp) as deployment:
        deployment.web()  # no worker: the task only needs to exist
        yield deployment


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MCP_TASKS_", "CELERY_"))}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), str(ROOT)])  # this checkout, not an installed copy
    env.update(extra)
    return env


def _call(*args: str, timeout: float = 90, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "celery_mcp_tasks.cli", "call", *args],
        cwd=ROOT,
        env=_env(**env),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _ok(run: subprocess.CompletedProcess[str], code: int = 0) -> list[str]:
    assert run.returncode == code, run.stdout + run.stderr
    assert "Traceback" not in run.stderr, run.stderr
    return run.stdout.splitlines()


def _cancel_running(url: str, task_id: str) -> None:
    """The task the command left is still running (leaving did not cancel it); cancel it now."""
    client = McpHttp(url)
    try:
        assert client.get(task_id)["status"] == "working"
        client.task("tasks/cancel", task_id)
    finally:
        client.close()


# -- plain lines, --json, --no-wait / --resume, failures -----------------------------------------


def test_a_plain_run_prints_one_line_per_change_then_the_result(runtime: Deployment) -> None:
    lines = _ok(_call(runtime.url, "work", '{"seconds": 0.5}'))
    assert lines[:2] == ["created task: status=working", "status=working  (Queued)"]
    assert lines[-2:] == ["status=completed", "worked 0.5s on attempt 1"]
    # The job's own "Started" shows too when the client reads between the start and the first report.
    assert all(PID_LINE.fullmatch(line) or line == "status=working  (Started)" for line in lines[2:-2]), lines


def test_json_prints_only_the_final_result(runtime: Deployment) -> None:
    run = _call(runtime.url, "work", '{"seconds": 0.2}', "--json")
    _ok(run)
    result = json.loads(run.stdout)
    assert result["content"] == [{"type": "text", "text": "worked 0.2s on attempt 1"}]
    assert result["isError"] is False


def test_no_wait_prints_the_id_alone_and_resume_follows_it_to_the_end(runtime: Deployment) -> None:
    lines = _ok(_call(runtime.url, "work", '{"seconds": 10}', "--no-wait"))
    assert len(lines) == 1
    task_id = lines[0]
    client = McpHttp(runtime.url)
    try:
        assert client.get(task_id)["status"] == "working"  # leaving did not cancel it
    finally:
        client.close()
    resumed = _ok(_call(runtime.url, f"--resume={task_id}"))  # two CLI starts: several seconds on a loaded machine
    assert resumed[0] == "following task: status=working"
    assert resumed[-2:] == ["status=completed", "worked 10s on attempt 1"]
    again = _ok(_call(runtime.url, f"--resume={task_id}", "--json"))  # a finished task: its result at once
    assert json.loads("\n".join(again))["content"][0]["text"] == "worked 10s on attempt 1"


def test_timeout_leaves_the_task_running_and_says_how_to_resume(runtime: Deployment) -> None:
    run = _call(runtime.url, "work", '{"seconds": 60}', "--timeout", "1")
    _ok(run, 124)
    found = re.search(rf"celery-mcp-tasks call {re.escape(runtime.url)} --resume=(\S+)$", run.stderr.strip())
    assert found, run.stderr
    _cancel_running(runtime.url, found.group(1))


def test_timeout_bounds_a_call_answered_without_a_task_too(runtime: Deployment, tmp_path: Path) -> None:
    """A `mode="forbidden"` tool answers only when its job has run: --timeout gives that call up (124), and
    the server cancels the call's job once its caller has left."""
    marker = str(tmp_path / "never")
    started = time.monotonic()
    run = _call(runtime.url, "never_a_task", json.dumps({"seconds": 30, "marker": marker}), "--timeout", "1")
    _ok(run, 124)
    assert time.monotonic() - started < 20  # not the job's 30 s
    assert run.stderr.strip().splitlines()[-1] == (
        "celery-mcp-tasks call: no answer after 1s; gave up waiting (the server cancels a call's job when its "
        "caller leaves; a task it created meanwhile keeps running)"
    )
    wait_until(lambda: Path(f"{marker}.stopped").exists(), 15, "the job to see its call's cancel")
    assert _ok(_call(runtime.url, "never_a_task", '{"seconds": 0.1}', "--timeout", "30")) == ["slept 0.1s"]


def test_a_tool_that_answers_without_a_task_shows_its_progress_while_it_runs(
    runtime: Deployment, tmux: list[Tmux], tmp_path: Path
) -> None:
    """`mode="forbidden"`: no task, but the call's progress notifications show as a task's would: a line per
    message through a pipe, the live line with its bar on a terminal, then how it ended and the result."""
    lines = _ok(_call(runtime.url, "counted_answer", '{"steps": 4, "interval": 0.5}'))
    assert lines[-2:] == ["status=completed", "counted to 4"], lines
    steps = [re.fullmatch(r"status=working  \(step (\d) of 4\)", line) for line in lines[:-2]]
    assert steps and all(steps), lines  # what the server read of the job: a step may pass unseen
    assert [int(step.group(1)) for step in steps if step] == sorted({int(step.group(1)) for step in steps if step})
    pane = Tmux(tmp_path / "tmux.sock", runtime.url, "counted_answer", '{"steps": 40, "interval": 0.25}')
    tmux.append(pane)
    wait_until(
        lambda: re.search(r"working +step \d+ of 40 .* \d+/40", pane.screen()), 60, "the live line", interval=0.2
    )
    wait_until(lambda: pane.exit_status() is not None, 60, "the call to end", interval=0.2)
    shown = [line.rstrip() for line in pane.screen().splitlines() if line.strip()]
    assert pane.exit_status() == 0, shown
    at = next(n for n, line in enumerate(shown) if "completed" in line)
    assert re.fullmatch(r"✔ completed +\d+:\d\d", shown[at]), shown
    assert shown[at + 1] == "counted to 40", shown


def test_no_wait_on_a_tool_that_answers_without_a_task_prints_no_id(runtime: Deployment) -> None:
    """`ID=$(call URL TOOL --no-wait)`: stdout holds a task id or nothing (no progress lines either); the
    answer goes to stderr."""
    run = _call(runtime.url, "counted_answer", '{"steps": 3, "interval": 0.5}', "--no-wait")
    assert _ok(run) == []
    assert run.stderr.splitlines() == [
        "celery-mcp-tasks call: the tool answered without a task, so there is no id to print; its result:",
        "counted to 3",
    ]


def test_a_failed_task_exits_1_with_its_error(runtime: Deployment) -> None:
    lines = _ok(_call(runtime.url, "explode", '{"message": "boom"}'), 1)
    assert lines[-2:] == [
        "status=failed  (Job failed: RuntimeError: boom)",
        "error -32603: Job failed: RuntimeError: boom",
    ]


def test_a_tool_error_result_exits_1_with_its_text(runtime: Deployment) -> None:
    lines = _ok(_call(runtime.url, "refuse", '{"message": "not today"}'), 1)
    assert lines[-2:] == ["status=completed", "not today"]


def test_mistakes_are_one_line_each(runtime: Deployment) -> None:
    unknown = _call(runtime.url, "no_such_tool", "{}")
    assert unknown.returncode == 1
    assert unknown.stderr.startswith("celery-mcp-tasks call: Unknown tool: no_such_tool (this server's tools: ")
    assert "explode, " in unknown.stderr and unknown.stderr.count("\n") == 1  # a typo is seen at a glance
    root = runtime.url.removesuffix("/mcp")
    not_there = _call(root, "work", "{}")
    assert (not_there.returncode, not_there.stderr) == (
        1,
        f"celery-mcp-tasks call: {root}: no MCP endpoint there (HTTP 404); the MCP endpoint is usually at /mcp: "
        f"{root}/mcp\n",
    )
    wrong_path = _call(f"{root}/wrong", "work", "{}")  # the usual endpoint, not one below the wrong path
    assert wrong_path.stderr.endswith(f"; the MCP endpoint is usually at /mcp: {root}/mcp\n"), wrong_path.stderr
    not_json = _call(runtime.url, "work", "{seconds: 1}")
    assert not_json.returncode == 2 and not_json.stderr.startswith("celery-mcp-tasks call: ARGS is not JSON: ")
    not_object = _call(runtime.url, "work", "[1]")
    assert not_object.returncode == 2 and "ARGS must be a JSON object" in not_object.stderr
    url = f"http://127.0.0.1:{free_port()}/mcp"
    unreachable = _call(url, "work", "{}")
    assert (unreachable.returncode, unreachable.stderr) == (
        1,
        f"celery-mcp-tasks call: cannot reach {url}: Connection refused (ConnectError)\n",
    )
    gone = _call(runtime.url, "--resume=no-such-task-id-at-all-just-a-probe-000000")
    assert (gone.returncode, gone.stderr) == (
        1,
        "celery-mcp-tasks call: no such task: it expired, or it belongs to another user\n",
    )


def test_a_reader_that_leaves_early_ends_the_command_saying_so_and_how_to_resume(runtime: Deployment) -> None:
    """`call ... | head -1`: once the pipe's reader is gone, the next line cannot be written. That is said as it
    is (it was "cannot reach URL: Broken pipe"), without a traceback, and the task goes on."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "celery_mcp_tasks.cli", "call", runtime.url, "work", '{"seconds": 30}'],
        cwd=ROOT,
        env=_env(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.readline() == b"created task: status=working\n"
    proc.stdout.close()  # `head -1` is done
    stderr = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 1
    found = re.fullmatch(
        rf"celery-mcp-tasks call: the output was closed \(its reader left\); the task may still be running: "
        rf"celery-mcp-tasks call {re.escape(runtime.url)} --resume=(\S+)\n",
        stderr,
    )
    assert found, stderr
    _cancel_running(runtime.url, found.group(1))


def test_args_come_from_a_file_with_at_or_from_stdin_with_a_dash(runtime: Deployment, tmp_path: Path) -> None:
    args = tmp_path / "args.json"
    args.write_text('{"seconds": 0.2}')
    assert _ok(_call(runtime.url, "work", f"@{args}"))[-2:] == ["status=completed", "worked 0.2s on attempt 1"]
    piped = subprocess.run(
        [sys.executable, "-m", "celery_mcp_tasks.cli", "call", runtime.url, "work", "-", "--json"],
        cwd=ROOT,
        env=_env(),
        input='{"seconds": 0.3}',
        capture_output=True,
        text=True,
        timeout=90,
    )
    _ok(piped)
    assert json.loads(piped.stdout)["content"][0]["text"] == "worked 0.3s on attempt 1"
    missing = _call(runtime.url, "work", f"@{tmp_path / 'nope.json'}")
    assert missing.returncode == 2
    assert missing.stderr == f"celery-mcp-tasks call: cannot read ARGS from {str(tmp_path / 'nope.json')!r}: " + (
        "No such file or directory\n"
    )


def test_a_token_that_expires_while_following_ends_the_command_with_how_to_follow_again(authed: Deployment) -> None:
    """The SDK reports each 401 as a server error, which the client retries: the command polled for ever once
    its token expired (found in an OAuth audit). It now stops at the first refusal, says why and how to go on,
    and leaves the task running."""
    arguments = json.dumps({"gate_dir": str(ROOT / "no-such-gate-dir")})
    expiring = f"alice@{int(time.time()) + 20}"  # long enough to start the task on a loaded machine
    run = _call(authed.url, "idle", arguments, "--token", expiring, timeout=60)
    assert run.returncode == 1, run.stdout + run.stderr
    assert "Traceback" not in run.stderr and expiring not in run.stdout + run.stderr
    last = run.stderr.splitlines()[-1]
    found = re.search(r"--resume=(\S+) with a token it takes$", last)
    assert found and last.startswith(
        "celery-mcp-tasks call: the server refused the token (HTTP 401; expired?) while following the task; "
        "it may still be running: celery-mcp-tasks call "
    ), run.stderr
    client = McpHttp(authed.url, headers={"Authorization": "Bearer alice"})
    try:
        assert client.get(found[1])["status"] == "working"  # leaving did not end it
        client.task("tasks/cancel", found[1])
    finally:
        client.close()


def test_arguments_over_the_servers_limit_say_the_limit_and_its_setting(runtime: Deployment, tmp_path: Path) -> None:
    big = tmp_path / "big.json"
    big.write_text(json.dumps({"seconds": 0, "marker": "x" * (5 * 1024 * 1024)}))  # 5 MiB, over the default 4
    run = _call(runtime.url, "work", f"@{big}")
    assert run.returncode == 1, run.stdout + run.stderr
    assert run.stderr == (
        "celery-mcp-tasks call: Request body too large: this server reads at most 4194304 bytes "
        "(4 MiB; set by MCP_TASKS_MAX_REQUEST_BYTES)\n"
    )


def test_the_bearer_token_comes_from_the_flag_or_the_environment_and_is_never_printed(authed: Deployment) -> None:
    arguments = json.dumps({"gate_dir": str(ROOT / "no-such-gate-dir")})
    anonymous = _call(authed.url, "idle", arguments, "--no-wait")
    assert anonymous.returncode == 1
    assert anonymous.stderr == (
        "celery-mcp-tasks call: the server requires a token (HTTP 401): pass --token or set MCP_TASKS_TOKEN\n"
    )
    by_flag = _call(authed.url, "idle", arguments, "--no-wait", "--token", "alice")
    by_env = _call(authed.url, "idle", arguments, "--no-wait", MCP_TASKS_TOKEN="alice")
    for run in (by_flag, by_env):
        assert run.returncode == 0, run.stderr
        assert "alice" not in run.stdout + run.stderr
    foreign = _call(authed.url, f"--resume={by_flag.stdout.strip()}", "--token", "mallory")
    assert foreign.returncode == 1 and "no such task" in foreign.stderr and "mallory" not in foreign.stderr
    wrong = _call(authed.url, "idle", arguments, "--token", "s3cret-but-wrong")
    assert wrong.stderr == "celery-mcp-tasks call: the server refused the token (HTTP 401)\n"
    client = McpHttp(authed.url, headers={"Authorization": "Bearer alice"})
    try:
        for run in (by_flag, by_env):
            client.task("tasks/cancel", run.stdout.strip())
    finally:
        client.close()


# -- a real terminal ------------------------------------------------------------------------------


class Terminal:
    """The CLI on a pseudo-terminal of its own (its controlling terminal), 120 columns wide."""

    def __init__(self, *args: str) -> None:
        master, slave = os.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
        self.master = master
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "celery_mcp_tasks.cli", "call", *args],
            cwd=ROOT,
            env=_env(TERM="xterm-256color"),
            stdin=slave,
            stdout=slave,
            stderr=slave,
            start_new_session=True,
            preexec_fn=lambda: fcntl.ioctl(0, termios.TIOCSCTTY, 0),  # the pty becomes its controlling terminal
        )
        os.close(slave)
        self.raw = b""
        self._seen = 0

    @property
    def text(self) -> str:
        return ANSI.sub("", self.raw.decode(errors="replace"))

    def _pump(self, wait: float) -> None:
        ready, _, _ = select.select([self.master], [], [], wait)
        if ready:
            try:
                chunk = os.read(self.master, 65536)
            except OSError:  # the child closed the terminal
                chunk = b""
            self.raw += chunk

    def expect(self, text: str, timeout: float = 30) -> None:
        """Wait until `text` shows after what the last expect matched."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            at = self.text.find(text, self._seen)
            if at >= 0:
                self._seen = at + len(text)
                return
            self._pump(0.1)
        raise AssertionError(f"{text!r} never showed; the terminal shows:\n{self.text[-3000:]}")

    def send(self, data: bytes) -> None:
        time.sleep(0.2)  # like a person: after the prompt is drawn
        os.write(self.master, data)

    def wait(self, timeout: float = 30) -> int:
        deadline = time.monotonic() + timeout
        while self.proc.poll() is None and time.monotonic() < deadline:
            self._pump(0.1)
        self._pump(0.2)
        return self.proc.wait(timeout=1)

    def close(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=5)
        os.close(self.master)


@pytest.fixture
def terminal() -> Iterator[list[Terminal]]:
    opened: list[Terminal] = []
    yield opened
    for each in opened:
        each.close()


def test_on_a_terminal_questions_are_answered_at_the_prompt(runtime: Deployment, terminal: list[Terminal]) -> None:
    term = Terminal(runtime.url, "two_rounds")
    terminal.append(term)
    term.expect("started task ")
    term.expect("Waiting for a name")  # the live status line, re-rendered as the task moves
    term.expect("The task asks: Your name?")
    term.expect("[c]ancel (a): ")
    term.send(b"\r")
    term.expect("name *: ")
    term.send(b"Ada\r")
    term.expect("The task asks: Favourite colour?")
    term.expect("[c]ancel (a): ")
    term.send(b"a\r")
    term.expect("colour *: ")
    term.send(b"blue\r")
    term.expect("completed")
    term.expect("Ada likes blue")
    assert term.wait() == 0, term.text
    assert "input_required" in term.text and "working" in term.text


def test_on_a_terminal_ctrl_c_cancels_the_task(runtime: Deployment, terminal: list[Terminal], tmp_path: Path) -> None:
    marker = tmp_path / "started"
    term = Terminal(runtime.url, "work", json.dumps({"seconds": 60, "marker": str(marker)}))
    terminal.append(term)
    term.expect("started task ")
    found = re.search(r"started task (\S+)", term.text)
    assert found
    wait_until(marker.exists, 30, "the job to start")
    term.expect(": working")  # the statusMessage the job wrote, on the live line
    term.send(b"\x03")
    term.expect("interrupted: cancelling the task")
    assert term.wait() == 130, term.text
    assert "Traceback" not in term.text
    client = McpHttp(runtime.url)
    try:
        assert client.get(found.group(1))["status"] == "cancelled"
    finally:
        client.close()
    wait_until(Path(f"{marker}.stopped").exists, 30, "the job to stop for the cancel")


class Tmux:
    """The CLI in a tmux pane, on a tmux server of its own; the pane stays after the CLI exits.

    The CLI runs under bash, which prints its exit status into the pane when it ends (tmux may mark
    a pane dead before it has the status). bash traps SIGINT with a handler, so the CLI starts with
    the default disposition, as from a person's shell, and bash waits on.
    """

    def __init__(self, socket: Path, *args: str) -> None:
        self.binary = tool("tmux", "Debian: apt-get install tmux")
        self.socket = socket
        argv = [sys.executable, "-m", "celery_mcp_tasks.cli", "call", *args]
        script = f'trap : INT; {shlex.join(argv)}; echo "exit status $?"'
        self._tmux("-f", "/dev/null", "new-session", "-d", "-s", "call", "-x", "120", "-y", "40", "-c", str(ROOT))
        self._tmux("set-option", "-t", "call", "remain-on-exit", "on")
        self._tmux(
            "respawn-pane", "-k", "-t", "call", shlex.join([tool("bash", "Debian: apt-get install bash"), "-c", script])
        )

    def _tmux(self, *args: str) -> str:
        done = subprocess.run(
            [self.binary, "-S", str(self.socket), *args],
            env=_env(TERM="xterm-256color"),
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
        return done.stdout

    def screen(self) -> str:
        """What the pane shows, with its scrollback."""
        return self._tmux("capture-pane", "-p", "-J", "-S", "-200", "-t", "call")

    def keys(self, *keys: str) -> None:
        self._tmux("send-keys", "-t", "call", *keys)

    def exit_status(self) -> int | None:
        """The CLI's exit status once it has ended (bash printed it), else None."""
        found = re.search(r"^exit status (\d+)$", self.screen(), re.MULTILINE)
        return int(found.group(1)) if found else None

    def close(self) -> None:
        subprocess.run(
            [self.binary, "-S", str(self.socket), "kill-server"], capture_output=True, timeout=30, check=False
        )


@pytest.fixture
def tmux(tmp_path: Path) -> Iterator[list[Tmux]]:
    opened: list[Tmux] = []
    yield opened
    for each in opened:
        each.close()


@pytest.mark.parametrize(
    ("tool_name", "arguments", "following"),
    [
        ("work", {"seconds": 60}, ": working"),  # the job's statusMessage on the live line
        ("wait_here", {"timeout": 60}, "[c]ancel (a): "),  # a question at the prompt
    ],
    ids=["working", "asking"],
)
def test_in_tmux_ctrl_c_while_following_ends_in_one_line_and_130(
    runtime: Deployment, tmux: list[Tmux], tmp_path: Path, tool_name: str, arguments: dict[str, float], following: str
) -> None:
    """Following ends before the connection closes: no SDK or anyio traceback after the line."""
    pane = Tmux(tmp_path / "tmux.sock", runtime.url, tool_name, json.dumps(arguments))
    tmux.append(pane)
    wait_until(lambda: following in pane.screen(), 60, f"the CLI to show {following!r}", interval=0.2)
    task_id = re.search(r"started task (\S+)", pane.screen())
    assert task_id, pane.screen()
    pane.keys("C-c")
    try:
        wait_until(lambda: pane.exit_status() is not None, 30, "the CLI to exit after Ctrl-C", interval=0.2)
    except TimeoutError:
        raise AssertionError(f"still running 30 s after Ctrl-C; the pane shows:\n{pane.screen()}") from None
    screen = pane.screen()
    assert pane.exit_status() == 130, screen
    shown = [line.rstrip() for line in screen.splitlines() if line.strip() and not line.startswith("Pane is dead")]
    at = next(n for n, line in enumerate(shown) if "interrupted: cancelling the task" in line)
    assert len(shown) == at + 3, screen  # the line saying so, the task's final status, nothing after (but bash's)
    assert re.search(r"■ cancelled +Cancelled by the client +\d+:\d\d$", shown[-2]), screen
    assert "Traceback" not in screen and "Error" not in screen, screen
    client = McpHttp(runtime.url)
    try:
        assert client.get(task_id.group(1))["status"] == "cancelled"
    finally:
        client.close()


def test_on_a_terminal_ctrl_c_at_a_question_cancels_and_starts_its_own_line(
    runtime: Deployment, terminal: list[Terminal]
) -> None:
    term = Terminal(runtime.url, "two_rounds")
    terminal.append(term)
    term.expect("[c]ancel (a): ")
    term.send(b"\x03")
    term.expect("interrupted: cancelling the task")
    assert term.wait() == 130, term.text
    assert re.search(r"\n[\r]*interrupted: cancelling the task", term.text), repr(term.text)
    assert "Traceback" not in term.text


def test_a_server_lost_while_following_says_how_to_resume(tmp_path: Path) -> None:
    """The connection goes while the job runs: one line says why, the next how to follow the task again."""
    backend = Backend("embedded", {"MCP_TASKS_DATA_DIR": str(tmp_path / "data")})
    with Deployment("tests.apps.runtime_app", backend, tmp_path) as deployment:
        deployment.web()
        deployment.worker()
        out, err = tmp_path / "out", tmp_path / "err"
        with out.open("w") as stdout, err.open("w") as stderr:
            call = subprocess.Popen(
                [sys.executable, "-m", "celery_mcp_tasks.cli", "call", deployment.url, "work", '{"seconds": 60}'],
                cwd=ROOT,
                env=_env(),
                stdin=subprocess.DEVNULL,
                stdout=stdout,
                stderr=stderr,
                text=True,
            )
            try:
                wait_until(lambda: "status=working  (pid=" in out.read_text(), 90, "the job to report")
                deployment.procs[0].stop()  # the web process
                assert call.wait(timeout=60) == 1
            finally:
                call.kill()
        lines = err.read_text().splitlines()
        assert "Traceback" not in err.read_text()
        assert lines[0].startswith(f"celery-mcp-tasks call: cannot reach {deployment.url}: "), lines
        found = re.fullmatch(
            rf"celery-mcp-tasks call: the task may still be running: celery-mcp-tasks call "
            rf"{re.escape(deployment.url)} --resume=(\S+)",
            lines[1],
        )
        assert found, lines
        again = deployment.web(name="web-again")  # back (on a port of its own): the task named is still running
        client = McpHttp(again)
        try:
            assert client.get(found.group(1))["status"] == "working"
            client.task("tasks/cancel", found.group(1))
        finally:
            client.close()


def test_a_session_the_server_forgot_is_one_line_not_a_missing_endpoint() -> None:
    """A stateful server (an older protocol's `initialize` and `Mcp-Session-Id`) restarted under the call answers
    404 to the session's requests: one line says so, not "no MCP endpoint there", and nothing of the SDK's own
    logging (its "Session termination failed" warning) reaches the terminal. A local HTTP server plays it."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Forgetful(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if self.headers.get("Mcp-Session-Id") or body.get("method") != "initialize":
                self.send_response(404)  # a session it no longer has; a method of a newer protocol
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            answer = json.dumps(
                {
                    "jsonrpc": "2.0",
                    "id": body["id"],
                    "result": {
                        "protocolVersion": body["params"]["protocolVersion"],
                        "capabilities": {"tools": {}},
                        "serverInfo": {"name": "forgetful", "version": "1"},
                    },
                }
            ).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(answer)))
            self.send_header("Mcp-Session-Id", "session-1")
            self.end_headers()
            self.wfile.write(answer)

        def do_DELETE(self) -> None:  # the client's goodbye: the session is gone for it too
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Forgetful)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/mcp"
        run = _call(url, "work", "{}", timeout=60)
    finally:
        server.shutdown()
    assert run.returncode == 1, run.stdout + run.stderr
    assert run.stdout == ""
    assert run.stderr.splitlines() == [
        f"celery-mcp-tasks call: {url}: the server no longer knows this connection's session (HTTP 404); "
        "it may have restarted"
    ]
