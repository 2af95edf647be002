"""Threads in a prefork pool process, and the SIGTERM billiard's pool sends it as it ends.

The failure (Celery 5.7 / billiard 4.3, prefork on a broker Celery cannot poll, so billiard's threaded
`Pool`: the embedded default's filesystem broker): the pool's processes share one result pipe and one
cross-process lock on it. An ending pool process (its job terminated by a revoke, a recycle, a warm
shutdown) writes a last DEATH message under that lock with SIGTERM blocked, and the main process answers
with a SIGTERM to it. By then SIGTERM's disposition is the default (billiard restored it when the
terminating SIGTERM came) and the block is the writing thread's alone: a second thread (our heartbeat
thread, started by the first job) can take that SIGTERM, and the default action ends the process between
its write and its release of the lock. Every other pool process then waits forever for the lock, the main
process forever for a free pool process: no task runs again and a warm shutdown never ends. It takes the
SIGTERM landing in microseconds between write and release: a loaded machine (CI at load 6 on 2 cores),
and then it comes within a few cancels.

Two measures, both needed:
- every thread this package starts blocks the terminate signals (`start_thread`, `termination_blocked`;
  it inherits the mask), so a SIGTERM goes to the main thread, where billiard's block holds it until the
  lock is released, and the process still ends the moment its DEATH message is out, as billiard intends;
- `install` connects a `worker_process_shutdown` handler (sent in the ending pool process right before
  that write): when another thread could still take SIGTERM (one a job or a library started: Sentry's,
  a thread pool), the process ignores SIGTERM from then on, and billiard ends it itself a second later
  (its `os._exit` after a 1 s pause).
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from celery_mcp_tasks.worker.celery_internals import pool_term_signal

# SIGTERM (what a revoke sends), and billiard's TERM_SIGNAL (its parent's answer to DEATH; SIGTERM unless
# REMAP_SIGTERM names another).
TERMINATE_SIGNALS = frozenset({int(signal.SIGTERM), pool_term_signal()})
_CAN_MASK = hasattr(signal, "pthread_sigmask")  # not on Windows, where there are no prefork children either


@contextmanager
def termination_blocked() -> Iterator[None]:
    """The calling thread blocks the terminate signals inside: a thread started here inherits the block."""
    if not _CAN_MASK:
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, TERMINATE_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def start_thread(target: Callable[..., object], name: str, args: tuple[Any, ...] = ()) -> threading.Thread:
    """A started daemon thread that never takes the terminate signals (they go to the main thread)."""
    thread = threading.Thread(target=target, args=args, name=name, daemon=True)
    with termination_blocked():
        thread.start()
    return thread


def others_could_take(signum: int) -> bool:
    """Whether a thread of this process other than the calling one has `signum` unblocked.

    Read from /proc/self/task (every thread, Python's or a C library's); where there is none,
    any other Python thread counts as one that could.
    """
    me = threading.get_native_id()
    try:
        tids = [int(tid) for tid in os.listdir("/proc/self/task")]
    except (OSError, ValueError):
        return threading.active_count() > 1
    bit = 1 << (signum - 1)
    for tid in tids:
        if tid == me:
            continue
        try:
            with open(f"/proc/self/task/{tid}/status") as status:
                blocked = next((line.split()[1] for line in status if line.startswith("SigBlk:")), None)
        except OSError:
            continue  # the thread ended meanwhile
        if blocked is None or not int(blocked, 16) & bit:
            return True
    return False


def _ending(**_: Any) -> None:
    """`worker_process_shutdown`, in the ending pool process just before its DEATH message: see the module."""
    for signum in TERMINATE_SIGNALS:
        if others_could_take(signum):
            try:
                signal.signal(signum, signal.SIG_IGN)
            except ValueError:  # not the main thread: not billiard's ending process either
                pass


_installed = False


def install() -> None:
    """Connect the ending pool process's guard, once per process."""
    global _installed
    if _installed:
        return
    from celery import signals

    signals.worker_process_shutdown.connect(_ending, weak=False)  # connected by call: Celery's signals are untyped
    _installed = True
