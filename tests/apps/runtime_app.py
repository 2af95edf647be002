"""Fixture jobs for the Celery runtime tests (input rounds, cancellation, retries, lost work).

    celery -A tests.apps.runtime_app worker
    celery-mcp-tasks serve tests.apps.runtime_app

Jobs that tests kill or watch report their pool process id in the statusMessage
(`pid=1234: ...`), which a test reads with `tasks/get`.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import Any

from mcp.server.mcpserver.exceptions import ToolError
from mcp.shared.exceptions import MCPError
from mcp_types import CallToolResult, ElicitRequest, InputRequiredResult, TextContent

from celery_mcp_tasks import (
    InputTimeout,
    McpTasks,
    TaskContext,
    TerminalTask,
    elicit,
    elicit_url,
    list_roots,
    sample,
)

tasks = McpTasks("runtime-tests")
celery = tasks.celery
# Celery waits this long for a killed pool process's result before WorkerLostError (default 10 s);
# the tests' stale timeout is 3 s, so without it the janitor would settle the lost job first.
celery.conf.worker_lost_wait = 1.0


def _answer(ctx: TaskContext, key: str, field: str) -> Any:
    answer = ctx.input_responses.get(key) or {}
    return (answer.get("content") or {}).get(field)


@tasks.mcp_task(needs=("elicitation",))
def two_rounds(ctx: TaskContext) -> str:
    """Asks for a name, then (in a second run) for a colour; never parks a worker."""
    if "name" not in ctx.input_responses:
        ctx.require_input({"name": elicit("Your name?", {"name": str})}, "Waiting for a name")
    if "colour" not in ctx.input_responses:
        ctx.require_input({"colour": elicit("Favourite colour?", {"colour": str})}, "Waiting for a colour")
    return f"{_answer(ctx, 'name', 'name')} likes {_answer(ctx, 'colour', 'colour')} (pid={os.getpid()})"


@tasks.mcp_task(needs=("elicitation.url",))
def sign_in(ctx: TaskContext) -> str:
    """Asks the user to sign in at a URL (URL-mode elicitation), then says how that went."""
    if "signed_in" not in ctx.input_responses:
        ctx.require_input({"signed_in": elicit_url("Sign in to ACME", "https://acme.example/oauth")}, "Signing in")
    return f"sign-in: {ctx.input_responses['signed_in']['action']}"


@tasks.mcp_task(needs=("elicitation",))
def ask_again(ctx: TaskContext) -> str:
    """Asks twice with the same key: the second ask is refused (keys are single-use)."""
    if "same" not in ctx.input_responses:
        ctx.require_input({"same": elicit("First?", {"v": str})})
    ctx.require_input({"same": elicit("Again?", {"v": str})})


@tasks.mcp_task(needs=("elicitation",))
def wait_here(timeout: float, ctx: TaskContext) -> str:
    """Blocks its worker up to `timeout` seconds for an answer (the parked flavour)."""
    started = os.getpid()
    answers = ctx.wait_for_input({"ok": elicit("Proceed?", {"ok": bool})}, f"pid={started}: waiting", timeout=timeout)
    return f"answered {answers['ok']['content']['ok']} in pid={started}, same run={os.getpid() == started}"


@tasks.mcp_task(needs=("elicitation",))
def wait_or_give_up(timeout: float, ctx: TaskContext) -> str:
    """Like wait_here, but completes with a fallback when nobody answers in time."""
    try:
        ctx.wait_for_input({"ok": elicit("Proceed?", {"ok": bool})}, timeout=timeout)
    except InputTimeout:
        return "nobody answered"
    return "answered"


def _cancelled_within(ctx: TaskContext, seconds: float, marker: str | None) -> bool:
    """Wait `seconds`, checking for a cancel in a tight loop: True (and `<marker>.stopped`) when one came first."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if ctx.cancelled():
            if marker:
                open(f"{marker}.stopped", "w").close()
            return True
        time.sleep(0.01)
    return False


@tasks.mcp_task
def work(seconds: float, ctx: TaskContext, marker: str | None = None) -> str:
    """Works for `seconds`, checking for cancellation in a tight loop.

    `marker`: a file it creates when its body starts, and `<marker>.stopped` when it stops for a cancel,
    at its first report (refused once the task is final) or at a check.
    """
    if marker:
        open(marker, "w").close()
    try:
        ctx.progress(f"pid={os.getpid()}: working")
    except TerminalTask:  # cancelled between its start and its first report: it stops here
        if marker:
            open(f"{marker}.stopped", "w").close()
        raise
    if _cancelled_within(ctx, seconds, marker):
        return "stopped early"
    return f"worked {seconds:g}s on attempt {ctx.attempt + 1}"


@tasks.mcp_task
def gated(marker: str, ctx: TaskContext, steps: int = 0, timeout: float = 60) -> str:
    """Reports `steps` numeric steps (none by default), creates `marker`, then waits for `<marker>.go`."""
    for n in range(1, steps + 1):
        ctx.progress(f"Step {n} of {steps}", n, steps)
    open(marker, "w").close()
    deadline = time.monotonic() + timeout
    while not os.path.exists(f"{marker}.go") and time.monotonic() < deadline:
        time.sleep(0.01)
    return "through the gate"


@tasks.mcp_task(terminate=True)
def stubborn(seconds: float, ctx: TaskContext) -> str:
    """Never checks for cancellation; tasks/cancel terminates its process (terminate=True)."""
    ctx.progress(f"pid={os.getpid()}: sleeping")
    time.sleep(seconds)
    return "slept"


def _spin(stop: threading.Event) -> None:
    while not stop.is_set():
        pass  # pure Python: holds the GIL but for the interpreter's switches


@tasks.mcp_task(terminate=True)
def stubborn_and_busy(seconds: float, ctx: TaskContext) -> str:
    """`stubborn` with a thread of its own (as a job's library may start) that leaves SIGTERM unblocked and
    keeps the GIL busy: when the terminated process ends, its main thread waits for the GIL between writing
    its last message to the pool and releasing the pool's lock, the moment the pool's own SIGTERM comes."""
    stop = threading.Event()
    threading.Thread(target=_spin, args=(stop,), name="busy", daemon=True).start()
    ctx.progress(f"pid={os.getpid()}: sleeping")
    time.sleep(seconds)
    stop.set()  # only when it ran to its end: a terminated job's thread spins until its process is gone
    return "slept"


@tasks.mcp_task(terminate=True)
def scribble(path: str, seconds: float, ctx: TaskContext) -> str:
    """Writes the time to `path` every 50 ms and never checks for cancellation (terminate=True)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        with open(path, "w") as out:
            out.write(repr(time.monotonic()))
        time.sleep(0.05)
    return "scribbled"


@tasks.mcp_task(default_retry_delay=0.5)
def survivor(seconds: float, ctx: TaskContext) -> str:
    """Like `work` without cancellation, retried quickly when its pool process is killed."""
    ctx.progress(f"pid={os.getpid()}: attempt {ctx.attempt + 1}")
    time.sleep(seconds)
    return f"survived on attempt {ctx.attempt + 1}"


@tasks.mcp_task(max_retries=1, default_retry_delay=0.2)
def poison() -> str:
    """Kills its own pool process every time: retried once, then failed (never a loop)."""
    os.kill(os.getpid(), signal.SIGKILL)
    return "unreachable"


@tasks.mcp_task(max_sends=1)
def fragile(seconds: float, ctx: TaskContext) -> str:
    """Never sent again after a lost worker: the janitor fails it."""
    ctx.progress(f"pid={os.getpid()}: working")
    time.sleep(seconds)
    return "done"


@tasks.mcp_task(bind=True, max_retries=5)
def flaky(self: Any, failures: int, ctx: TaskContext) -> str:
    """Fails `failures` times through `self.retry()` (bind=True), then succeeds."""
    if self.request.retries < failures:
        raise self.retry(exc=RuntimeError("not yet"), countdown=1.0)
    return f"succeeded on attempt {ctx.attempt + 1}"


@tasks.mcp_task(autoretry_for=(RuntimeError,), max_retries=2, retry_kwargs={"countdown": 1.0}, retry_jitter=False)
def hopeless(ctx: TaskContext) -> str:
    """Always raises: autoretry_for retries twice, then the task fails."""
    raise RuntimeError(f"broken on attempt {ctx.attempt + 1}")


@tasks.mcp_task(soft_time_limit=1)
def overtime(ctx: TaskContext) -> str:
    """Reports without pause past its soft time limit: the limit's exception lands in the middle of a write."""
    step = 0
    while True:
        step += 1
        ctx.progress(f"step {step}")


@tasks.mcp_task(time_limit=1)
def stuck(seconds: float) -> str:
    """Sleeps past its hard time limit: the pool kills the process that runs it."""
    time.sleep(seconds)
    return "woke up"


@tasks.mcp_task
def elsewhere(ctx: TaskContext) -> str:
    """Hands the task to something outside the job, which completes it by row key."""
    ctx.hand_off("Waiting for the webhook", within_s=60)


# -- the synchronous path (optional tools called without the extension) ---------------------


@tasks.mcp_task
def explode(message: str) -> str:
    """Raises in the worker: a task ends `failed`, a synchronous call gets the JSON-RPC error."""
    raise RuntimeError(message)


@tasks.mcp_task
def refuse(message: str) -> CallToolResult:
    """Returns a tool error (isError: true), as any MCP tool may."""
    return CallToolResult(content=[TextContent(type="text", text=message)], is_error=True)


@tasks.mcp_task
def refuse_by_raising(message: str) -> str:
    """Raises the SDK's ToolError: the same tool error result as for a synchronous SDK tool."""
    raise ToolError(message)


@tasks.server.tool()
def refuse_by_raising_plainly(message: str) -> str:
    """The same as a plain SDK tool: what a task tool's tool error must look like."""
    raise ToolError(message)


@tasks.mcp_task
def refuse_by_protocol(message: str) -> str:
    """Raises the SDK's MCPError: a protocol error, which the task fails with as it is."""
    raise MCPError(-32602, message, data={"field": "message"})


@tasks.server.tool()
def refuse_by_protocol_plainly(message: str) -> str:
    raise MCPError(-32602, message, data={"field": "message"})


@tasks.mcp_task(sync_timeout_s=1)
def impatient(seconds: float, ctx: TaskContext, marker: str) -> str:
    """`work` with its own 1 s bound on a synchronous call; creates `<marker>.stopped` when cancelled."""
    if _cancelled_within(ctx, seconds, marker):
        return "stopped early"
    return f"worked {seconds:g}s"


@tasks.mcp_task(sync_timeout_s=60)
def patient(seconds: float) -> str:
    """Outlasts a short MCP_TASKS_SYNC_TIMEOUT_S: its own bound wins."""
    time.sleep(seconds)
    return f"waited {seconds:g}s"


@tasks.mcp_task(mode="forbidden")
def never_a_task(seconds: float, ctx: TaskContext, marker: str | None = None) -> str:
    """Answered only as a plain call, however the client calls it: the answer waits for the job. Creates
    `<marker>.stopped` when its call's hidden task is cancelled."""
    if _cancelled_within(ctx, seconds, marker):
        return "stopped early"
    return f"slept {seconds:g}s"


@tasks.mcp_task(mode="forbidden")
def counted_answer(steps: int, interval: float, ctx: TaskContext) -> str:
    """Never a task: reports step i of `steps` (current/total) every `interval` s while its caller waits."""
    for step in range(1, steps + 1):
        time.sleep(interval)
        ctx.progress(f"step {step} of {steps}", current=step, total=steps)
    return f"counted to {steps}"


# -- lifetimes and input of every kind ------------------------------------------------------------


@tasks.mcp_task(ttl_ms=1500)
def short_lived() -> str:
    """Done at once; its task expires 1.5 s after it was created."""
    return "done"


async def _ask_name(arguments: dict[str, Any], answers: dict[str, Any]) -> InputRequiredResult | dict[str, Any]:
    """Before the task exists: ask for a name (MRTR) until the answer is there, then seed the task with it."""
    answer = answers.get("user_name") or {}
    if answer.get("action") == "accept" and isinstance((answer.get("content") or {}).get("name"), str):
        return {"user_name": answer}
    request = elicit("What is your name?", {"name": str})
    return InputRequiredResult(input_requests={"user_name": ElicitRequest.model_validate(request)})


@tasks.mcp_task(needs=("elicitation",), prepare=_ask_name)
def greet_after_asking(greeting: str, ctx: TaskContext) -> str:
    """Greets with the name the client gave before the task existed."""
    return f"{greeting}, {_answer(ctx, 'user_name', 'name')}! (answers: {', '.join(sorted(ctx.input_responses))})"


@tasks.mcp_task(needs=("sampling", "roots"))
def ask_model_and_roots(ctx: TaskContext) -> str:
    """Asks the client's model for a summary and the client for its roots, in one round."""
    if "summary" not in ctx.input_responses:
        ctx.require_input(
            {"summary": sample("Summarize the plan", max_tokens=50), "roots": list_roots()},
            "Waiting for the model and the roots",
        )
    summary = ctx.input_responses["summary"]["content"]["text"]
    roots = [root["uri"] for root in ctx.input_responses["roots"]["roots"]]
    return f"{summary} over {', '.join(roots)}"


# -- the synchronous path: progress, idle bound, questions (tests/integration/test_sync_clients.py) ---------------


@tasks.mcp_task(sync_timeout_s=3)
def count_up(steps: int, interval: float, ctx: TaskContext) -> str:
    """Reports step i of `steps` (current/total) every `interval` s: a 3 s idle bound never cuts it."""
    for step in range(1, steps + 1):
        time.sleep(interval)
        ctx.progress(f"step {step} of {steps}", current=step, total=steps)
    return f"counted to {steps}"


@tasks.mcp_task(sync_timeout_s=3)
def goes_silent(seconds: float, ctx: TaskContext, marker: str) -> str:
    """Reports once, then says nothing for `seconds`; creates `<marker>.stopped` when it sees a cancel."""
    ctx.progress("started", current=1, total=2)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if ctx.cancelled():
            open(f"{marker}.stopped", "w").close()
            return "stopped early"
        time.sleep(0.01)
    return "woke up"


@tasks.mcp_task(needs=("elicitation",))
def ask_name_then_wait(seconds: float, ctx: TaskContext) -> str:
    """Asks for a name (ending its run), then works `seconds` with progress before greeting."""
    if "name" not in ctx.input_responses:
        ctx.require_input({"name": elicit("Your name?", {"name": str})}, "Waiting for a name")
    ctx.progress("greeting", current=1, total=1)
    time.sleep(seconds)
    return f"Hello, {_answer(ctx, 'name', 'name')}"


@tasks.mcp_task
def asks_undeclared(ctx: TaskContext) -> str:
    """Asks for a sampling answer without declaring `needs`: a client without sampling cannot answer it."""
    if "summary" not in ctx.input_responses:
        ctx.require_input({"summary": sample("Summarize", max_tokens=10)}, "Waiting for the model")
    return str(ctx.input_responses["summary"]["content"]["text"])
