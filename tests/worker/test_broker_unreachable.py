"""A broker that is down is named in the log, password masked, with what to do; once per outage, no traceback.

Three places meet it in a web process: the send of a new task's job (each send fails its task,
readable), the publisher of change hints, and the hint listener (retried in the background).
Nothing listens on the port these use, so each fails at once with "Connection refused".
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from urllib.parse import urlsplit

import pytest
from celery import Celery
from kombu.connection import Connection
from kombu.exceptions import LimitExceeded, OperationalError
from kombu.pools import ProducerPool

from celery_mcp_tasks import McpTasks
from celery_mcp_tasks import app as app_module
from celery_mcp_tasks.app import internals
from celery_mcp_tasks.config import Settings
from celery_mcp_tasks.migrate import upgrade
from celery_mcp_tasks.model import TaskRecord
from celery_mcp_tasks.notify.broker import BrokerListener, BrokerPublisher, hint_exchange
from celery_mcp_tasks.notify.hub import Hub
from celery_mcp_tasks.outage_log import REMIND_S
from celery_mcp_tasks.service import ENQUEUE_FAILED, DispatchUnavailable
from celery_mcp_tasks.worker.dispatch import CeleryDispatcher
from tests.builders import record
from tests.support import free_port, silent_server

SECRET = "s3cr3t-pw"


@pytest.fixture
def down(tmp_path: Path) -> Celery:
    """The Celery app as `McpTasks` configures it (its Redis transport gives up on a refused connection)."""
    broker = f"redis://:{SECRET}@127.0.0.1:{free_port()}/0"
    settings = Settings(database_url=f"sqlite:///{tmp_path / 'tasks.db'}", broker_url=broker)
    app = McpTasks("unreachable", settings=settings, notifier=None).celery
    # kombu's own reconnect loop under each attempt, made short: what is tested is what we log after it.
    app.conf.broker_transport_options = {"max_retries": 1, "interval_start": 0, "interval_step": 0.1}
    return app


def said(caplog: pytest.LogCaptureFixture, level: int) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == level and r.name.startswith("celery_mcp_tasks")]


def test_a_send_to_a_broker_that_is_down_names_it_and_what_to_do(
    down: Celery, caplog: pytest.LogCaptureFixture
) -> None:
    tools = {"report": SimpleNamespace(name="report", celery_name="jobs.report", terminate=False)}
    with caplog.at_level(logging.ERROR, logger="celery_mcp_tasks"), pytest.raises(DispatchUnavailable) as raised:
        CeleryDispatcher(down, tools).send(record(key="ab" * 32, tool="report", dispatches=1))  # type: ignore[arg-type]
    assert isinstance(raised.value.__cause__, OperationalError) and str(raised.value) == "OperationalError"
    (line,) = said(caplog, logging.ERROR)
    assert line.startswith("cannot reach the broker redis://:***@127.0.0.1:") and "Connection refused" in line
    assert line.endswith("start the broker or fix CELERY_BROKER_URL") and SECRET not in line
    assert "ab" * 32 not in line and not any(r.exc_info for r in caplog.records)


@pytest.mark.parametrize("refusal", ["vhost", "password"])
def test_a_rabbitmq_refusing_the_vhost_or_the_login_is_said_as_an_outage_naming_the_setting(
    refusal: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """RabbitMQ refuses a vhost that does not exist (NotAllowed) or a wrong password (AccessRefused) without
    kombu's retry: each call's send logged an ERROR naming neither the broker nor the setting."""
    url = os.environ.get("MCP_TASKS_TEST_RABBITMQ_URL")
    if not url:
        pytest.skip("set MCP_TASKS_TEST_RABBITMQ_URL to run")
    parts = urlsplit(url)
    host = f"{parts.hostname}:{parts.port or 5672}"
    broker = {
        "vhost": f"amqp://{parts.username}:{parts.password}@{host}/mcp-tasks-no-such-vhost",
        "password": f"amqp://{parts.username}:{SECRET}@{host}//",
    }[refusal]
    settings = Settings(database_url=f"sqlite:///{tmp_path / 'tasks.db'}", broker_url=broker)
    app = McpTasks("refused", settings=settings, notifier=None).celery
    tools = {"report": SimpleNamespace(name="report", celery_name="jobs.report", terminate=False)}
    dispatcher = CeleryDispatcher(app, tools)  # type: ignore[arg-type]
    with caplog.at_level(logging.DEBUG, logger="celery_mcp_tasks"):
        for _ in range(2):
            with pytest.raises(DispatchUnavailable):
                dispatcher.send(record(key="ab" * 32, tool="report", dispatches=1))
    (line,) = said(caplog, logging.ERROR)
    assert line.startswith(f"cannot reach the broker amqp://{parts.username}:***@{host}/"), line
    assert line.endswith("start the broker or fix CELERY_BROKER_URL") and SECRET not in line
    assert ("NOT_ALLOWED" if refusal == "vhost" else "ACCESS_REFUSED") in line


def test_the_first_send_after_an_outage_says_the_broker_takes_jobs_again(
    down: Celery, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    tools = {"report": SimpleNamespace(name="report", celery_name="jobs.report", terminate=False)}
    dispatcher = CeleryDispatcher(down, tools)  # type: ignore[arg-type]
    job = record(key="ab" * 32, tool="report", dispatches=1)
    with caplog.at_level(logging.INFO, logger="celery_mcp_tasks"):
        with pytest.raises(DispatchUnavailable):
            dispatcher.send(job)
        monkeypatch.setattr(down, "send_task", lambda *_, **__: None)  # the broker is back
        dispatcher.send(job)
        dispatcher.send(job)
    assert [r for r in said(caplog, logging.INFO) if "takes jobs" in r] == [
        "the broker redis://:***@127.0.0.1:" + down.conf.broker_url.rsplit(":", 1)[1] + " takes jobs again"
    ]


def test_calls_while_the_broker_is_down_each_fail_readable_and_the_log_says_it_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Two ERROR lines a call (the dispatcher's and the service's) grew with the call rate in an outage."""
    broker = f"redis://:{SECRET}@127.0.0.1:{free_port()}/0"
    settings = Settings(database_url=f"sqlite:///{tmp_path / 'tasks.db'}", broker_url=broker)
    tasks = McpTasks("down-calls", settings=settings, notifier=None)
    tasks.celery.conf.broker_transport_options = {"max_retries": 1, "interval_start": 0, "interval_step": 0.1}

    @tasks.mcp_task(shared=False)
    def report() -> str:
        return "ok"

    upgrade(settings.store_url)
    service = internals(tasks).service()
    with caplog.at_level(logging.DEBUG, logger="celery_mcp_tasks"):
        created = [service.create(owner=None, tool="report", arguments={})[1] for _ in range(3)]
    assert [(r.status, r.error) for r in created] == [
        ("failed", {"message": ENQUEUE_FAILED, "data": "OperationalError"})
    ] * 3
    (line,) = said(caplog, logging.ERROR)
    assert line.startswith("cannot reach the broker redis://:***@127.0.0.1:")
    assert [r for r in said(caplog, logging.DEBUG) if r.startswith("cannot reach the broker")] == [line] * 2


def test_the_hint_publisher_says_so_once_per_outage(down: Celery, caplog: pytest.LogCaptureFixture) -> None:
    publisher = BrokerPublisher(lambda: down.producer_pool, hint_exchange("t"), url="redis://:***@down:1/0")
    with caplog.at_level(logging.WARNING, logger="celery_mcp_tasks"):
        for version in (2, 3):
            publisher.task_changed(record(key="cd" * 32, version=version))  # never raises: the write is stored
    (line,) = said(caplog, logging.WARNING)
    assert line.startswith("cannot publish task change hints to the broker redis://:***@down:1/0 (")
    assert "CELERY_BROKER_URL" in line and not any(r.exc_info for r in caplog.records)


def test_a_hint_with_every_pooled_producer_busy_is_one_warning_naming_the_pool_limit(
    down: Celery, caplog: pytest.LogCaptureFixture
) -> None:
    """Many threads writing at once can hold every producer of Celery's pool: the write is stored, its hint
    is given up after 2 s, said once, never a traceback per write out of the notifier seam."""
    pool = ProducerPool(Connection(down.conf.broker_url).Pool(limit=1), limit=1)  # broker_pool_limit=1
    publisher = BrokerPublisher(lambda: pool, hint_exchange("t"), url="redis://:***@down:1/0")
    with pool.acquire(block=True), caplog.at_level(logging.WARNING, logger="celery_mcp_tasks"):
        for version in (2, 3):
            publisher.task_changed(record(key="ef" * 32, version=version))
    (line,) = said(caplog, logging.WARNING)
    assert "no pooled broker connection was free" in line and line.endswith("raise broker_pool_limit")
    assert "ef" * 32 not in line and not any(r.exc_info for r in caplog.records)


def test_a_hint_failure_of_another_cause_is_said_again_with_its_own_fix(caplog: pytest.LogCaptureFixture) -> None:
    class Pool:
        def __init__(self) -> None:
            # Under load in an outage the causes alternate: each is said once, not once a write.
            self.failures: list[Exception] = [LimitExceeded(1), OperationalError("refused")] * 3

        def acquire(self, **_: object) -> object:
            raise self.failures.pop(0)

    pool = Pool()
    publisher = BrokerPublisher(lambda: pool, hint_exchange("t"), url="redis://:***@down:1/0")
    with caplog.at_level(logging.WARNING, logger="celery_mcp_tasks"):
        for version in range(2, 8):
            publisher.task_changed(record(key="ab" * 32, version=version))
    first, second = said(caplog, logging.WARNING)
    assert first.endswith("raise broker_pool_limit") and second.endswith("start the broker or fix CELERY_BROKER_URL")


def test_a_quiet_servers_next_outage_is_said_again_though_no_hint_got_through_between(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Writes are rare: the broker came back and went away again between two of them, and no hint got
    through to clear the outage. Five minutes on, the warning is said again, not at DEBUG only."""
    now = [100.0]

    class Pool:
        def acquire(self, **_: object) -> object:
            raise OperationalError("refused")

    publisher = BrokerPublisher(lambda: Pool(), hint_exchange("t"), clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, logger="celery_mcp_tasks"):
        publisher.task_changed(record(key="ab" * 32, version=2))
        now[0] += REMIND_S - 1
        publisher.task_changed(record(key="ab" * 32, version=3))
        assert len(said(caplog, logging.WARNING)) == 1
        now[0] += 1
        publisher.task_changed(record(key="ab" * 32, version=4))
    lines = said(caplog, logging.WARNING)
    assert len(lines) == 2 and all(line.startswith("cannot publish task change hints") for line in lines)


def test_a_broker_that_hangs_costs_a_writer_one_wait_a_pause_not_one_a_write() -> None:
    """A frozen or cut-off broker: each publish waits out the socket timeout (a job's progress stalled 6-15 s
    a report in an audit). After a publish that hung, hints are given up for three times the wait; a broker
    that refuses at once (stopped, restarting) costs nothing and is tried at every write."""
    now = [100.0]

    class Pool:
        def __init__(self) -> None:
            self.tries: list[float] = []
            self.hangs = True
            self.busy = False

        def acquire(self, **_: object) -> object:
            self.tries.append(now[0])
            if self.busy:
                now[0] += 2.0  # `acquire(block=True, timeout=2)` with every producer in use
                raise LimitExceeded(1)
            if self.hangs:
                now[0] += 5.0  # the socket timeout, waited out
            raise OperationalError("timed out" if self.hangs else "refused")

    pool = Pool()
    publisher = BrokerPublisher(lambda: pool, hint_exchange("t"), clock=lambda: now[0])
    for version in range(2, 6):
        publisher.task_changed(record(key="ab" * 32, version=version))
    assert pool.tries == [100.0]  # one wait; the writes after it do not try within the pause
    now[0] += 3 * 5.0 - 0.1  # the pause is three times the wait
    publisher.task_changed(record(key="ab" * 32, version=6))
    assert len(pool.tries) == 1
    now[0] += 0.2
    publisher.task_changed(record(key="ab" * 32, version=7))
    assert len(pool.tries) == 2  # tried again after the pause (and it hung again)
    now[0] += 15.1
    pool.hangs = False
    for version in range(8, 11):
        publisher.task_changed(record(key="ab" * 32, version=version))
    assert len(pool.tries) == 5  # refused at once: every write tries (the broker may be back at the next)
    pool.busy = True
    for version in range(11, 13):
        publisher.task_changed(record(key="ab" * 32, version=version))
    assert len(pool.tries) == 7  # a full pool waits 2 s for a producer: a busy broker, not a hanging one


def test_the_hint_listener_warns_once_then_retries_quietly(down: Celery, caplog: pytest.LogCaptureFixture) -> None:
    listener = BrokerListener(down.connection_for_read, hint_exchange("t"), Hub(), url="redis://:***@down:1/0")
    with caplog.at_level(logging.DEBUG, logger="celery_mcp_tasks"):
        thread = threading.Thread(target=listener._consume, daemon=True)
        thread.start()
        time.sleep(2.0)  # several attempts (ours back off 0.1 s, 0.2 s, 0.4 s, ...)
        listener._stop.set()
        thread.join(10)
    warnings, retries = said(caplog, logging.WARNING), said(caplog, logging.DEBUG)
    assert len(warnings) == 1 and warnings[0].startswith("task change listener cannot reach the broker redis://:***@")
    assert "start the broker or fix CELERY_BROKER_URL" in warnings[0]
    assert len(retries) >= 1 and all(r == warnings[0] for r in retries)


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A broker gone silent (a failover, a partition): it accepts connections and never answers."""
    with silent_server() as port:
        yield port


def test_a_send_to_a_redis_broker_that_stops_answering_fails_its_task_in_seconds(
    tmp_path: Path, silent_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """kombu waits forever for a silent Redis by default: the creation held its request (and one of the web
    process's threads) for as long as the connection lasted, the task `working` and never sent."""
    monkeypatch.setattr(app_module, "REDIS_SOCKET_TIMEOUT_S", 0.5)  # the shipped 5 s, made short for the test
    settings = Settings(
        database_url=f"sqlite:///{tmp_path / 'tasks.db'}", broker_url=f"redis://127.0.0.1:{silent_port}/0"
    )
    tasks = McpTasks("silent", settings=settings, notifier=None)

    @tasks.mcp_task(shared=False)
    def report() -> str:
        return "ok"

    upgrade(settings.store_url)
    created: list[TaskRecord] = []
    thread = threading.Thread(
        target=lambda: created.append(internals(tasks).service().create(owner=None, tool="report", arguments={})[1]),
        daemon=True,
    )
    thread.start()
    thread.join(timeout=60)
    assert created, "the creation is still waiting for the broker"
    assert (created[0].status, created[0].status_message) == ("failed", ENQUEUE_FAILED)


@pytest.mark.parametrize("url", ["redis://127.0.0.1:6379/0", "sentinel://127.0.0.1:26379/0"])
def test_a_redis_brokers_socket_timeouts_are_defaults_the_application_may_set(url: str) -> None:
    """Sentinel too: a primary frozen mid-failover held sends and consumers for as long as it stayed frozen."""
    settings = Settings(broker_url=url)
    options = McpTasks("defaults", settings=settings, notifier=None).celery.conf.broker_transport_options
    assert (options["socket_timeout"], options["socket_connect_timeout"]) == (5.0, 5.0)
    own = Celery("own")
    own.conf.broker_transport_options = {"socket_timeout": 30}
    options = McpTasks("own", celery=own, settings=settings, notifier=None).celery.conf.broker_transport_options
    assert (options["socket_timeout"], options["socket_connect_timeout"]) == (30, 5.0)


def test_the_broker_url_is_checked_at_construction_without_importing_its_transport(tmp_path: Path) -> None:
    """kombu's table and URL parser decide, connecting to nothing: a failover list passes; an unknown scheme is
    refused with kombu's nearest name; a URL kombu cannot read is refused without quoting it."""
    store = f"sqlite:///{tmp_path / 'tasks.db'}"
    failover = Celery("failover")
    failover.conf.broker_url = ["amqp://guest@127.0.0.1:1//", "amqp://guest@127.0.0.1:2//"]
    McpTasks("failover", celery=failover, settings=Settings(database_url=store), notifier=None)
    McpTasks("list", settings=Settings(database_url=store, broker_url="redis://a:1/0;redis://b:1/0"), notifier=None)
    with pytest.raises(SystemExit) as unknown:
        McpTasks("typo", settings=Settings(database_url=store, broker_url="amqpp://h:5672//"), notifier=None)
    assert "CELERY_BROKER_URL: kombu has no transport named 'amqpp'; did you mean amqp" in str(unknown.value)
    with pytest.raises(SystemExit) as unreadable:
        McpTasks(
            "bad", settings=Settings(database_url=store, broker_url=f"amqp://u:{SECRET}/x@h:5672//"), notifier=None
        )
    assert "CELERY_BROKER_URL: not a URL kombu can read" in str(unreadable.value) and SECRET not in str(
        unreadable.value
    )


def test_only_what_no_wait_mends_stops_a_worker_at_start() -> None:
    """RabbitMQ also answers NOT_ALLOWED for a vhost that is down or full, and ACCESS_REFUSED for a resource a
    channel may not use: a worker waits those out, as Celery does."""
    from amqp.exceptions import AccessRefused, NotAllowed

    from celery_mcp_tasks.worker.startup import _for_good

    assert _for_good(NotAllowed("Connection.open: (530) NOT_ALLOWED - vhost aud1 not found"))
    assert _for_good(NotAllowed("(530) NOT_ALLOWED - access to vhost 'v' refused for user 'u'"))
    assert _for_good(AccessRefused("(403) ACCESS_REFUSED - Login was refused using authentication mechanism PLAIN"))
    assert not _for_good(NotAllowed("(530) NOT_ALLOWED - vhost v is down"))
    assert not _for_good(NotAllowed("(530) NOT_ALLOWED - connection refused: virtual host 'v' connection limit"))
    assert not _for_good(AccessRefused("(403) ACCESS_REFUSED - access to queue 'q' in vhost '/' refused"))
    assert not _for_good(ConnectionRefusedError(111, "Connection refused"))


def test_the_start_probe_of_a_redis_that_never_answers_gives_up_in_its_own_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A server that accepts and never answers, and an app that set Redis's socket timeouts to None (wait for
    ever): the probe still gives up after its own timeout, and leaves the waiting to Celery."""
    import socket

    from celery_mcp_tasks.worker import startup

    monkeypatch.setattr(startup, "_PROBE_TIMEOUT_S", 0.3)
    silent = socket.create_server(("127.0.0.1", 0))
    app = Celery("silent-redis", set_as_current=False)
    app.conf.broker_url = f"redis://127.0.0.1:{silent.getsockname()[1]}/0"
    app.conf.broker_transport_options = {"socket_timeout": None, "socket_connect_timeout": None}
    answers: list[str | None] = []
    probe = threading.Thread(target=lambda: answers.append(startup.broker_refusal(app)), daemon=True)
    try:
        probe.start()
        probe.join(timeout=20)
        assert answers == [None], "the probe is still waiting for a server that never answers"
    finally:
        silent.close()


def test_a_redis_refusing_the_password_stops_a_worker_at_start_and_nothing_else_does() -> None:
    """As kombu raises it: its `OperationalError` from redis-py's error."""
    from kombu.exceptions import OperationalError
    from redis.exceptions import AuthenticationError
    from redis.exceptions import ConnectionError as RedisConnectionError

    from celery_mcp_tasks.worker.startup import _for_good

    def kombus(cause: Exception) -> OperationalError:
        try:
            raise OperationalError(str(cause)) from cause
        except OperationalError as exc:
            return exc

    assert _for_good(kombus(AuthenticationError("invalid username-password pair or user is disabled.")))
    assert _for_good(kombus(AuthenticationError("Authentication required.")))
    assert not _for_good(kombus(RedisConnectionError("Error 111 connecting to 127.0.0.1:6379. Connection refused.")))
    assert not _for_good(kombus(RedisConnectionError("Timeout connecting to server")))
