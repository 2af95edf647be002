"""The request-state key that several web replicas share (MCP_TASKS_REQUEST_STATE_SECRET).

A multi-round (MRTR) question asked before a task exists travels in a `requestState` the SDK seals, by
default under a per-process key: behind a proxy without stickiness another replica cannot unseal the
answer (-32602 "Invalid or expired requestState"). A shared ring of secrets fixes that. Without one,
a single replica never meets a state sealed elsewhere, so the warning waits for the first one that is.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from mcp.server.request_state import AESGCMRequestStateCodec, InvalidRequestState, RequestStateSecurity

from celery_mcp_tasks.config import Settings
from celery_mcp_tasks.preflight import LOCAL_BROKERS
from celery_mcp_tasks.sdk_internals import sealed_elsewhere

logger = logging.getLogger("celery_mcp_tasks")

UNSHARED_NOTE = (
    "MCP_TASKS_REQUEST_STATE_SECRET is unset: a multi-round question asked before a task exists can be "
    "answered only on the web replica that asked it; give every replica the same secret (openssl rand -base64 48)"
)
FOREIGN_STATE_WARNING = (
    "a requestState sealed by another web replica (or before a restart) was refused: "
    "MCP_TASKS_REQUEST_STATE_SECRET is unset, so each replica seals under its own key; give every replica "
    "the same secret (openssl rand -base64 48)"
)
_PROCESS_LOCAL_AUDIENCE = "celery-mcp-tasks/process-local"
"""The key alone already binds a state to this process; an explicit audience keeps an unnamed server valid."""


class ProcessLocalCodec:
    """The SDK's AES-GCM codec under a key made now (as `ephemeral()` does), warning once when a state
    sealed under another process's key arrives."""

    def __init__(self) -> None:
        self._codec = AESGCMRequestStateCodec([os.urandom(32)])
        self._said = False

    def seal(self, payload: bytes) -> str:
        return self._codec.seal(payload)

    def unseal(self, token: str) -> bytes:
        try:
            return self._codec.unseal(token)
        except InvalidRequestState as exc:
            if sealed_elsewhere(exc) and not self._said:
                self._said = True
                logger.warning(FOREIGN_STATE_WARNING)
            raise


def share_request_state(settings: Settings, server_options: dict[str, Any]) -> bool:
    """Put the secrets' policy into `server_options` unless the user gave `request_state_security=`;
    whether the server then seals under a key other processes can hold (not a per-process one)."""
    if server_options.get("request_state_security") is not None:
        return True
    if settings.request_state_secrets:
        # The ring's first secret seals, every one unseals: rotate by prepending the new one.
        server_options["request_state_security"] = RequestStateSecurity(keys=list(settings.request_state_secrets))
        return True
    server_options["request_state_security"] = RequestStateSecurity(
        codec=ProcessLocalCodec(), audience=_PROCESS_LOCAL_AUDIENCE
    )
    return False


def warn_unless_shared(shared: bool, broker_url: str) -> None:
    """One start-up line, at debug level, for a web process that may have siblings (a remote broker) and no
    shared key; the warning waits for a state that another replica sealed (`ProcessLocalCodec`)."""
    if not shared and not broker_url.startswith(LOCAL_BROKERS):
        logger.debug(UNSHARED_NOTE)
