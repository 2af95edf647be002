"""Transport selection, and each cross-process transport against its real server."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import anyio.to_thread
import pytest
import sqlalchemy as sa

from celery_mcp_tasks.config import ConfigError, Settings
from celery_mcp_tasks.model import TaskRecord, TaskStatus
from celery_mcp_tasks.notify import postgres
from celery_mcp_tasks.notify.hub import Hub
from celery_mcp_tasks.notify.postgres import CHANNEL, PgListener, hint_payload, parse_hint
from celery_mcp_tasks.notify.push import select_mode
from celery_mcp_tasks.store.engine import create_store_engine, normalize_url
from tests.support import REDIS_URL

KEY = "a" * 64
PG = "postgresql://u@db/tasks"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _record(version: int = 1) -> TaskRecord:
    return TaskRecord(
        key=KEY,
        owner=None,
        tool="t",
        status=TaskStatus.WORKING,
        created_at=1,
        updated_at=1,
        ttl_ms=None,
        version=version,
    )


@pytest.mark.parametrize(
    ("database", "broker", "notify", "mode"),
    [
        (PG, "redis://r/0", "auto", "postgres"),
        (None, "redis://r/0", "auto", "broker"),
        (None, "amqp://guest@mq//", "auto", "broker"),
        (None, None, "auto", "poll"),  # the embedded default
        (None, "memory://", "auto", "poll"),
        (PG, "redis://r/0", "broker", "broker"),
        (PG, None, "poll", "poll"),
        (None, None, "off", "off"),
    ],
)
def test_the_transport_follows_the_deployment(database: str | None, broker: str | None, notify: str, mode: str) -> None:
    settings = Settings(database_url=database, notify=notify)  # no connection is made
    assert select_mode(settings, broker or settings.celery_broker_url) == mode


@pytest.mark.parametrize(("database", "broker", "notify"), [(None, None, "postgres"), (PG, None, "broker")])
def test_a_transport_that_cannot_work_here_is_a_start_up_error(
    database: str | None, broker: str | None, notify: str
) -> None:
    settings = Settings(database_url=database, notify=notify)
    with pytest.raises(ConfigError, match="MCP_TASKS_NOTIFY"):
        select_mode(settings, broker or settings.celery_broker_url)


def test_a_hint_is_the_row_key_and_version_only() -> None:
    assert parse_hint(f"{KEY}:12") == (KEY, 12)
    assert parse_hint("not-a-key:1") is None
    assert parse_hint(f"{KEY}:x") is None


@asynccontextmanager
async def _running(listener: Any) -> AsyncIterator[None]:
    async with anyio.create_task_group() as tg:
        tg.start_soon(listener.run)
        with anyio.fail_after(20):
            await listener.ready.wait()
        yield
        tg.cancel_scope.cancel()


@pytest.mark.anyio
@pytest.mark.postgres
async def test_postgres_delivers_a_hint_at_commit_and_never_for_a_rollback(postgres_url: str) -> None:
    hub = Hub()
    watch = hub.watch([KEY])
    engine = sa.create_engine(normalize_url(postgres_url))

    def write(version: int, commit: bool) -> None:
        with engine.connect() as conn:
            conn.execute(sa.select(sa.func.pg_notify(CHANNEL, hint_payload(_record(version)))))
            conn.commit() if commit else conn.rollback()

    try:
        async with _running(PgListener(postgres_url, hub)):
            assert await watch.next(0) == {KEY: None}  # listening began: every watch re-reads
            await anyio.to_thread.run_sync(write, 2, False)
            await anyio.to_thread.run_sync(write, 3, True)
            with anyio.fail_after(20):
                assert await watch.next(20) == {KEY: 3}
    finally:
        engine.dispose()


@pytest.mark.anyio
@pytest.mark.postgres
async def test_postgres_is_listened_to_only_while_a_watch_follows_a_row(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each hint a listening connection receives costs the database and the web process a wake-up; with
    nothing following a task none is of use. A change made while nobody listened is not lost: the
    watch that starts the listening is asked to re-read."""
    monkeypatch.setattr(postgres, "_IDLE_S", 0.05)  # how often the listener checks: drive it fast
    hub = Hub()
    listener = PgListener(postgres_url, hub)
    engine = sa.create_engine(normalize_url(postgres_url))

    def write(version: int) -> None:
        with engine.begin() as conn:
            conn.execute(sa.select(sa.func.pg_notify(CHANNEL, hint_payload(_record(version)))))

    async def until(condition: Any) -> None:
        with anyio.fail_after(20):
            while not condition():
                await anyio.sleep(0.01)

    try:
        async with _running(listener):
            assert not listener.listening  # connected, and nothing follows a task
            await anyio.to_thread.run_sync(write, 2)  # heard by no one
            for version in (3, 4):  # listening starts with the first watch, again after it stopped
                watch = hub.watch([KEY])
                with anyio.fail_after(20):
                    assert await watch.next(20) == {KEY: None}  # the re-read that covers what went unheard
                assert listener.listening
                await anyio.to_thread.run_sync(write, version)
                with anyio.fail_after(20):
                    assert await watch.next(20) == {KEY: version}
                watch.close()
                await until(lambda: not listener.listening)  # idle: UNLISTEN
    finally:
        engine.dispose()


@pytest.mark.anyio
@pytest.mark.postgres
async def test_the_listener_and_the_store_name_their_connections_unless_the_url_does(postgres_url: str) -> None:
    """An operator finds them in `pg_stat_activity` by name (the listener's is idle between its LISTENs)."""
    hub = Hub()
    store = create_store_engine(postgres_url)
    joined = "&" if "?" in postgres_url else "?"
    own = create_store_engine(f"{postgres_url}{joined}application_name=billing")
    by_options = create_store_engine(f"{postgres_url}{joined}options=-c%20application_name%3Dledger")
    by_fallback = create_store_engine(f"{postgres_url}{joined}fallback_application_name=reports")

    def names() -> list[str]:
        query = "SELECT application_name FROM pg_stat_activity WHERE pid <> pg_backend_pid()"
        setting = sa.text("SELECT current_setting('application_name')")
        with (
            store.connect() as conn,
            own.connect() as mine,
            by_options.connect() as theirs,
            by_fallback.connect() as fb,
        ):
            assert conn.scalar(setting) == "celery-mcp-tasks"
            assert (mine.scalar(setting), theirs.scalar(setting), fb.scalar(setting)) == (
                "billing",
                "ledger",
                "reports",
            )
            return list(conn.scalars(sa.text(query)))

    try:
        async with _running(PgListener(postgres_url, hub)):
            assert "celery-mcp-tasks listener" in await anyio.to_thread.run_sync(names)
    finally:
        for engine in (store, own, by_options, by_fallback):
            engine.dispose()


@pytest.mark.anyio
@pytest.mark.redis
async def test_the_broker_fanout_reaches_every_listener() -> None:
    if not REDIS_URL:
        pytest.skip("set MCP_TASKS_TEST_REDIS_URL to run")
    from kombu import Connection
    from kombu.pools import producers

    from celery_mcp_tasks.notify.broker import BrokerListener, BrokerPublisher, hint_exchange

    exchange = hint_exchange("test-transports")
    hubs = [Hub(), Hub()]
    watches = [hub.watch([KEY]) for hub in hubs]
    publish_conn = Connection(REDIS_URL)
    publisher = BrokerPublisher(lambda: producers[publish_conn], exchange)
    try:
        async with (
            _running(BrokerListener(lambda: Connection(REDIS_URL), exchange, hubs[0])),
            _running(BrokerListener(lambda: Connection(REDIS_URL), exchange, hubs[1])),
        ):
            await anyio.to_thread.run_sync(publisher.task_changed, _record(4))
            for watch in watches:
                with anyio.fail_after(20):
                    assert await watch.next(20) == {KEY: 4}
    finally:
        publish_conn.release()


@pytest.mark.anyio
@pytest.mark.postgres
async def test_a_postgres_outage_is_one_warning_and_its_end_one_line(
    postgres_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The listener retries with backoff through an outage: a warning at each try was 8-10 lines for 20 s, and
    nothing said when it was over."""
    name = sa.engine.make_url(postgres_url).database
    admin = sa.create_engine(
        sa.engine.make_url(normalize_url(postgres_url)).set(database="postgres"), isolation_level="AUTOCOMMIT"
    )

    def connections(allowed: bool) -> None:
        with admin.connect() as conn:
            conn.execute(sa.text(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS {str(allowed).lower()}'))
            if not allowed:
                conn.execute(
                    sa.text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = :name"),
                    {"name": name},
                )

    async def until(condition: Any) -> None:
        with anyio.fail_after(20):
            while not condition():
                await anyio.sleep(0.01)

    def said(level: int) -> list[str]:
        return [r.getMessage() for r in caplog.records if r.name == postgres.__name__ and r.levelno == level]

    caplog.set_level(logging.DEBUG, logger=postgres.__name__)
    hub = Hub()
    watch = hub.watch([KEY])  # listening: an idle listener reads nothing, so it notices no outage
    listener = PgListener(postgres_url, hub)
    try:
        async with _running(listener):
            await until(lambda: listener.listening)
            await anyio.to_thread.run_sync(connections, False)
            await until(lambda: len(said(logging.DEBUG)) >= 3)  # the listener tried again and again
            await anyio.to_thread.run_sync(connections, True)
            await until(lambda: said(logging.INFO))
    finally:
        watch.close()
        await anyio.to_thread.run_sync(connections, True)
        admin.dispose()
    [warned] = said(logging.WARNING)
    assert warned.startswith("task change listener lost PostgreSQL (")
    assert said(logging.INFO) == ["task change listener reached PostgreSQL again"]


@pytest.mark.anyio
async def test_a_store_the_poller_cannot_read_is_one_warning_and_its_end_one_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The embedded default polls every 100 ms: an outage (a locked file) was ten warnings a second."""
    from celery_mcp_tasks.notify.polling import RowPoller

    failures = [OSError("unreadable")] * 5

    def versions(keys: Any) -> dict[str, int]:
        if failures:
            raise failures.pop()
        return dict.fromkeys(keys, 1)

    hub = Hub()
    watch = hub.watch([KEY])
    poller = RowPoller(versions, hub)
    with caplog.at_level(logging.DEBUG, logger="celery_mcp_tasks.notify.polling"):
        for _ in range(6):
            await poller.poll_once()
    watch.close()
    levels = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "celery_mcp_tasks.notify.polling"]
    assert levels == [
        (logging.WARNING, "task change poll failed (OSError); retrying"),
        *[(logging.DEBUG, "task change poll failed (OSError); retrying")] * 4,
        (logging.INFO, "task change poll reads the store again"),
    ]
