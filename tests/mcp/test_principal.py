"""Principals: the owner a task is scoped to, namespaced by the claim (and issuer) that produced it."""

from mcp.server.auth.provider import AccessToken

from celery_mcp_tasks.mcp.principal import principal_of


def test_principals_are_namespaced_by_claim_and_issuer():
    user = AccessToken(token="t", client_id="app", scopes=[], subject="42", claims={"iss": "https://a"})
    client_only = AccessToken(token="t", client_id="42", scopes=[], claims={"iss": "https://a"})
    other_issuer = AccessToken(token="t", client_id="app", scopes=[], subject="42", claims={"iss": "https://b"})
    assert principal_of(user) == "sub:https%3A%2F%2Fa:42"
    assert principal_of(client_only) == "client_id:https%3A%2F%2Fa:42"
    assert len({principal_of(user), principal_of(client_only), principal_of(other_issuer)}) == 3
    assert principal_of(None) is None
