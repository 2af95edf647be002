"""Who is asking: the owner string a task is bound to (`model.owner_of`), from the SDK's auth context.

It names the claim (`sub:` or `client_id:`) and the issuer, percent-encoded, so no client can take a
`client_id` equal to somebody's `sub` and two issuers never share a namespace. `None`: the server
runs without authentication, and the task id alone protects the task.
"""

from __future__ import annotations

import hashlib
from typing import Any

from mcp.server.auth.middleware.auth_context import get_access_token
from mcp.server.auth.provider import AccessToken, principal_components
from mcp.shared.exceptions import MCPError
from mcp_types import INVALID_REQUEST

from celery_mcp_tasks.model import owner_of


def principal_of(token: AccessToken | None) -> str | None:
    """The owner string of the token's principal (`model.owner_of`), None without a token.

    A token naming nobody (no subject, an empty client id) is refused (-32600): taken as anonymous, every
    such token would share one owner's tasks and quota."""
    if token is None:
        return None
    client_id, issuer, subject = principal_components(token)
    owner = owner_of(issuer, subject=subject, client_id=client_id)
    if owner is None:
        raise MCPError(
            INVALID_REQUEST,
            "The access token names no principal (no subject, an empty client_id): the server's token_verifier "
            "must give every token one",
        )
    return owner


def current_principal() -> str | None:
    return principal_of(get_access_token())


def token_expiry() -> float | None:
    """When the request's access token expires (epoch seconds), None without a token or an expiry: what a
    listen stream ends at."""
    token = get_access_token()
    return None if token is None or token.expires_at is None else float(token.expires_at)


def anonymous_caller(request: Any) -> str | None:
    """Which anonymous client sent `request`, for its own quota: a hash of its address (never the
    address itself), or None off HTTP. Behind a proxy, the address uvicorn took from the proxy's
    `X-Forwarded-For` (its `--forwarded-allow-ips`), else the proxy's own."""
    client = getattr(request, "client", None)
    host = getattr(client, "host", None)
    if not host:
        return None
    return hashlib.sha256(b"celery-mcp-tasks caller\0" + str(host).encode()).hexdigest()
