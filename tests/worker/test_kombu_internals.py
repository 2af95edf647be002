"""Contract tests for every kombu internal this package uses (`celery_mcp_tasks.worker.kombu_internals`).

Each fails with the installed version in its message the day the internal moves.
"""

from __future__ import annotations

import importlib.metadata
import inspect
import logging
from typing import Any

import pytest

from celery_mcp_tasks.worker import kombu_internals

KOMBU = importlib.metadata.version("kombu")
WHERE = f"kombu {KOMBU}: an internal moved; update celery_mcp_tasks/worker/kombu_internals/"


def test_the_release_is_one_this_module_was_checked_against() -> None:
    assert KOMBU.rsplit(".", 1)[0] in kombu_internals.VERSIONS, WHERE


def test_the_mailbox_publishes_through_the_connections_ensure() -> None:
    """kombu's Mailbox publishes with `retry=True`, which the producer runs through `connection.ensure(...)`:
    the one call `bound_publish_retries` caps."""
    from kombu import Connection, Producer, pidbox

    assert "retry=True" in inspect.getsource(pidbox.Mailbox._publish), WHERE
    assert "self.connection.ensure(" in inspect.getsource(Producer.publish), WHERE
    conn = Connection("memory://")
    seen: list[dict[str, Any]] = []
    conn.ensure = lambda obj, fun, **policy: seen.append(policy) or fun  # type: ignore[method-assign]
    kombu_internals.bound_publish_retries(conn, {"max_retries": 2})
    conn.ensure(None, print, max_retries=None, interval_start=1)
    assert seen == [{"max_retries": 2, "interval_start": 1}], WHERE


def test_a_command_that_raises_is_logged_on_the_pidbox_logger_with_its_exception(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from kombu import pidbox

    node = pidbox.Mailbox("contract").Node("node", handlers={"kill_job": _not_implemented})
    with caplog.at_level(logging.ERROR, logger=kombu_internals.PIDBOX_LOGGER):
        node.dispatch("kill_job", arguments={})
    errors = [r for r in caplog.records if r.name == kombu_internals.PIDBOX_LOGGER]
    assert errors and errors[0].exc_info is not None, WHERE
    assert isinstance(errors[0].exc_info[1], NotImplementedError), WHERE


def test_rediss_gets_its_tls_default_only_while_the_scheme_names_the_transport() -> None:
    """Why `fixed_transport` leaves a `rediss://` URL without TLS options to kombu's own transport."""
    from ssl import CERT_NONE

    from kombu import Connection

    assert Connection("rediss://h:6380/0").ssl == {"ssl_cert_reqs": CERT_NONE}, WHERE
    assert not Connection("rediss://h:6380/0", transport=kombu_internals.REDIS_TRANSPORT).ssl, WHERE


def _not_implemented(state: Any, **_: Any) -> None:
    raise NotImplementedError("this pool does not implement kill_job")
