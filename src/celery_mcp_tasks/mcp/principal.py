"""Who is asking: the owner string a task is bound to.

Taken from the SDK's auth context. Each id carries the claim that produced it
(`sub:` for a user, `client_id:` for a client acting for itself) plus the
issuer, each part percent-encoded, so no client can pick a `client_id` that
equals somebody's `sub`, and two issuers never share a namespace. `None`
means the server runs without authentication: then the task id alone
protects the task.
"""

from __future__ import annotations

from urllib.parse import quote

from mcp.server.auth.middleware.auth_context import get_access_token
from mcp.server.auth.provider import AccessToken, principal_components


def principal_of(token: AccessToken | None) -> str | None:
    if token is None:
        return None
    client_id, issuer, subject = principal_components(token)
    iss = quote(issuer or "", safe="")
    if subject:
        return f"sub:{iss}:{quote(subject, safe='')}"
    if client_id:
        return f"client_id:{iss}:{quote(client_id, safe='')}"
    return None


def current_principal() -> str | None:
    return principal_of(get_access_token())
