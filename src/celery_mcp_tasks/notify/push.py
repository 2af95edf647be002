"""Push: which transport carries change hints (MCP_TASKS_NOTIFY), and its life in a web process.

`auto` picks `postgres` for a PostgreSQL store (the hint rides the write), else `broker` for a networked
Celery broker (a kombu fanout), else `poll` (the embedded default); a forced transport that cannot work
is a start-up error; `off` publishes and listens to nothing. Every process publishes; only web processes
listen, one listener each, feeding their hub.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import anyio
from sqlalchemy.engine import Engine

from celery_mcp_tasks.config import ConfigError, Settings, redact_url
from celery_mcp_tasks.model import _Default
from celery_mcp_tasks.notify.base import Notifier
from celery_mcp_tasks.notify.hub import Hub
from celery_mcp_tasks.notify.polling import RowPoller
from celery_mcp_tasks.notify.postgres import PG_HINT, PgListener, PgNotifier
from celery_mcp_tasks.store.base import ChangeHint, Store
from celery_mcp_tasks.store.engine import is_postgres

logger = logging.getLogger(__name__)

Mode = Literal["postgres", "broker", "poll", "off"]

# Brokers with no cross-process fanout worth using (single-machine or polling transports).
_LOCAL_BROKERS = frozenset({"filesystem", "memory", "sqla", "sqlalchemy", "cache"})
_READY_TIMEOUT_S = 10.0


def broker_scheme(url: str) -> str:
    first = url.split(";", 1)[0].strip()
    return first.split("://", 1)[0].split("+", 1)[0].lower()


def select_mode(settings: Settings, broker_url: str) -> Mode:
    """The transport for these settings; `ConfigError` names MCP_TASKS_NOTIFY when it cannot work."""
    postgres = is_postgres(settings.store_url)
    networked = broker_scheme(broker_url) not in _LOCAL_BROKERS
    mode = settings.notify
    if mode == "auto":
        return "postgres" if postgres else "broker" if networked else "poll"
    if mode == "postgres" and not postgres:
        raise ConfigError("MCP_TASKS_NOTIFY: postgres needs a PostgreSQL store (MCP_TASKS_DATABASE_URL)")
    if mode == "broker" and not networked:
        raise ConfigError(
            f"MCP_TASKS_NOTIFY: broker needs a Redis or RabbitMQ broker, not {broker_scheme(broker_url)}://"
        )
    return mode  # type: ignore[return-value]


class _Listener(Protocol):
    ready: anyio.Event

    async def run(self) -> None: ...


@dataclass(frozen=True)
class BrokerAccess:
    """How to reach the Celery broker without importing Celery here."""

    url: str
    namespace: str
    connection: Callable[[], Any]  # a kombu Connection for reading (the listener)
    producer_pool: Callable[[], Any]  # a kombu ProducerPool (the publisher)

    @classmethod
    def of(cls, app: Any) -> BrokerAccess:
        """From a configured Celery app (read by attribute: notify/ does not import Celery)."""
        return cls(
            url=str(app.conf.broker_url),
            namespace=str(app.conf.task_default_queue or "celery"),
            # Heartbeats (AMQP, `broker_heartbeat`, 120 s by default) as a worker has them: a listener
            # idle between changes notices a connection a NAT or a load balancer dropped silently.
            connection=lambda: app.connection_for_read(heartbeat=app.conf.broker_heartbeat),
            producer_pool=lambda: app.producer_pool,
        )


class Push:
    """The push side of one `McpTasks`: publisher for every process, hub and listener for web ones.

    `notifier`: `DEFAULT` publishes on the selected transport; `None` turns
    push off; any other `Notifier` replaces the publisher (web processes still
    listen, so it can keep push by calling `push.publisher`).
    """

    def __init__(self, settings: Settings, *, notifier: Notifier | _Default | None, broker: BrokerAccess) -> None:
        self.mode: Mode = "off" if notifier is None else select_mode(settings, broker.url)
        self._custom: Notifier | None = None if isinstance(notifier, _Default) else notifier
        self._settings = settings
        self._broker = broker
        self._bound: tuple[Store, Engine] | None = None
        self._publisher: Notifier | None = None
        self.hub = Hub()

    def bind_store(self, store: Store, engine: Engine) -> None:
        """This process's store (built with `change_hint`): push reads versions from it (polling) and,
        for a custom notifier that keeps push on PostgreSQL, sends hints on its `engine`. Called once
        per process, before the service exists."""
        self._bound = (store, engine)
        self._publisher = None  # a publisher bound to an inherited (pre-fork) store must not be reused

    def _bound_store(self) -> tuple[Store, Engine]:
        if self._bound is None:
            raise RuntimeError("Push.bind_store() was not called in this process")
        return self._bound

    @property
    def publisher(self) -> Notifier | None:
        """The transport's own publisher as a `Notifier` (None when polling or off)."""
        if self._publisher is None:
            if self.mode == "broker":
                from celery_mcp_tasks.notify.broker import BrokerPublisher, hint_exchange

                self._publisher = BrokerPublisher(
                    self._broker.producer_pool, hint_exchange(self._broker.namespace), url=redact_url(self._broker.url)
                )
            elif self.mode == "postgres":
                self._publisher = PgNotifier(lambda: self._bound_store()[1])
        return self._publisher

    @property
    def notifier(self) -> Notifier | None:
        """What the service calls after each write."""
        if self._custom is not None:
            return self._custom
        return self.publisher if self.mode == "broker" else None

    @property
    def change_hint(self) -> ChangeHint | None:
        """What the store sends with each write (PostgreSQL's NOTIFY, in the writing statement)."""
        return PG_HINT if self.mode == "postgres" and self._custom is None else None

    def _listener(self) -> _Listener | None:
        if self.mode == "postgres":
            return PgListener(self._settings.store_url, self.hub)
        if self.mode == "broker":
            from celery_mcp_tasks.notify.broker import BrokerListener, hint_exchange

            return BrokerListener(
                self._broker.connection,
                hint_exchange(self._broker.namespace),
                self.hub,
                url=redact_url(self._broker.url),
            )
        if self.mode == "poll":
            return RowPoller(lambda keys: self._bound_store()[0].versions(keys), self.hub)
        return None

    @asynccontextmanager
    async def serving(self) -> AsyncIterator[None]:
        """Run this web process's listener for the duration (the ASGI lifespan)."""
        listener = self._listener()
        if listener is None:
            yield
            return
        self.hub.bind()
        async with anyio.create_task_group() as tg:
            tg.start_soon(listener.run)
            with anyio.move_on_after(_READY_TIMEOUT_S):
                await listener.ready.wait()
            if not listener.ready.is_set():
                logger.warning("task change listener (%s) is not connected yet; streams catch up once it is", self.mode)
            try:
                yield
            finally:
                tg.cancel_scope.cancel()
