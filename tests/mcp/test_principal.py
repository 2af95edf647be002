"""Principals: the owner a task is scoped to, namespaced by the claim (and issuer) that produced it."""

from mcp.server.auth.provider import AccessToken

from celery_mcp_tasks.mcp.principal import principal_of
from celery_mcp_tasks.model import MAX_OWNER, owner_namespace, owner_within


def test_principals_are_namespaced_by_claim_and_issuer():
    user = AccessToken(token="t", client_id="app", scopes=[], subject="42", claims={"iss": "https://a"})
    client_only = AccessToken(token="t", client_id="42", scopes=[], claims={"iss": "https://a"})
    other_issuer = AccessToken(token="t", client_id="app", scopes=[], subject="42", claims={"iss": "https://b"})
    assert principal_of(user) == "sub:https%3A%2F%2Fa:42"
    assert principal_of(client_only) == "client_id:https%3A%2F%2Fa:42"
    assert len({principal_of(user), principal_of(client_only), principal_of(other_issuer)}) == 3
    assert principal_of(None) is None


def test_a_principal_longer_than_the_owner_column_is_named_by_its_digest():
    """A subject of hundreds of characters (percent-encoding triples each non-ASCII byte) or an issuer that long
    must still make an owner that fits the column (PostgreSQL refuses a longer one): stable, and distinct."""
    long_sub = AccessToken(token="t", client_id="app", scopes=[], subject="é" * 100, claims={"iss": "https://a"})
    other_sub = AccessToken(token="t", client_id="app", scopes=[], subject="é" * 101, claims={"iss": "https://a"})
    long_iss = AccessToken(token="t", client_id="app", scopes=[], subject="42", claims={"iss": "x" * 600})
    owners = [principal_of(token) for token in (long_sub, other_sub, long_iss)]
    assert all(owner is not None and len(owner) <= MAX_OWNER for owner in owners)
    assert len(set(owners)) == 3
    assert owners[0] == principal_of(long_sub)
    assert owners[0] is not None and owners[0].startswith("sub:https%3A%2F%2Fa:sha256=")
    assert owner_namespace(owners[0]) == "sub:https%3A%2F%2Fa" and owner_namespace(owners[2]) == "sub"
    # what an operator types to find that principal's tasks names the same owner
    assert owner_within("sub:https://a", "é" * 100) == owners[0]
    # a short principal is spelled as before
    assert principal_of(AccessToken(token="t", client_id="app", scopes=[], subject="b" * 400)) == "sub::" + "b" * 400
