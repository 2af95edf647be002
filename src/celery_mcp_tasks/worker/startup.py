"""Start-up of the Celery processes: refuse to start when misconfigured, say what this worker serves.

The check runs once where each process begins: `celeryd_init` in the worker's main process (before the
pool forks) and `beat_init` in a standalone beat (`worker -B`'s is covered by its worker's). Celery's
`Signal.send` swallows an `Exception` from a handler, but not a `SystemExit`: that stops the process.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Collection
from typing import Any

from amqp.exceptions import AccessRefused, NotAllowed
from celery import Celery, signals

from celery_mcp_tasks.config import ConfigError, redact_url

_AMQP_SCHEMES = ("amqp", "amqps", "pyamqp")
_REDIS_SCHEMES = ("redis", "rediss", "sentinel")  # sentinel: its `;` list names the sentinels, not failovers
_PROBE_TIMEOUT_S = 3.0


def _for_good(exc: Exception) -> bool:
    """A broker refusing what no wait mends. RabbitMQ: a vhost it does not have (530 "vhost ... not found"), the
    user's permission on it (530 "access to vhost ... refused for user") or the user's login (403 "Login was
    refused"); not a vhost that is down or over its connection limit, nor a login backend that is down: those
    pass, and Celery's reconnecting waits for them. Redis: the password."""
    text = str(exc)
    return (
        (isinstance(exc, NotAllowed) and ("not found" in text or "refused for user" in text))
        or (isinstance(exc, AccessRefused) and "Login was refused" in text)
        or _redis_login_refused(exc)
    )


def _redis_login_refused(exc: BaseException) -> bool:
    """Redis refusing the password (or asking for one): redis-py's `AuthenticationError`, which kombu re-raises
    as its own `OperationalError` from it. Redis checks passwords itself, so no wait mends one."""
    try:  # the `redis` extra: not installed, not the broker
        from redis.exceptions import AuthenticationError
    except ImportError:
        return False
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, AuthenticationError):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def broker_refusal(app: Celery) -> str | None:
    """Why RabbitMQ or Redis refuses this app for good, as one line naming the setting; else None (it lets the app
    in, cannot be reached, or refuses for a while: Celery waits, as it does). Celery's consumer reconnected to a
    vhost that does not exist several times a second, a traceback each time, died on a wrong RabbitMQ password
    with one, and retried a wrong Redis password for ever; none named the setting. One attempt, no retries; a
    failover list (`;`) is left to Celery, which tries its next broker (a `sentinel://` list is one broker)."""
    url = app.conf.broker_url
    scheme = url.split("://", 1)[0].lower() if isinstance(url, str) else ""
    if not isinstance(url, str) or (";" in url and scheme != "sentinel"):
        return None
    if scheme not in _AMQP_SCHEMES and scheme not in _REDIS_SCHEMES:
        return None
    # Redis's transport takes its timeouts from the transport options (Celery adds these to the app's), not
    # from `connect_timeout`: a server that accepts and never answers held the probe as long as they said.
    bounded = {"socket_timeout": _PROBE_TIMEOUT_S, "socket_connect_timeout": _PROBE_TIMEOUT_S}
    options = bounded if scheme in _REDIS_SCHEMES else None
    conn = app.connection_for_write(connect_timeout=_PROBE_TIMEOUT_S, transport_options=options)
    try:
        conn.ensure_connection(max_retries=0)
    except Exception as exc:  # noqa: BLE001 - down, or slow: Celery's own reconnecting handles it
        if not _for_good(exc):
            return None
        reason = str(exc).strip().splitlines()[0]
        check = "user, password and vhost" if scheme in _AMQP_SCHEMES else "password (and user)"
        return f"CELERY_BROKER_URL: the broker {redact_url(url)} refuses this app ({reason}); check its {check}"
    finally:
        conn.release()
    return None


def install_startup(
    app: Celery, check: Callable[[str], None], describe: Callable[[Collection[str]], list[str]]
) -> list[Callable[..., None]]:
    """`check(role)` raises `ConfigError` to refuse; `describe(consumed)` gives the lines printed before the
    banner, told the queues the worker consumes (those its `-Q` chose; every declared queue without it).

    The receivers are connected weakly and returned: their owner keeps them, and takes them along when it goes."""
    checked: list[str] = []  # this process (or the worker it was forked from) passed the check

    def refuse_unless_ready(role: str) -> None:
        try:
            check(role)
            refused = broker_refusal(app)
            if refused is not None:
                raise ConfigError(refused)
        except ConfigError as exc:
            # The real stderr: beat has already redirected sys.stderr into its logger by now.
            print(f"celery-mcp-tasks: configuration error: {exc}", file=sys.__stderr__, flush=True)
            raise SystemExit(1) from None
        checked.append(role)

    # Connected by call, not as decorators (as in the bridge): Celery's signals are untyped.
    def _worker(sender: Any = None, instance: Any = None, **_: Any) -> None:
        if getattr(instance, "app", None) is app:
            refuse_unless_ready("worker")

    def _banner(sender: Any = None, instance: Any = None, **_: Any) -> None:
        if getattr(instance, "app", None) is app and not getattr(instance, "quiet", False):
            queues = instance.app.amqp.queues
            consumed = set(queues.consume_from or queues)  # `-Q` selects; without it every declared queue
            print("\n".join(describe(consumed)), file=sys.__stdout__, flush=True)

    def _beat(sender: Any = None, **_: Any) -> None:
        if getattr(sender, "app", None) is app and not checked:
            refuse_unless_ready("beat")

    signals.celeryd_init.connect(_worker)
    signals.celeryd_after_setup.connect(_banner)
    signals.beat_init.connect(_beat)
    return [_worker, _banner, _beat]
