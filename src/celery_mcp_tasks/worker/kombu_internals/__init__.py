"""Every place this package reaches past kombu's public API (pinned: kombu 5.7.x), in one package.

This module holds what every process imports; kombu's transports are modules of this package that kombu
loads by their "module:Class" path only when their broker is used (here, the Redis one would load redis-py
into an embedded server): `redis_transport` (a broker outage mid-job, on Redis and Redis Sentinel) and
`filesystem_transport` (the embedded default's broker). tests/worker/test_kombu_internals.py fails naming the version when one
moves; the transports' own tests pin the private methods they override.

1. `bound_publish_retries`: kombu's `Mailbox` (under `control.revoke`) publishes with `retry=True` and no
   policy, so `Connection.ensure` retries a lost broker forever. A `retry_policy=` on `control.broadcast`
   would remove it.
2. `PIDBOX_LOGGER`: where kombu's `Node.dispatch` logs a remote control command that raised, so a worker
   can leave out tracebacks it has explained. An error hook on the mailbox's node would remove it.
3. `fixed_transport`: the app's own `broker_transport` names one of the transports above, and kombu
   gives `rediss://` its TLS default only while the scheme names the transport (`Connection._init_params`),
   so a `rediss://` URL keeps kombu's own transport unless the app set its TLS options.
"""

from __future__ import annotations

from typing import Any

VERSIONS = ("5.7",)
"""The kombu releases whose internals this module was checked against."""

PIDBOX_LOGGER = "kombu.pidbox"

REDIS_TRANSPORT = "celery_mcp_tasks.worker.kombu_internals.redis_transport:Transport"
"""kombu's Redis transport with the fix for a broker outage mid-job (imported by kombu only when used)."""

SENTINEL_TRANSPORT = "celery_mcp_tasks.worker.kombu_internals.redis_transport:SentinelTransport"
"""kombu's Redis Sentinel transport with the same fix."""

FILESYSTEM_TRANSPORT = "celery_mcp_tasks.worker.kombu_internals.filesystem_transport:Transport"
"""kombu's filesystem transport with atomic message files (a reader never sees half a message)."""


def fixed_transport(conf: Any) -> str | None:
    """Our transport for this app's broker URL, set as the app's own `broker_transport` (kombu takes it over
    the URL's scheme; its process-wide alias table is never touched), or None: for a transport the application
    chose, any other scheme, and `rediss://` without TLS options (kombu gives that scheme its TLS default only
    while the scheme names the transport, `Connection._init_params`)."""
    if conf.broker_transport:
        return None
    url = str(conf.broker_url)
    scheme = url.partition("://")[0].lower()
    if scheme == "filesystem":
        return FILESYSTEM_TRANSPORT
    if scheme == "redis" or (scheme == "rediss" and (conf.broker_use_ssl or "ssl_cert_reqs=" in url)):
        return REDIS_TRANSPORT
    if scheme == "sentinel":
        return SENTINEL_TRANSPORT
    return None


def bound_publish_retries(conn: Any, policy: dict[str, Any]) -> None:
    """Make every retried publish on `conn` (a kombu `Connection`) retry within `policy` only."""
    unbounded = conn.ensure

    def ensure(obj: Any, fun: Any, **asked: Any) -> Any:
        return unbounded(obj, fun, **{**asked, **policy})

    conn.ensure = ensure
