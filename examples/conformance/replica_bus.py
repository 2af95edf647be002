"""A `SubscriptionBus` over PostgreSQL LISTEN/NOTIFY: core change events reach every replica.

The SDK's default bus is in-process: `ctx.notify_tools_changed()` on one web replica reaches
only that replica's listen streams, so behind a round-robin proxy a client listening on
replica A never hears of a change triggered through replica B. `SubscriptionBus` is the SDK's
seam for exactly this; this one rides the task store's PostgreSQL (delivered at commit, ~1 ms)
and stays in-process on any other store. Task notifications need none of it: they cross
replicas on the package's own push transport.

Each event is delivered to this process's streams at once and announced to the others as
`{"o": origin, "m": method, "u": uri}`; a process ignores its own announcements.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

import anyio
from mcp.server.subscriptions import InMemorySubscriptionBus, ServerEvent
from mcp.shared.subscriptions import ResourceUpdated, event_from_wire, event_to_notification
from sqlalchemy.engine import make_url

from celery_mcp_tasks.plugin import Plugin, Runtime

__all__ = ["ReplicaBus"]

logger = logging.getLogger(__name__)

CHANNEL = "mcp_conformance_events"
_RETRY_S = 1.0


class ReplicaBus(Plugin):
    """In-process fan-out plus a NOTIFY to the other replicas; also the app's plugin
    (`McpTasks(..., subscriptions=bus, plugins=[bus])`), to relay while the app is served."""

    def __init__(self) -> None:
        self._local = InMemorySubscriptionBus()
        self._origin = uuid.uuid4().hex
        self._url: str | None = None

    def setup(self, runtime: Runtime) -> None:
        """Share events over the app's store (nothing to do off PostgreSQL)."""
        url = make_url(runtime.settings.store_url)
        if url.get_backend_name() == "postgresql":
            self._url = url.set(drivername="postgresql").render_as_string(hide_password=False)

    def serving(self) -> AbstractAsyncContextManager[None] | None:
        """While the web app is served: relay the other replicas' events."""
        return self.relaying() if self._url is not None else None

    def subscribe(self, listener: Callable[[ServerEvent], None]) -> Callable[[], None]:
        return self._local.subscribe(listener)

    async def publish(self, event: ServerEvent) -> None:
        await self._local.publish(event)
        if self._url is None:
            return
        uri = event.uri if isinstance(event, ResourceUpdated) else None
        body = json.dumps({"o": self._origin, "m": event_to_notification(event, {}).method, "u": uri})
        try:
            import psycopg

            async with await psycopg.AsyncConnection.connect(self._url, autocommit=True) as conn:
                await conn.execute("SELECT pg_notify(%s, %s)", (CHANNEL, body))
        except Exception as exc:  # noqa: BLE001 - the other replicas miss one level trigger, the call still succeeds
            logger.warning("could not announce %s to the other replicas (%s)", type(event).__name__, type(exc).__name__)

    @asynccontextmanager
    async def relaying(self) -> AsyncIterator[None]:
        """LISTEN for the other replicas' events for the served app's whole life."""
        ready = anyio.Event()
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._relay, ready)
            with anyio.move_on_after(10):
                await ready.wait()
            try:
                yield
            finally:
                tg.cancel_scope.cancel()

    async def _relay(self, ready: anyio.Event) -> None:
        import psycopg

        assert self._url is not None
        while True:
            try:
                async with await psycopg.AsyncConnection.connect(self._url, autocommit=True) as conn:
                    await conn.execute(f"LISTEN {CHANNEL}")
                    ready.set()
                    async for note in conn.notifies():
                        await self._deliver(note.payload)
            except Exception as exc:  # noqa: BLE001 - reconnect: a missed level trigger is only a missed refetch hint
                logger.warning("replica event relay lost PostgreSQL (%s); reconnecting", type(exc).__name__)
            await anyio.sleep(_RETRY_S)

    async def _deliver(self, payload: str) -> None:
        try:
            body: dict[str, Any] = json.loads(payload)
        except ValueError:
            return
        if body.get("o") == self._origin:
            return
        event = event_from_wire(str(body.get("m")), {"uri": body.get("u")})
        if event is not None:
            await self._local.publish(event)
