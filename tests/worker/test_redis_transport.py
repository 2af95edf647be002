"""The one private kombu method the Redis transport fix touches, pinned to the kombu it was written for."""

from __future__ import annotations

from types import SimpleNamespace

import kombu
import pytest
from celery import Celery
from kombu.transport import TRANSPORT_ALIASES
from kombu.transport import redis as kombu_redis
from redis.exceptions import ConnectionError as RedisConnectionError

from celery_mcp_tasks.app import configure_celery
from celery_mcp_tasks.config import Settings
from celery_mcp_tasks.worker import kombu_internals
from celery_mcp_tasks.worker.kombu_internals import REDIS_TRANSPORT, SENTINEL_TRANSPORT
from celery_mcp_tasks.worker.kombu_internals.redis_transport import (
    Channel,
    SentinelChannel,
    SentinelTransport,
    Transport,
)


def test_the_fix_is_written_against_this_kombu() -> None:
    assert kombu.__version__.rsplit(".", 1)[0] in kombu_internals.VERSIONS, (
        f"kombu {kombu.__version__}: the Redis outage fix was written against kombu 5.7.0; re-run "
        "tests/worker/test_broker_outage.py and re-read kombu.transport.redis.Channel.close before moving on"
    )
    assert callable(getattr(kombu_redis.Channel, "_connparams", None)), "kombu moved Channel._connparams"
    assert Transport.Channel is Channel and issubclass(Transport, kombu_redis.Transport)
    assert SentinelTransport.Channel is SentinelChannel and issubclass(SentinelTransport, kombu_redis.SentinelTransport)
    assert issubclass(kombu_redis.SentinelChannel, kombu_redis.Channel), "the Sentinel channel left the Redis one"


@pytest.mark.parametrize("fixed", [Channel, SentinelChannel])
def test_a_channel_whose_connection_is_gone_raises_a_connection_error(fixed: type) -> None:
    channel = object.__new__(fixed)
    channel.connection = SimpleNamespace(client=None)
    with pytest.raises(RedisConnectionError):
        channel._connparams()
    assert RedisConnectionError in kombu_redis.Transport.connection_errors  # what kombu's callers tolerate


def _configured(broker: str, **conf: object) -> Celery:
    app = Celery("transport-choice", set_as_current=False)
    app.conf.update(conf)
    configure_celery(app, Settings(broker_url=broker))
    return app


@pytest.mark.parametrize("url", ["redis://127.0.0.1:6379/0", "rediss://h:6380/0?ssl_cert_reqs=required"])
def test_this_apps_redis_connections_use_the_fixed_transport_and_kombus_table_is_untouched(url: str) -> None:
    aliases = dict(TRANSPORT_ALIASES)
    app = _configured(url)
    assert app.conf.broker_transport == REDIS_TRANSPORT
    with app.connection_for_write() as conn:
        assert conn.transport_cls == REDIS_TRANSPORT and conn.hostname in ("127.0.0.1", "h")
    assert aliases == TRANSPORT_ALIASES
    assert Celery("another", broker=url, set_as_current=False).connection_for_write().transport_cls != REDIS_TRANSPORT


def test_a_sentinel_broker_uses_the_fixed_sentinel_transport() -> None:
    app = _configured(
        "sentinel://127.0.0.1:26379/0;sentinel://127.0.0.1:26380/0", broker_transport_options={"master_name": "m"}
    )
    assert app.conf.broker_transport == SENTINEL_TRANSPORT
    with app.connection_for_write() as conn:
        assert conn.transport_cls == SENTINEL_TRANSPORT and conn.transport.Channel is SentinelChannel


def test_a_transport_the_application_chose_and_an_unconfigured_rediss_are_left_to_kombu() -> None:
    assert _configured("redis://h/0", broker_transport="someone.elses:Transport").conf.broker_transport == (
        "someone.elses:Transport"
    )
    rediss = _configured("rediss://h:6380/0")  # kombu's TLS default holds only for the scheme's own transport
    assert rediss.conf.broker_transport is None
    assert _configured("rediss://h:6380/0", broker_use_ssl={"ssl_cert_reqs": 0}).conf.broker_transport == (
        REDIS_TRANSPORT
    )
