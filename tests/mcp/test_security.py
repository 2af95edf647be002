from mcp.server.transport_security import TransportSecurityMiddleware
from starlette.requests import Request

from celery_mcp_tasks.mcp.security import transport_security


def _request(host: str, origin: str | None = None) -> Request:
    headers = [(b"host", host.encode()), (b"content-type", b"application/json")]
    if origin:
        headers.append((b"origin", origin.encode()))
    return Request({"type": "http", "method": "POST", "path": "/mcp", "headers": headers})


async def _allowed(settings, host: str, origin: str | None = None) -> bool:  # type: ignore[no-untyped-def]
    return await TransportSecurityMiddleware(settings).validate_request(_request(host, origin), is_post=True) is None


def test_local_names_pass_with_or_without_a_port_and_strangers_do_not():
    import anyio

    settings = transport_security("127.0.0.1", ())
    assert anyio.run(_allowed, settings, "localhost")
    assert anyio.run(_allowed, settings, "127.0.0.1:8000", "http://127.0.0.1:8000")
    assert not anyio.run(_allowed, settings, "evil.example.com", "http://evil.example.com")
    assert not anyio.run(_allowed, settings, "127.0.0.1:8000", "http://evil.example.com")


def test_configured_public_names_pass_on_a_public_bind():
    import anyio

    settings = transport_security("0.0.0.0", ("mcp.example.com",))
    assert anyio.run(_allowed, settings, "mcp.example.com", "https://mcp.example.com")
    assert not anyio.run(_allowed, settings, "other.example.com")


def test_a_public_bind_without_names_turns_the_check_off_loudly(caplog):  # type: ignore[no-untyped-def]
    settings = transport_security("0.0.0.0", ())
    assert settings.enable_dns_rebinding_protection is False
    assert "MCP_TASKS_ALLOWED_HOSTS" in caplog.text
