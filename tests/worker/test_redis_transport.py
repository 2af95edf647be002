"""The one private kombu method the Redis transport fix touches, pinned to the kombu it was written for."""

from __future__ import annotations

from types import SimpleNamespace

import kombu
import pytest
from kombu.transport import TRANSPORT_ALIASES
from kombu.transport import redis as kombu_redis
from redis.exceptions import ConnectionError as RedisConnectionError

from celery_mcp_tasks.app import REDIS_TRANSPORT, use_redis_transport_fix
from celery_mcp_tasks.worker.redis_transport import Channel, Transport


def test_the_fix_is_written_against_this_kombu() -> None:
    assert kombu.__version__.startswith("5.7."), (
        f"kombu {kombu.__version__}: the Redis outage fix was written against kombu 5.7.0; re-run "
        "tests/worker/test_broker_outage.py and re-read kombu.transport.redis.Channel.close before moving on"
    )
    assert callable(getattr(kombu_redis.Channel, "_connparams", None)), "kombu moved Channel._connparams"
    assert Transport.Channel is Channel and issubclass(Transport, kombu_redis.Transport)


def test_a_channel_whose_connection_is_gone_raises_a_connection_error() -> None:
    channel = object.__new__(Channel)
    channel.connection = SimpleNamespace(client=None)
    with pytest.raises(RedisConnectionError):
        channel._connparams()
    assert RedisConnectionError in kombu_redis.Transport.connection_errors  # what kombu's callers tolerate


def test_redis_urls_resolve_to_the_fixed_transport_and_others_are_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(TRANSPORT_ALIASES, "redis", "kombu.transport.redis:Transport")
    monkeypatch.setitem(TRANSPORT_ALIASES, "rediss", "someone.elses:Transport")
    use_redis_transport_fix()
    assert TRANSPORT_ALIASES["redis"] == REDIS_TRANSPORT
    assert TRANSPORT_ALIASES["rediss"] == "someone.elses:Transport"
