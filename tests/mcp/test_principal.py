"""Principals: the owner a task is scoped to, namespaced by the claim (and issuer) that produced it."""

import re

import anyio
import pytest
from mcp.server.auth.middleware.auth_context import auth_context_var
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken

from celery_mcp_tasks.mcp.principal import GuardedVerifier, VerifierFailed, principal_of, token_expiry
from celery_mcp_tasks.model import MAX_OWNER, owner_namespace, owner_of, owner_within, spelled_namespace


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
    assert owner_namespace(owners[0]) == "sub:https%3A%2F%2Fa"
    # an issuer too long to leave room for a digest beside it is named by its own, and the subject kept
    long_ns = owner_namespace(owners[2])
    assert owners[2] == f"{long_ns}:42" and re.fullmatch(r"sub:sha256=[0-9a-f]{64}", long_ns)
    # what an operator types to find that principal's tasks names the same owner, the issuer as its provider
    # writes it or as the console shows it
    assert owner_within("sub:https://a", "é" * 100) == owners[0]
    assert owner_within("sub:" + "x" * 600, "42") == owner_within(long_ns, "42") == owners[2]
    assert spelled_namespace("sub:" + "x" * 600) == spelled_namespace(long_ns) == long_ns
    # past that bound the issuer is digested whatever the subject's length, so a namespace filter finds them all
    short = owner_of("x" * 450, subject="4")
    assert short is not None and owner_namespace(short) == spelled_namespace("sub:" + "x" * 450) != "sub:" + "x" * 450
    # a short principal is spelled as before
    assert principal_of(AccessToken(token="t", client_id="app", scopes=[], subject="b" * 400)) == "sub::" + "b" * 400


def test_a_listen_stream_ends_at_its_tokens_expiry_and_an_expiry_of_0_is_none():
    """The SDK reads a falsy `expires_at` as no expiry: a stream must not end at once for it."""
    for expires_at, expected in ((None, None), (0, None), (1_900_000_000, 1_900_000_000.0)):
        token = AccessToken(token="t", client_id="app", scopes=[], subject="42", expires_at=expires_at)
        bound = auth_context_var.set(AuthenticatedUser(token))
        try:
            assert token_expiry() == expected
        finally:
            auth_context_var.reset(bound)
    assert token_expiry() is None  # no token at all


def test_a_verifiers_failures_are_said_once_per_exception_class(caplog: pytest.LogCaptureFixture) -> None:
    """A stray token that breaks the verifier's decoder must not hide an identity provider's outage after it."""
    raised: list[Exception] = [ValueError("bad"), ValueError("bad"), ConnectionError("down"), ValueError("bad")]

    class Failing:
        async def verify_token(self, token: str) -> AccessToken | None:
            raise raised.pop(0)

    guarded = GuardedVerifier(Failing())
    with caplog.at_level("DEBUG", logger="celery_mcp_tasks.mcp"):
        for _ in range(4):
            with pytest.raises(VerifierFailed):
                anyio.run(guarded.verify_token, "secret-token")
    warnings = [record.getMessage() for record in caplog.records if record.levelname == "WARNING"]
    assert [line.split()[2] for line in warnings] == ["ValueError:", "ConnectionError:"]
    assert "secret-token" not in caplog.text
