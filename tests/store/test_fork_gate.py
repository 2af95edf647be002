"""The fork gate of the SQLite store (`store.engine._ForkGate`): its count, and a fork that must not wait forever.

The count is checked on a gate of its own, with the pool's event arguments SQLAlchemy passes. The forks run in
a fresh interpreter: a fork hook, once registered, stays for the life of the process that registered it.
"""

from __future__ import annotations

import gc
import sqlite3
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from celery_mcp_tasks.store.engine import _FORK_GATE, _ForkGate, create_store_engine


class Record:
    """What the pool passes the gate for a connection: its record, whose `record_info` outlives a reconnect."""

    def __init__(self) -> None:
        self.record_info: dict[str, Any] = {}


def _in_thread(fn: Any) -> None:
    thread = threading.Thread(target=fn)
    thread.start()
    thread.join(10)


def test_a_checkout_is_ended_for_the_thread_that_made_it_whichever_thread_checks_it_in() -> None:
    gate, first, second = _ForkGate(), Record(), Record()
    gate.checkout(None, first, None)
    gate.checkout(None, second, None)  # nested, on the same thread
    _in_thread(lambda: gate.checkin(None, first))  # a collected connection, finalized on another thread
    assert dict(gate._inside) == {threading.get_ident(): 1}
    gate.checkin(None, second)
    assert not gate._inside


def test_a_checkin_without_a_counted_checkout_changes_nothing() -> None:
    """SQLAlchemy fires `checkin` for a record whose reconnect failed, with no `checkout` before it."""
    gate, held, failed = _ForkGate(), Record(), Record()
    gate.checkout(None, held, None)
    gate.checkin(None, failed)
    gate.checkin(None, None)  # an invalidated connection's record may be gone
    assert dict(gate._inside) == {threading.get_ident(): 1}


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Engine]:
    engine = create_store_engine(f"sqlite:///{tmp_path / 'tasks.db'}")
    yield engine
    engine.dispose()
    assert not _FORK_GATE._inside[threading.get_ident()]  # every test leaves the process's gate as it found it


def _once(exc: Exception) -> Any:
    """A listener that raises `exc` the first time it is called."""
    raised: list[bool] = []

    def listener(*_: Any) -> None:
        if not raised:
            raised.append(True)
            raise exc

    return listener


def test_a_checkout_the_pool_retries_is_counted_once(engine: Engine) -> None:
    """A checkout listener's `DisconnectionError` makes the pool reconnect and run every checkout listener again."""
    sa.event.listen(engine, "checkout", _once(sa.exc.DisconnectionError("try again")))
    with engine.connect() as conn:
        assert conn.execute(sa.text("select 1")).scalar() == 1
        assert _FORK_GATE._inside[threading.get_ident()] == 1


def test_a_new_connection_is_set_up_inside_the_gate(engine: Engine) -> None:
    """The dialect's setup and ours (WAL's PRAGMAs) run between the connection's opening and `opened`."""
    seen: list[int] = []
    sa.event.listen(engine, "connect", lambda *_: seen.append(_FORK_GATE._inside[threading.get_ident()]), insert=True)
    with engine.connect() as conn:
        conn.execute(sa.text("select 1"))
    assert seen == [1]


def test_a_connection_whose_setup_failed_leaves_the_gate(engine: Engine) -> None:
    sa.event.listen(
        engine, "connect", _once(sqlite3.OperationalError("disk I/O error")), insert=True
    )  # ours never runs
    with pytest.raises(sa.exc.OperationalError):
        engine.connect()
    gc.collect()
    assert not _FORK_GATE._inside[threading.get_ident()]


def test_while_two_threads_fork_no_thread_gets_in_until_both_are_done() -> None:
    gate, entered = _ForkGate(), threading.Event()
    first, second = threading.Event(), threading.Event()

    def fork(started: threading.Event, done: threading.Event) -> None:
        gate.hold()
        started.set()
        done.wait(10)
        gate.release()

    first_done, second_done = threading.Event(), threading.Event()
    forks = [threading.Thread(target=fork, args=pair) for pair in ((first, first_done), (second, second_done))]
    for thread in forks:
        thread.start()
    assert first.wait(10) and second.wait(10)
    first_done.set()
    forks[0].join(10)
    other = threading.Thread(target=lambda: (gate.enter(), entered.set()))
    other.start()
    assert not entered.wait(0.2)  # the second fork is still under way
    second_done.set()
    assert entered.wait(10)
    other.join(10)
    forks[1].join(10)


def test_a_fork_waits_for_another_thread_inside_then_lets_it_finish_its_checkin() -> None:
    gate, record, order = _ForkGate(), Record(), []
    inside, leave = threading.Event(), threading.Event()

    def other() -> None:
        gate.checkout(None, record, None)
        inside.set()
        leave.wait(10)
        order.append("checkin")
        gate.checkin(None, record)

    thread = threading.Thread(target=other)
    thread.start()
    inside.wait(10)
    threading.Timer(0.2, leave.set).start()
    gate.hold()
    order.append("fork")
    gate.release()
    thread.join(10)
    assert order == ["checkin", "fork"]


def _run(script: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=20,  # under the gate's own bound (the busy timeout, 30 s): the fork must not wait at all
    )


@pytest.mark.integration  # forks a fresh interpreter
def test_a_connection_closed_by_the_forking_thread_during_the_fork_does_not_hang_it(tmp_path: Path) -> None:
    """A finalizer of the forking thread (here a collection run by a fork hook) closes an overflow connection
    nobody returned: the close enters the gate the fork holds, and must go through."""
    done = _run(
        """
        import gc, os, sys
        os.register_at_fork(before=gc.collect)  # registered first, so it runs after the gate's `hold`
        from celery_mcp_tasks.store.engine import create_store_engine
        import sqlalchemy as sa
        gc.disable()
        engine = create_store_engine("sqlite:///tasks.db", pool_size=1, max_overflow=1)
        a = engine.connect(); a.execute(sa.text("select 1")); a.commit()
        b = engine.connect(); b.execute(sa.text("select 1")); b.commit()
        cycle = [b]; cycle.append(cycle)  # b is dropped unreturned, collected only by gc
        del b, cycle
        a.close()
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        os.waitpid(pid, 0)
        print("forked")
        """,
        tmp_path,
    )
    assert done.returncode == 0 and "forked" in done.stdout, done.stderr[-2000:]
