"""A PostgreSQL store on a database that accepts connections and never answers (a hung server, a firewall
dropping replies): its operations fail in seconds, as `StoreUnavailable`, instead of holding their caller.

No PostgreSQL needed: the "database" is a socket whose kernel completes the handshake and nobody answers.
"""

from __future__ import annotations

import socket
import threading

import pytest

import celery_mcp_tasks.store.engine as engine_module
from celery_mcp_tasks.store import ANY
from celery_mcp_tasks.store.base import StoreUnavailable
from celery_mcp_tasks.store.engine import libpq_deadlines
from celery_mcp_tasks.store.sql import SqlStore
from tests.conftest import needs_postgres
from tests.support import POSTGRES_URL


@needs_postgres
def test_each_store_connection_carries_libpqs_deadlines() -> None:
    assert POSTGRES_URL
    store = SqlStore.from_url(POSTGRES_URL)
    try:
        with store.engine.connect() as conn:
            given = conn.connection.driver_connection.info.get_parameters()  # type: ignore[union-attr]
        assert {name: given.get(name) for name in libpq_deadlines()} == {
            name: str(value) for name, value in libpq_deadlines().items()
        }
        assert libpq_deadlines()["connect_timeout"] == engine_module.SOCKET_TIMEOUT_S == 10
    finally:
        store.dispose()


def test_a_read_on_a_database_that_never_answers_fails_in_seconds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(engine_module, "SOCKET_TIMEOUT_S", 1)  # the shipped 10 s, made short for the test
    with socket.socket() as black_hole:
        black_hole.bind(("127.0.0.1", 0))
        black_hole.listen(8)
        store = SqlStore.from_url(f"postgresql://mcp@127.0.0.1:{black_hole.getsockname()[1]}/tasks")
        outcome: list[BaseException | None] = []

        def read() -> None:
            try:
                store.get("k", ANY)
                outcome.append(None)
            except BaseException as exc:  # noqa: BLE001 - judged below
                outcome.append(exc)

        thread = threading.Thread(target=read, daemon=True)
        thread.start()
        thread.join(timeout=30)
        store.dispose()
    assert outcome, "the read is still waiting for the database"
    assert isinstance(outcome[0], StoreUnavailable)
