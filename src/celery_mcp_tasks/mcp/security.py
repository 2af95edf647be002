"""DNS-rebinding protection: local names (any port) and MCP_TASKS_ALLOWED_HOSTS are accepted.

Bound to a non-local address with no names configured, the SDK's check would refuse the server's own
public name, so it stays off there and says so once at start-up.
"""

from __future__ import annotations

import logging

from mcp.server.transport_security import TransportSecuritySettings

logger = logging.getLogger("celery_mcp_tasks.mcp")

LOCAL_NAMES = ("localhost", "127.0.0.1", "[::1]")
LOCAL_BINDS = ("127.0.0.1", "localhost", "::1")


def _with_any_port(name: str) -> list[str]:
    return [name] if name.endswith(":*") else [name, f"{name}:*"]


def transport_security(bind_host: str, allowed_hosts: tuple[str, ...]) -> TransportSecuritySettings:
    if not allowed_hosts and bind_host not in LOCAL_BINDS:
        logger.warning(
            "DNS-rebinding protection is off: the server listens on %s and MCP_TASKS_ALLOWED_HOSTS is unset",
            bind_host,
        )
        return TransportSecuritySettings(enable_dns_rebinding_protection=False)
    hosts = [pattern for name in (*LOCAL_NAMES, *allowed_hosts) for pattern in _with_any_port(name)]
    origins = [f"{scheme}://{pattern}" for pattern in hosts for scheme in ("http", "https")]
    return TransportSecuritySettings(enable_dns_rebinding_protection=True, allowed_hosts=hosts, allowed_origins=origins)
