"""Every place this package reaches past kombu's public API, in one module (pinned: kombu 5.7.x).

Each entry names the private thing it relies on and the public hook that would
remove the need; `tests/worker/test_kombu_internals.py` fails with the installed
version in its message as soon as one of them moves. (kombu's two transports,
`worker.redis_transport` and `worker.filesystem_transport`, subclass kombu's
channels and override private methods: they are modules of their own because
kombu loads a transport by its module path, and the Redis one imports `redis`;
each has its own contract test.)

1. `bound_publish_retries`: kombu's `Mailbox` (under Celery's `control.revoke`)
   publishes with `retry=True` and no policy, through `Connection.ensure`, which
   then retries a lost broker forever; the connection's `ensure` is wrapped to
   cap it. A `retry_policy=` on `control.broadcast` would remove it.
2. `PIDBOX_LOGGER`: the logger on which kombu's `Node.dispatch` reports a remote
   control command that raised ("pidbox command error: %r", with the exception),
   so a worker can leave out tracebacks it has already explained. An error hook
   on the mailbox's node would remove it.
"""

from __future__ import annotations

from typing import Any

__all__ = ["PIDBOX_LOGGER", "VERSIONS", "bound_publish_retries"]

VERSIONS = ("5.7",)
"""The kombu releases whose internals this module was checked against."""

PIDBOX_LOGGER = "kombu.pidbox"
"""The logger of kombu's remote-control dispatch (a command's exception is logged there with its traceback)."""


def bound_publish_retries(conn: Any, policy: dict[str, Any]) -> None:
    """Make every retried publish on `conn` (a kombu `Connection`) retry within `policy` only."""
    unbounded = conn.ensure

    def ensure(obj: Any, fun: Any, **asked: Any) -> Any:
        return unbounded(obj, fun, **{**asked, **policy})

    conn.ensure = ensure
