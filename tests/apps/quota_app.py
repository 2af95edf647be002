"""Fixture tools for the quota and idempotency tests, behind bearer tokens that are principals.

    celery -A tests.apps.quota_app worker
    celery-mcp-tasks serve tests.apps.quota_app

`Authorization: Bearer alice` is the subject "alice", so each test brings principals of its own
and no other test's tasks count towards its quotas. `charge` derives its idempotency key from
its arguments, so every process needs MCP_TASKS_IDEMPOTENCY_SECRET.
"""

from __future__ import annotations

import os

from mcp.server.auth.provider import AccessToken
from mcp.server.auth.settings import AuthSettings

from celery_mcp_tasks import McpTasks, TaskContext, elicit


class StaticTokens:
    """Every bearer token is valid and names its own subject."""

    async def verify_token(self, token: str) -> AccessToken | None:
        return AccessToken(token=token, client_id=f"{token}-client", scopes=[], subject=token)


tasks = McpTasks(
    "quota-tests",
    auth=AuthSettings(issuer_url="https://auth.quota.test", resource_server_url=None),
    token_verifier=StaticTokens(),
)
celery = tasks.celery


@tasks.mcp_task
def echo(label: str) -> str:
    """Answers at once, naming the pool process that ran it."""
    return f"{label} (pid={os.getpid()})"


@tasks.mcp_task(needs=("elicitation",), max_active=2)
def asks(label: str, ctx: TaskContext) -> str:
    """Stays unfinished (input_required, no worker held) until answered: at most two per caller."""
    if "ok" not in ctx.input_responses:
        ctx.require_input({"ok": elicit("Go on?", {"ok": bool})}, "Waiting")
    return label


@tasks.mcp_task(idempotency_key=lambda arguments: str(arguments["order"]))
def charge(order: str, amount: int) -> str:
    """Charges an order once: a repeat for the same order is the same task."""
    return f"charged {amount} for {order} (pid={os.getpid()})"
