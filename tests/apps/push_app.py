"""Fixture app for the push tests: bearer-token principals and a job the test steps through.

    celery-mcp-tasks serve tests.apps.push_app
    celery -A tests.apps.push_app worker

Tokens are principals: `Authorization: Bearer alice` is the subject "alice".
`gated_steps` writes one client-visible change per gate file the test creates,
so every notification the test expects is caused by exactly one test action
and nothing can coalesce.
"""

from __future__ import annotations

import time
from pathlib import Path

from mcp.server.auth.provider import AccessToken
from mcp.server.auth.settings import AuthSettings
from mcp.server.mcpserver import Context

from celery_mcp_tasks import McpTasks, TaskContext, elicit

TOKENS = ("alice", "mallory")


class StaticTokens:
    """Any token in TOKENS is valid and names its own subject; `<name>@<epoch s>` is that subject's token
    expiring then; `long:<n>` names a subject of n "é"; `nobody` names no principal (a verifier's mistake);
    `raises` makes it raise."""

    async def verify_token(self, token: str) -> AccessToken | None:
        name, _, until = token.partition("@")
        if name in TOKENS and until.isdigit():
            return AccessToken(token=token, client_id=f"{name}-client", scopes=[], subject=name, expires_at=int(until))
        if token.startswith("long:") and token[5:].isdigit():
            return AccessToken(token=token, client_id="long-client", scopes=[], subject="é" * int(token[5:]))
        if token == "raises":  # a verifier's failure (an unreachable identity provider, a token it cannot decode)
            raise ConnectionError("identity provider unreachable")
        if token == "nobody":
            return AccessToken(token=token, client_id="", scopes=[])
        if token not in TOKENS:
            return None
        return AccessToken(token=token, client_id=f"{token}-client", scopes=[], subject=token)


tasks = McpTasks(
    "push-fixture",
    auth=AuthSettings(issuer_url="https://auth.push.test", resource_server_url=None),
    token_verifier=StaticTokens(),
)
celery = tasks.celery


def wait_gate(ctx: TaskContext, gate_dir: str, name: str, timeout_s: float = 120.0) -> bool:
    """Block until the test creates `gate_dir/name`; False if the task was cancelled meanwhile."""
    gate = Path(gate_dir) / name
    deadline = time.monotonic() + timeout_s
    while not gate.exists():
        if ctx.cancelled():
            return False
        if time.monotonic() > deadline:
            raise TimeoutError(f"gate {name} never opened")
        time.sleep(0.02)
    return True


@tasks.mcp_task(mode="required", needs=("elicitation",))
def gated_steps(gate_dir: str, ctx: TaskContext) -> str:
    """One visible change per gate: 'at gate 1', step 1, step 2, input, 'resumed', step 3, done."""
    if "confirm" not in ctx.input_responses:
        ctx.progress("at gate 1")
        if not wait_gate(ctx, gate_dir, "1"):
            return "cancelled"
        ctx.progress("step 1")
        wait_gate(ctx, gate_dir, "2")
        ctx.progress("step 2")
        wait_gate(ctx, gate_dir, "3")
        ctx.require_input({"confirm": elicit("Carry on?", {"ok": bool})}, "Waiting for confirmation")
    ctx.progress("resumed")
    wait_gate(ctx, gate_dir, "4")
    ctx.progress("step 3")
    wait_gate(ctx, gate_dir, "5")
    return "done"


@tasks.mcp_task(mode="required")
def idle(gate_dir: str, ctx: TaskContext) -> str:
    """Works until cancelled (or its gate opens): a sentinel whose cancel ends a test's stream."""
    ctx.progress("idling")
    wait_gate(ctx, gate_dir, "end")
    return "ended"


@tasks.server.tool()
async def announce(uri: str, ctx: Context) -> str:
    """Publishes core listen events on the SDK bus: tools list changed, and an update of `uri`."""
    await ctx.notify_tools_changed()
    await ctx.notify_resource_updated(uri)
    return "announced"
