"""A Celery soft time limit waits for the store call in flight.

In a prefork pool process the soft limit is a signal whose handler raises `SoftTimeLimitExceeded` wherever
the job's thread is. Landing inside a store call, it could leave a PostgreSQL connection mid-query (the next
statement on it fails) or an SQLite write transaction open (every other process then waits for the lock),
and the job's failure could not be recorded. While the job's thread is in a call of the service `shielded`
returns, the pool's handler only notes the signal; the limit is raised as the call returns, a few
milliseconds late (a call that never returns defers it until the hard `time_limit`). Once the body is
over (`settling`: the bridge records its outcome), a limit coming is dropped. Calls from other threads (the
heartbeat's) are not shielded: the handler runs on the job's thread. Only the pool's own handler is
wrapped: another of the signal (the solo worker's thread dump) runs when it comes.
"""

from __future__ import annotations

import functools
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from types import FrameType
from typing import Any, cast

from celery_mcp_tasks.service import TaskService
from celery_mcp_tasks.worker.celery_internals import soft_limit_handler

_depth = 0  # store calls (or a settling outcome) in flight on the main thread
_pending: tuple[int, FrameType | None] | None = None
_handler: Callable[[int, FrameType | None], Any] | None = None  # the pool's own, raising the limit
_looked = False  # this process looked for the pool's handler (before its first job: the pool's is there by then)


def install() -> None:
    """Defer the pool's soft-limit handler during store calls (a prefork pool process, before a job runs).

    Looks once per process: a pool process gets its handler before it runs a job, and nothing replaces ours."""
    global _handler, _looked
    if _looked:
        return
    _looked = True
    found = soft_limit_handler()
    if found is None or threading.current_thread() is not threading.main_thread():
        return
    number, pools = found
    if signal.getsignal(number) is pools:
        _handler = pools
        signal.signal(number, _deferring)


def _deferring(signum: int, frame: FrameType | None) -> None:
    global _pending
    if _depth:
        _pending = (signum, frame)
    elif _handler is not None:
        _handler(signum, frame)


@contextmanager
def _held(*, drop: bool) -> Iterator[None]:
    """The job's thread inside: a soft limit coming waits. On the way out it is raised, or, with `drop` (the
    body is over) or an exit propagating (SystemExit, KeyboardInterrupt win over the limit), forgotten."""
    global _depth, _pending
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _depth += 1
    exiting = False
    try:
        yield
    except BaseException as exc:
        exiting = not isinstance(exc, Exception)
        raise
    finally:
        _depth -= 1
        if not _depth and _pending is not None:
            signum, frame = _pending
            _pending = None
            if not (drop or exiting) and _handler is not None:
                _handler(signum, frame)  # the limit, now that the call is over


def settling() -> AbstractContextManager[None]:
    """The job's body is over: a soft limit coming while its outcome is recorded is dropped."""
    return _held(drop=True)


class _Shielded:
    def __init__(self, service: TaskService) -> None:
        self._service = service

    def __getattr__(self, name: str) -> Any:
        found = getattr(self._service, name)
        if not callable(found):
            return found

        @functools.wraps(found)
        def call(*args: Any, **kwargs: Any) -> Any:
            with _held(drop=False):
                return found(*args, **kwargs)

        return call


def shielded(service: TaskService) -> TaskService:
    """`service`, each of whose calls finishes before a soft time limit raised during it."""
    return cast("TaskService", _Shielded(service))
