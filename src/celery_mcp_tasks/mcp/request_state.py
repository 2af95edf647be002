"""The request-state key that several web replicas share (MCP_TASKS_REQUEST_STATE_SECRET).

A multi-round (MRTR) question asked before a task exists (a tool's `prepare=`, or the
synchronous path's question for a client without the extension) travels in a
`requestState` the SDK seals, by default under a key each process makes at start. Behind a
proxy without stickiness the answer may reach another replica, which cannot unseal it and
answers -32602 "Invalid or expired requestState". A shared ring of secrets fixes that; a
web process on a remote broker without one says so once at start-up.
"""

from __future__ import annotations

import logging
from typing import Any

from mcp.server.request_state import RequestStateSecurity

from celery_mcp_tasks.config import Settings
from celery_mcp_tasks.preflight import LOCAL_BROKERS

__all__ = ["UNSHARED_WARNING", "share_request_state", "warn_unless_shared"]

logger = logging.getLogger("celery_mcp_tasks")

UNSHARED_WARNING = (
    "MCP_TASKS_REQUEST_STATE_SECRET is unset: a multi-round question asked before a task exists can be "
    "answered only on the web replica that asked it; give every replica the same secret (openssl rand -base64 48)"
)


def share_request_state(settings: Settings, server_options: dict[str, Any]) -> bool:
    """Put the secrets' policy into `server_options` unless the user gave `request_state_security=`;
    whether the server then seals under a key other processes can hold (not the SDK's per-process one)."""
    if server_options.get("request_state_security") is None and settings.request_state_secrets:
        # The ring's first secret seals, every one unseals: rotate by prepending the new one.
        server_options["request_state_security"] = RequestStateSecurity(keys=list(settings.request_state_secrets))
    return server_options.get("request_state_security") is not None


def warn_unless_shared(shared: bool, broker_url: str) -> None:
    """One start-up line for a web process that may have siblings (a remote broker) and no shared key."""
    if not shared and not broker_url.startswith(LOCAL_BROKERS):
        logger.warning(UNSHARED_WARNING)
