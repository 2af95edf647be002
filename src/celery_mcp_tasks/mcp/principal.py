"""Who is asking: the owner string a task is bound to (`model.owner_of`), from the SDK's auth context.

It names the claim (`sub:` or `client_id:`) and the issuer, percent-encoded, so no client can take a
`client_id` equal to somebody's `sub` and two issuers never share a namespace. `None`: the server
runs without authentication, and the task id alone protects the task.
"""

from __future__ import annotations

import hashlib
import logging
from typing import Any

from mcp.server.auth.middleware.auth_context import get_access_token
from mcp.server.auth.provider import AccessToken, TokenVerifier, principal_components
from mcp.shared.exceptions import MCPError
from mcp_types import INVALID_REQUEST

from celery_mcp_tasks.model import owner_of
from celery_mcp_tasks.outage_log import OutageLog

logger = logging.getLogger("celery_mcp_tasks.mcp")


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
    return float(token.expires_at) if token is not None and token.expires_at else None  # 0: none, as the SDK reads it


def anonymous_caller(request: Any) -> str | None:
    """Which anonymous client sent `request`, for its own quota: a hash of its address (never the
    address itself), or None off HTTP. Behind a proxy, the address uvicorn took from the proxy's
    `X-Forwarded-For` (its `--forwarded-allow-ips`), else the proxy's own."""
    client = getattr(request, "client", None)
    host = getattr(client, "host", None)
    if not host:
        return None
    return hashlib.sha256(b"celery-mcp-tasks caller\0" + str(host).encode()).hexdigest()


class VerifierFailed(Exception):
    """The application's token verifier raised: the request cannot be authenticated now (answered 503 by
    `serving.VerifierOutage`)."""


class GuardedVerifier:
    """The application's `token_verifier`, whose exception (an identity provider it cannot reach, a token its
    JWT library cannot decode) becomes `VerifierFailed`: answered 503 with `Retry-After`, so a client keeps its
    token and tries again, where the SDK lets it through as a plain-text 500 that also drops the connection
    (and a 401 would send an OAuth client to sign in again). Said once per five minutes per exception class
    (`OutageLog`: a stray token that breaks the decoder does not hide an outage), by the class only: an
    exception's text may quote the token."""

    def __init__(self, verifier: TokenVerifier) -> None:
        self.verifier = verifier
        self._logs: dict[str, OutageLog] = {}

    async def verify_token(self, token: str) -> AccessToken | None:
        try:
            return await self.verifier.verify_token(token)
        except Exception as exc:  # noqa: BLE001 - the application's code: its failure is a 503, not a 500
            name = type(exc).__name__
            log = self._logs.setdefault(name, OutageLog(logger))
            log.failed(
                "token_verifier raised %s: requests it cannot verify are answered 503 (a verifier should return "
                "None for a token it refuses)",
                name,
            )
            raise VerifierFailed(name) from None
