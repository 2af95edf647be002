"""Fixture jobs for the Celery runtime tests (input rounds, cancellation, retries, lost work).

    celery -A tests.apps.runtime_app worker
    celery-mcp-tasks serve tests.apps.runtime_app

Jobs that tests kill or watch report their pool process id in the statusMessage
(`pid=1234: ...`), which a test reads with `tasks/get`.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

from celery_mcp_tasks import InputTimeout, McpTasks, TaskContext, elicit

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


@tasks.mcp_task
def work(seconds: float, ctx: TaskContext, marker: str | None = None) -> str:
    """Works for `seconds`, checking for cancellation in a tight loop.

    `marker`: a file it creates when its body starts, and `<marker>.stopped` when it stops for a cancel.
    """
    if marker:
        open(marker, "w").close()
    ctx.progress(f"pid={os.getpid()}: working")
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if ctx.cancelled():
            if marker:
                open(f"{marker}.stopped", "w").close()
            return "stopped early"
        time.sleep(0.01)
    return f"worked {seconds:g}s on attempt {ctx.attempt + 1}"


@tasks.mcp_task(terminate=True)
def stubborn(seconds: float, ctx: TaskContext) -> str:
    """Never checks for cancellation; tasks/cancel terminates its process (terminate=True)."""
    ctx.progress(f"pid={os.getpid()}: sleeping")
    time.sleep(seconds)
    return "slept"


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


@tasks.mcp_task
def elsewhere(ctx: TaskContext) -> str:
    """Hands the task to something outside the job, which completes it by row key."""
    ctx.hand_off("Waiting for the webhook", within_s=60)
