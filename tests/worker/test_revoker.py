"""Revoking off the request path: `submit` returns at once, the publish gives up within its bound,
pending revokes are bounded, and only a tool that asked for termination is revoked at all.

In process, no worker: the broker is a Redis URL nobody listens on.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

import pytest
from celery import Celery

from celery_mcp_tasks.model import TaskRecord, TaskStatus, celery_message_id
from celery_mcp_tasks.worker.dispatch import BackgroundRevoker, CeleryDispatcher
from celery_mcp_tasks.worker.kombu_internals import REDIS_TRANSPORT
from tests.support import free_port, wait_until


@dataclass
class Tool:
    name: str
    terminate: bool
    celery_name: str = "job"


def _record(tool: str) -> TaskRecord:
    return TaskRecord(
        key="k" * 64,
        owner=None,
        tool=tool,
        status=TaskStatus.CANCELLED,
        created_at=1,
        updated_at=1,
        ttl_ms=None,
        dispatches=1,
    )


def test_a_revoke_with_the_broker_down_returns_at_once_and_gives_up_within_its_bound(
    caplog: pytest.LogCaptureFixture,
) -> None:
    app = Celery("revoker", broker=f"redis://127.0.0.1:{free_port()}/0")  # nothing listens there
    app.conf.broker_transport = REDIS_TRANSPORT
    revoker = BackgroundRevoker(app)
    caplog.set_level(logging.WARNING, "celery_mcp_tasks.worker")
    started = time.monotonic()
    revoker.submit("a-celery-id", "stubborn", terminate=True)
    assert time.monotonic() - started < 0.1
    wait_until(lambda: "given up" in caplog.text, 10, "the revoke to give up")
    assert time.monotonic() - started < revoker.deadline_s + 3
    lines = [r.getMessage() for r in caplog.records if "given up" in r.getMessage()]
    assert len(lines) == 1 and "'stubborn'" in lines[0] and "a-celery-id" not in caplog.text


def test_pending_revokes_are_bounded_and_sent_as_one_broadcast(caplog: pytest.LogCaptureFixture) -> None:
    release = threading.Event()
    published: list[tuple[list[str], bool]] = []

    def publish(ids: list[str], terminate: bool) -> None:
        release.wait(10)
        published.append((ids, terminate))

    revoker = BackgroundRevoker(Celery("revoker"), max_pending=3, publish=publish)
    caplog.set_level(logging.WARNING, "celery_mcp_tasks.worker")
    revoker.submit("first", "t", terminate=True)  # taken by the thread, which then blocks in publish
    wait_until(lambda: revoker._queue.empty(), 5, "the first revoke to be taken")
    for n in range(5):
        revoker.submit(f"id-{n}", "t", terminate=True)
    assert caplog.text.count("dropped") == 2  # three wait, two are dropped (with a line each, no id)
    assert "id-" not in caplog.text
    release.set()
    wait_until(lambda: len(published) == 2, 5, "the pending revokes to be sent")
    assert published == [(["first"], True), (["id-0", "id-1", "id-2"], True)]


def test_only_a_tool_that_asked_for_termination_is_revoked() -> None:
    class Recording(BackgroundRevoker):
        def __init__(self) -> None:
            self.submitted: list[tuple[str, str, bool]] = []

        def submit(self, celery_id: str, tool: str, *, terminate: bool) -> None:
            self.submitted.append((celery_id, tool, terminate))

    recording = Recording()
    tools = {"stubborn": Tool("stubborn", terminate=True), "polite": Tool("polite", terminate=False)}
    dispatcher = CeleryDispatcher(Celery("revoker"), tools, revoker=recording)  # type: ignore[arg-type]
    dispatcher.revoke(_record("polite"))  # it checks ctx.cancelled(); a queued message is skipped at its start
    dispatcher.revoke(_record("gone"))  # a tool no longer registered
    dispatcher.revoke(_record("stubborn"))
    assert recording.submitted == [(celery_message_id(_record("stubborn")), "stubborn", True)]


@dataclass(eq=False)
class Consumer:
    app: Celery
    pool: object


def _pidbox_error(exc: Exception) -> logging.LogRecord:
    try:
        raise exc
    except Exception as raised:  # noqa: BLE001 - the record kombu logs carries the exception
        return logging.LogRecord(
            "kombu.pidbox",
            logging.ERROR,
            __file__,
            1,
            "pidbox command error: %r",
            (raised,),
            (type(raised), raised, raised.__traceback__),
        )


def test_a_worker_whose_pool_cannot_terminate_says_so_once_and_logs_no_traceback_per_cancel(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from celery import signals
    from celery.concurrency.thread import TaskPool as Threads

    app = Celery("pools", broker="memory://")
    _dispatcher = CeleryDispatcher(app, {"slow": Tool("slow", terminate=True), "quick": Tool("quick", terminate=False)})
    pidbox = logging.getLogger("kombu.pidbox")
    filters = list(pidbox.filters)
    try:
        with caplog.at_level(logging.WARNING, logger="celery_mcp_tasks.worker"):
            signals.worker_ready.send(sender=Consumer(Celery("someone-else"), Threads.__new__(Threads)))
            assert not caplog.records  # another app's worker: not ours to speak for
            signals.worker_ready.send(sender=Consumer(app, Threads.__new__(Threads)))
        (line,) = [r.getMessage() for r in caplog.records]
        assert "thread pool cannot terminate a running job" in line and "'slow'" in line and "quick" not in line
        cannot_kill = NotImplementedError("<class 'celery.concurrency.thread.TaskPool'> does not implement kill_job")
        assert not pidbox.filter(_pidbox_error(cannot_kill))
        assert pidbox.filter(_pidbox_error(KeyError("other")))  # every other pidbox error is still logged
    finally:
        pidbox.filters[:] = filters


class _Gevent:
    """Celery's gevent pool as the warnings see it (its module; it kills a job's greenlet), without gevent."""

    __module__ = "celery.concurrency.gevent"

    def terminate_job(self, pid: Any, signal: Any = None) -> None: ...


@pytest.mark.parametrize(
    ("pool", "line"),
    [
        (
            "solo",
            "this worker's solo pool enforces no time limit: time_limit and soft_time_limit of 'hard', 'soft' are "
            "ignored (a prefork worker enforces them)",
        ),
        (  # a gevent Timeout holds the hard limit only; it terminates, so nothing is said of terminate
            "gevent",
            "this worker's gevent pool enforces no soft time limit: soft_time_limit of 'soft' is ignored (their "
            "time_limit holds; a prefork worker enforces both)",
        ),
    ],
)
def test_a_worker_says_once_which_of_the_tools_time_limits_its_pool_ignores(
    caplog: pytest.LogCaptureFixture, pool: str, line: str
) -> None:
    from celery import signals
    from celery.concurrency.solo import TaskPool as Solo

    app = Celery("limits", broker="memory://")

    @app.task(name="soft", soft_time_limit=5, shared=False)
    def soft() -> None: ...

    @app.task(name="hard", time_limit=5, shared=False)
    def hard() -> None: ...

    tools = {name: Tool(name, terminate=pool == "gevent", celery_name=name) for name in ("soft", "hard")}
    _dispatcher = CeleryDispatcher(app, {**tools, "quick": Tool("quick", False)})  # holds its receiver (weakly)
    instance = Solo.__new__(Solo) if pool == "solo" else _Gevent()
    with caplog.at_level(logging.WARNING, logger="celery_mcp_tasks.worker"):
        signals.worker_ready.send(sender=Consumer(app, instance))
    assert [r.getMessage() for r in caplog.records] == [line]


class _Eventlet(_Gevent):
    __module__ = "celery.concurrency.eventlet"


def test_an_eventlet_worker_says_a_slow_store_call_stalls_it(caplog: pytest.LogCaptureFixture) -> None:
    """psycopg waits cooperatively under gevent's hub only (sqlite3 never): under eventlet a store call that waits
    (a locked row, a slow database) stops every job, heartbeat and revoke of the worker."""
    from celery import signals

    app = Celery("eventlet", broker="memory://")
    _dispatcher = CeleryDispatcher(app, {"quick": Tool("quick", False)})  # holds its receiver (weakly)
    with caplog.at_level(logging.WARNING, logger="celery_mcp_tasks.worker"):
        signals.worker_ready.send(sender=Consumer(app, _Eventlet()))
    assert [r.getMessage() for r in caplog.records] == [
        "this worker's eventlet pool cannot run other jobs while one waits on the task store: a slow store call "
        "stalls every job, heartbeat and revoke of this worker (a threads or prefork worker does not; on PostgreSQL, "
        "a gevent one neither)"
    ]
