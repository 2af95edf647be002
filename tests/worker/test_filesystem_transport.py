"""The embedded broker's transport: a reader never sees half a message, and an unreadable one never ends a worker."""

from __future__ import annotations

import inspect
import json
import os
import socket
import threading
import time
from pathlib import Path
from queue import Empty

import kombu
import pytest
from kombu import Connection
from kombu.transport import TRANSPORT_ALIASES
from kombu.transport import filesystem as kombu_filesystem

from celery_mcp_tasks.app import configure_celery
from celery_mcp_tasks.config import Settings
from celery_mcp_tasks.worker import kombu_internals
from celery_mcp_tasks.worker.kombu_internals import FILESYSTEM_TRANSPORT
from celery_mcp_tasks.worker.kombu_internals.filesystem_transport import PARTIAL_SUFFIX, Channel, Transport


def test_the_fix_is_written_against_this_kombu() -> None:
    assert kombu.__version__.rsplit(".", 1)[0] in kombu_internals.VERSIONS, (
        f"kombu {kombu.__version__}: the filesystem transport fix was written against kombu 5.7.0; re-read "
        "kombu.transport.filesystem.Channel._put/_get before moving on"
    )
    for name in ("_put", "_get", "_queue_bind", "get_table", "_exchange_file"):
        assert callable(getattr(kombu_filesystem.Channel, name, None)), f"kombu moved Channel.{name}"
    base = kombu_filesystem.Transport
    assert callable(base.establish_connection) and isinstance(base.default_connection_params, property)
    # `drain_events` (in slices) relies on kombu's giving up with socket.timeout once a wait found nothing
    assert "raise socket.timeout()" in inspect.getsource(base.drain_events)
    assert Transport.Channel is Channel and issubclass(Transport, kombu_filesystem.Transport)


def test_this_apps_filesystem_connections_use_the_fixed_transport_and_kombus_table_is_untouched(
    tmp_path: Path,
) -> None:
    from celery import Celery

    aliases = dict(TRANSPORT_ALIASES)
    app = Celery("transport-choice", set_as_current=False)
    configure_celery(app, Settings(data_dir=tmp_path))
    assert app.conf.broker_transport == FILESYSTEM_TRANSPORT
    assert app.connection_for_write().transport_cls == FILESYSTEM_TRANSPORT
    assert aliases == TRANSPORT_ALIASES
    chosen = Celery("chosen", set_as_current=False)
    chosen.conf.broker_transport = "someone.elses:Transport"
    configure_celery(chosen, Settings(data_dir=tmp_path))
    assert chosen.conf.broker_transport == "someone.elses:Transport"


def test_configuring_makes_no_folder_and_connecting_makes_them_without_a_host_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from celery import Celery

    app = Celery("folders", set_as_current=False)
    settings = Settings(data_dir=tmp_path / "data")
    configure_celery(app, settings)
    assert not (tmp_path / "data").exists()
    with caplog.at_level("DEBUG", logger="kombu"), app.connection_for_write() as conn:
        conn.ensure_connection(max_retries=0)
    assert sorted(p.name for p in settings.broker_folder.iterdir()) == ["control", "queue"]
    assert not [r for r in caplog.records if "hostname" in r.getMessage()], caplog.text


@pytest.fixture
def channel(tmp_path: Path) -> Channel:
    (tmp_path / "queue").mkdir()
    connection = Connection("filesystem://", transport=Transport, transport_options=_options(tmp_path))
    opened = connection.default_channel
    assert isinstance(opened, Channel)
    return opened


def _options(tmp_path: Path) -> dict[str, str]:
    folder = tmp_path / "queue"
    return {
        "data_folder_in": str(folder),
        "data_folder_out": str(folder),
        "processed_folder": str(tmp_path),
        "control_folder": str(tmp_path / "control"),
    }


def test_a_message_is_whole_or_absent_while_it_is_written(channel: Channel, tmp_path: Path) -> None:
    big = {"body": "x" * 2_000_000}
    stop = threading.Event()
    seen: list[object] = []
    errors: list[BaseException] = []

    def read() -> None:
        while not stop.is_set():
            try:
                seen.append(channel._get("jobs"))
            except Empty:
                continue
            except BaseException as exc:  # noqa: BLE001 - reported by the test
                errors.append(exc)
                return

    reader = threading.Thread(target=read)
    reader.start()
    for _ in range(20):
        channel._put("jobs", big)
    deadline = time.monotonic() + 20
    while len(seen) < 20 and time.monotonic() < deadline and not errors:
        time.sleep(0.01)
    stop.set()
    reader.join()
    assert errors == [] and len(seen) == 20 and all(message == big for message in seen)
    assert not [name for name in os.listdir(tmp_path / "queue") if name.endswith(PARTIAL_SUFFIX)]


def test_an_unreadable_file_is_skipped_and_the_next_message_delivered(channel: Channel, tmp_path: Path) -> None:
    (tmp_path / "queue" / f"{int(time.monotonic() * 1000) - 10}_broken.jobs.msg").write_bytes(b"")
    channel._put("jobs", {"n": 1})
    assert channel._get("jobs") == {"n": 1}
    with pytest.raises(Empty):
        channel._get("jobs")


def test_a_file_still_being_written_is_not_picked_up(channel: Channel, tmp_path: Path) -> None:
    (tmp_path / "queue" / f"1_x.jobs.msg{PARTIAL_SUFFIX}").write_text(json.dumps({"n": 0})[:3])
    with pytest.raises(Empty):
        channel._get("jobs")


def test_queues_declared_at_once_on_a_new_exchange_are_all_in_its_table(tmp_path: Path) -> None:
    """Each binder is a channel of its own (a process of its own: a worker, its beat, another worker);
    a reader meanwhile never meets a table that is empty or half there."""
    (tmp_path / "queue").mkdir()
    rounds, binders = 30, 4
    errors: list[BaseException] = []
    for n in range(rounds):
        exchange = f"fanout-{n}"
        channels = [
            Connection("filesystem://", transport=Transport, transport_options=_options(tmp_path)).default_channel
            for _ in range(binders + 1)
        ]
        start = threading.Barrier(binders + 1)

        def bind(channel: Channel, queue: str, exchange: str = exchange, start: threading.Barrier = start) -> None:
            start.wait()
            try:
                channel._queue_bind(exchange, "", "", queue)
            except BaseException as exc:  # noqa: BLE001 - reported by the test
                errors.append(exc)

        def read(channel: Channel, exchange: str = exchange, start: threading.Barrier = start) -> None:
            start.wait()
            for _ in range(200):
                try:
                    channel.get_table(exchange)
                except BaseException as exc:  # noqa: BLE001 - reported by the test
                    errors.append(exc)
                    return

        threads = [threading.Thread(target=bind, args=(channels[i], f"q{i}")) for i in range(binders)]
        threads.append(threading.Thread(target=read, args=(channels[-1],)))
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert errors == [], errors
        assert sorted(q.queue for q in channels[-1].get_table(exchange)) == [f"q{i}" for i in range(binders)], n
    assert not [name for name in os.listdir(tmp_path / "control") if name.endswith(PARTIAL_SUFFIX)]


def test_a_timed_drain_ends_as_timed_out_once_the_worker_is_told_to_stop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Celery's loop for this transport drains 2 s at a time and once more after a stop: without slices, an idle
    worker noticed Ctrl-C ~4 s late. A drain that waited out its whole timeout here would take 60 s."""
    from celery.worker import state

    (tmp_path / "queue").mkdir()
    connection = Connection("filesystem://", transport=Transport, transport_options=_options(tmp_path))
    with connection, kombu.Consumer(connection, queues=[kombu.Queue("jobs")], callbacks=[lambda *_: None]):
        monkeypatch.setattr(state, "should_stop", 0)  # what Ctrl-C's warm shutdown sets (exit status 0)
        started = time.monotonic()
        with pytest.raises(socket.timeout):
            connection.drain_events(timeout=60)
        assert time.monotonic() - started < 10


def test_a_timed_drain_still_waits_its_whole_timeout_and_delivers_what_comes(tmp_path: Path) -> None:
    (tmp_path / "queue").mkdir()
    got: list[object] = []

    def send_late() -> None:
        with Connection("filesystem://", transport=Transport, transport_options=_options(tmp_path)) as sender:
            sender.Producer().publish("late", routing_key="jobs")

    with Connection("filesystem://", transport=Transport, transport_options=_options(tmp_path)) as connection:
        receive = [lambda body, message: got.append(body)]
        with kombu.Consumer(connection, queues=[kombu.Queue("jobs")], callbacks=receive, no_ack=True):
            started = time.monotonic()
            with pytest.raises(socket.timeout):
                connection.drain_events(timeout=0.6)  # longer than a slice
            assert time.monotonic() - started >= 0.6
            threading.Timer(0.4, send_late).start()
            started = time.monotonic()
            connection.drain_events(timeout=30)
            assert time.monotonic() - started < 5  # delivered when it came, not when the wait ran out
    assert got == ["late"]
