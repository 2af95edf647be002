"""Every place this package reaches past kombu's public API (pinned: kombu 5.7.x), in one package.

This module holds what every process imports; kombu's two transports are modules of this package that
kombu loads by their "module:Class" path only when their broker is used (here, the Redis one would load
redis-py into an embedded server): `redis_transport` (a broker outage mid-job) and `filesystem_transport`
(the embedded default's broker). tests/worker/test_kombu_internals.py fails naming the version when one
moves; the transports' own tests pin the private methods they override.

1. `bound_publish_retries`: kombu's `Mailbox` (under `control.revoke`) publishes with `retry=True` and no
   policy, so `Connection.ensure` retries a lost broker forever. A `retry_policy=` on `control.broadcast`
   would remove it.
2. `PIDBOX_LOGGER`: where kombu's `Node.dispatch` logs a remote control command that raised, so a worker
   can leave out tracebacks it has explained. An error hook on the mailbox's node would remove it.
"""

from __future__ import annotations

from typing import Any

VERSIONS = ("5.7",)
"""The kombu releases whose internals this module was checked against."""

PIDBOX_LOGGER = "kombu.pidbox"


def bound_publish_retries(conn: Any, policy: dict[str, Any]) -> None:
    """Make every retried publish on `conn` (a kombu `Connection`) retry within `policy` only."""
    unbounded = conn.ensure

    def ensure(obj: Any, fun: Any, **asked: Any) -> Any:
        return unbounded(obj, fun, **{**asked, **policy})

    conn.ensure = ensure
