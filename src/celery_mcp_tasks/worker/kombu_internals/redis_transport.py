"""kombu's Redis transport, made to survive a broker outage while an `acks_late` job runs.

kombu 5.7.0 with Celery 5.7.0, against a Redis stopped mid-job: the consumer's `connection.collect()`
clears the transport's `client` before its channel finished closing, so the later `connection.close()`
restores the unacked message through a client built from `None`; the `AttributeError` is not a connection
error, escapes `ignore_errors`, and the worker ends (an idle worker has nothing unacked and survives).
Here a channel with no connection left raises the connection error instead: every caller on that path
tolerates a lost broker, the worker reconnects, and the message returns after the visibility timeout.
`McpTasks` selects it for `redis://` and `rediss://` (`Transport`) and `sentinel://` (`SentinelTransport`, whose
channel builds its connections through the same method) unless the application set `broker_transport`;
tests/worker/test_redis_transport.py names the kombu version of the private `Channel._connparams`.
"""

from __future__ import annotations

from typing import Any

from kombu.transport import redis as kombu_redis


def _still_connected(channel: Any) -> None:
    """The connection error kombu's callers tolerate, for a channel whose connection is gone."""
    connection = channel.connection
    if connection is None or connection.client is None:
        # Imported here: kombu loads this module only for a Redis broker (the `redis` extra).
        from redis.exceptions import ConnectionError as RedisConnectionError

        raise RedisConnectionError("the broker connection is already closed")


class Channel(kombu_redis.Channel):
    def _connparams(self, asynchronous: bool = False) -> Any:
        _still_connected(self)
        return super()._connparams(asynchronous=asynchronous)  # type: ignore[no-untyped-call]  # unannotated in kombu


class Transport(kombu_redis.Transport):
    Channel = Channel


class SentinelChannel(kombu_redis.SentinelChannel):
    def _connparams(self, asynchronous: bool = False) -> Any:
        _still_connected(self)
        return super()._connparams(asynchronous=asynchronous)  # type: ignore[no-untyped-call]


class SentinelTransport(kombu_redis.SentinelTransport):
    Channel = SentinelChannel
