"""Broker transport: a kombu fanout exchange on the Celery broker (Redis, RabbitMQ), for a non-PostgreSQL store.

The writer publishes a transient hint after its write (~2.6 ms over Redis) through the app's producer
pool (no new connection per write); every web process consumes an exclusive, auto-deleted queue bound to
the exchange in a thread (kombu is synchronous), handing hints to the hub. Body: `{"k": row key, "v":
version}`, never a task id or a result.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import anyio
import anyio.to_thread
from kombu.connection import Connection  # not `from kombu import`: its lazy re-exports are invisible to mypy
from kombu.entity import Exchange, Queue
from kombu.exceptions import LimitExceeded, OperationalError
from kombu.messaging import Consumer

from celery_mcp_tasks.model import TaskRecord
from celery_mcp_tasks.notify.base import listeners_possible
from celery_mcp_tasks.notify.hub import Hub
from celery_mcp_tasks.outage_log import REMIND_S, OutageLog
from celery_mcp_tasks.preflight import short_reason

logger = logging.getLogger(__name__)

# A hint is worth one quick retry, not a stalled job: the seam swallows the failure.
_RETRY_POLICY = {"max_retries": 1, "interval_start": 0, "interval_step": 0.1, "interval_max": 0.1}
# A publish that failed only after this long met a broker that hangs (frozen, or cut off by a partition: each
# try waits out the socket timeout) rather than one that refuses at once (stopped, restarting) ...
_HUNG_S = 1.0
# ... and hints are then given up for three times as long as it waited (at least `_PAUSE_S`): the writer (a job
# reporting progress, a request) spends at most a quarter of its time waiting on a broker that hangs, not every
# write. A lost hint costs a listen stream latency, never a change (`notify.hub`).
_PAUSE_S = 10.0
_DRAIN_TIMEOUT_S = 0.5
_RETRY_MAX_S = 5.0


def hint_exchange(namespace: str) -> Exchange:
    """The fanout exchange, namespaced by the Celery queue so deployments sharing a broker stay apart."""
    return Exchange(
        f"celery_mcp_tasks.hints.{namespace}", type="fanout", durable=False, auto_delete=True, delivery_mode="transient"
    )


class BrokerPublisher:
    """A `Notifier`: one small transient message per change, through the producer pool."""

    def __init__(
        self,
        producer_pool: Callable[[], Any],
        exchange: Exchange,
        *,
        url: str = "",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._producer_pool = producer_pool
        self._exchange = exchange
        self._url = url  # for a log line: the broker URL, its password masked
        # The fixes said in this outage, and when: each once (again after REMIND_S), never a traceback per write.
        self._said: dict[str, float] = {}
        self._clock = clock
        self._paused_until = float("-inf")  # after a publish that hung: no hint is tried before then

    def task_changed(self, record: TaskRecord) -> None:
        if not listeners_possible(record):
            return
        started = self._clock()
        if started < self._paused_until:
            return
        try:
            with self._producer_pool().acquire(block=True, timeout=2) as producer:
                producer.publish(
                    {"k": record.key, "v": record.version},
                    exchange=self._exchange,
                    routing_key="",
                    serializer="json",
                    declare=[self._exchange],
                    delivery_mode="transient",
                    retry=True,
                    retry_policy=_RETRY_POLICY,
                )
        except OperationalError as exc:
            return self._unpublished(started, short_reason(exc), "start the broker or fix CELERY_BROKER_URL")
        except LimitExceeded:  # every pooled producer is busy (many threads writing at once): not a hang of its own
            return self._unpublished(None, "no pooled broker connection was free within 2 s", "raise broker_pool_limit")
        if self._said:
            self._said.clear()
            logger.info("task change hints reach the broker again")

    def _unpublished(self, started: float | None, reason: str, fix: str) -> None:
        now = self._clock()
        if started is not None and now - started >= _HUNG_S:
            self._paused_until = now + max(_PAUSE_S, 3 * (now - started))
        # Once per outage and cause (causes that alternate under load say each once), and again after REMIND_S:
        # a server whose writes are rare may see its next outage begin before any hint got through.
        if now - self._said.get(fix, float("-inf")) >= REMIND_S:
            self._said[fix] = now
            logger.warning(
                "cannot publish task change hints to the broker %s (%s); the changes are stored and "
                "listen streams catch up by polling: %s",
                self._url or "of the Celery app",
                reason,
                fix,
            )


class BrokerListener:
    """Consumes the fanout in a daemon thread; `run` lives as long as the web app."""

    def __init__(self, connection: Callable[[], Connection], exchange: Exchange, hub: Hub, *, url: str = "") -> None:
        self._connection = connection
        self._url = url  # for a log line: the broker URL, its password masked
        self._exchange = exchange
        self._hub = hub
        self._stop = threading.Event()
        self._connected = threading.Event()
        self.ready = anyio.Event()

    async def run(self) -> None:
        self._hub.bind()
        thread = threading.Thread(target=self._consume, name="mcp-tasks-hints", daemon=True)
        thread.start()
        try:
            while not self._connected.is_set():  # noqa: ASYNC110 - a threading.Event, set by the consumer thread
                await anyio.sleep(0.02)
            self.ready.set()
            await anyio.sleep_forever()
        finally:
            self._stop.set()
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(thread.join, _DRAIN_TIMEOUT_S * 4)

    def _consume(self) -> None:
        delay = 0.1
        connected_before = False
        outage = OutageLog(logger)  # the first failure of an outage is a warning with the fix; its retries debug
        while not self._stop.is_set():
            connection = self._connection()
            try:
                with connection as conn:
                    queue = Queue(
                        f"{self._exchange.name}.{uuid.uuid4().hex}",
                        exchange=self._exchange,
                        routing_key="",
                        exclusive=True,
                        auto_delete=True,
                        durable=False,
                    )
                    with Consumer(conn, queues=[queue], callbacks=[self._on_message], accept=["json"], no_ack=True):
                        if connected_before:
                            self._hub.from_thread(self._hub.resync)
                        outage.answered("task change listener reached the broker %s again", self._url or conn.as_uri())
                        connected_before = True
                        self._connected.set()
                        delay = 0.1
                        while not self._stop.is_set():
                            try:
                                conn.drain_events(timeout=_DRAIN_TIMEOUT_S)
                            except TimeoutError:
                                pass
                            conn.heartbeat_check()  # sends ours, raises when the broker's stopped (a no-op off AMQP)
            except Exception as exc:  # noqa: BLE001 - any broker failure: back off, reconnect, resync
                if self._stop.is_set():
                    return
                outage.failed(
                    "task change listener cannot reach the broker %s (%s); retrying every few seconds, and listen "
                    "streams catch up by polling meanwhile: start the broker or fix CELERY_BROKER_URL",
                    self._url or connection.as_uri(),
                    short_reason(exc),
                )
            self._stop.wait(delay)
            delay = min(delay * 2, _RETRY_MAX_S)

    def _on_message(self, body: Any, _message: Any) -> None:
        key, version = (body.get("k"), body.get("v")) if isinstance(body, dict) else (None, None)
        if isinstance(key, str) and len(key) == 64 and isinstance(version, int):
            self._hub.from_thread(self._hub.hint, key, version)
