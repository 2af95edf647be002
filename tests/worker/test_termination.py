"""No thread of this package takes a SIGTERM meant for a pool process, and an ending pool process with a thread
that could take one ignores it (`celery_mcp_tasks.worker.termination`; on real workers: test_terminate.py)."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable
from contextlib import ExitStack

import pytest
from celery import Celery

from celery_mcp_tasks.worker import termination
from celery_mcp_tasks.worker.dispatch import BackgroundRevoker
from celery_mcp_tasks.worker.heartbeats import Heartbeats
from tests.support import wait_until

pytestmark = pytest.mark.skipif(not hasattr(signal, "pthread_sigmask"), reason="no per-thread signal masks")


def _mask() -> set[int]:
    """The calling thread's blocked signals."""
    blocked: set[int | signal.Signals] = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    return {int(s) for s in blocked}


def _mask_in_thread_of(start: Callable[[Callable[[], None]], object]) -> set[int]:
    """The signal mask of the thread `start` runs its callback in."""
    seen: list[set[int]] = []

    def record() -> None:
        if not seen:
            seen.append(_mask())

    start(record)
    wait_until(lambda: seen, 5, "the thread to run")
    return seen[0]


def test_a_thread_started_here_blocks_the_terminate_signals_and_its_starter_keeps_its_mask() -> None:
    before = _mask()
    blocked = _mask_in_thread_of(lambda record: termination.start_thread(record, "probe"))
    assert blocked >= set(termination.TERMINATE_SIGNALS) and int(signal.SIGTERM) in blocked
    assert _mask() == before
    with termination.termination_blocked():
        assert int(signal.SIGTERM) in _mask()
    assert _mask() == before


def test_the_heartbeat_thread_never_takes_a_sigterm() -> None:
    registry = Heartbeats()
    with ExitStack() as jobs:

        def start(record: Callable[[], None]) -> None:
            def beat() -> bool:
                record()
                return True

            jobs.enter_context(registry.running(beat, 0.01))

        assert int(signal.SIGTERM) in _mask_in_thread_of(start)


def test_the_revoke_thread_never_takes_a_sigterm() -> None:
    def start(record: Callable[[], None]) -> None:
        revoker = BackgroundRevoker(Celery("probe", set_as_current=False), publish=lambda ids, terminate: record())
        revoker.submit("a-celery-id", "stubborn", terminate=True)

    assert int(signal.SIGTERM) in _mask_in_thread_of(start)


_ENDING = """
import signal, threading
from celery import signals
from celery_mcp_tasks.worker import termination
termination.install()
stop = threading.Event()
{start}
signals.worker_process_shutdown.send(sender=None, pid=0, exitcode=0)
print(signal.getsignal(signal.SIGTERM) is signal.SIG_IGN)
"""


@pytest.mark.integration  # a fresh interpreter: the guard changes its process's SIGTERM disposition
@pytest.mark.parametrize(
    ("start", "ignored"),
    [
        ("threading.Thread(target=stop.wait, daemon=True).start()", True),  # a job's or a library's thread
        ("termination.start_thread(stop.wait, 'ours')", False),  # billiard's own block protects its write
        ("pass", False),
    ],
    ids=["foreign-thread", "our-thread", "no-thread"],
)
def test_an_ending_pool_process_ignores_sigterm_only_when_another_thread_could_take_it(
    start: str, ignored: bool
) -> None:
    script = textwrap.dedent(_ENDING).format(start=start)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.strip() == str(ignored), done.stderr
