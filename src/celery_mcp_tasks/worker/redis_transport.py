"""kombu's Redis transport, made to survive a broker outage while an `acks_late` job runs.

The failure (kombu 5.7.0 with Celery 5.7.0, reproduced against a real Redis
stopped mid-job): when the consumer loses the broker, Celery first calls
`connection.collect()`, which closes the channels and then clears the
transport's `client`; it then calls `connection.close()`. The consumer's
channel did not finish closing the first time (its pending BRPOP read raised
the connection error first), so the second close runs the QoS's
`restore_unacked`, which builds a new Redis client from `transport.client`,
now `None`: `AttributeError: 'NoneType' object has no attribute 'hostname'`.
That is not a connection error, so it escapes `ignore_errors` and Celery
ends the worker ("Unrecoverable error"). An idle worker has nothing unacked
to restore and survives, which is why only a busy one dies.

The fix here: a channel with no connection left raises the transport's own
connection error instead. Every caller in that path already tolerates a lost
broker, so the worker goes on to reconnect; the unacknowledged message stays
in Redis's unacked set and comes back after the visibility timeout (the job's
outcome is in the task store by then, and a late copy of a finished task's
job never runs its body).

`McpTasks` selects this transport for `redis://` and `rediss://` brokers
unless the application set `broker_transport` itself. It touches one private
kombu method, `Channel._connparams`; the contract test
(`tests/worker/test_redis_transport.py`) names the kombu version it was
written against and fails when that method moves.
"""

from __future__ import annotations

from typing import Any

from kombu.transport import redis as kombu_redis

__all__ = ["Channel", "Transport"]


class Channel(kombu_redis.Channel):
    def _connparams(self, asynchronous: bool = False) -> Any:
        connection = self.connection
        if connection is None or connection.client is None:
            # Imported here: kombu loads this module only for a redis:// broker (the `redis` extra).
            from redis.exceptions import ConnectionError as RedisConnectionError

            raise RedisConnectionError("the broker connection is already closed")
        return super()._connparams(asynchronous=asynchronous)  # type: ignore[no-untyped-call]  # unannotated in kombu


class Transport(kombu_redis.Transport):
    Channel = Channel
