"""One heartbeat thread per worker process, beating every job that runs in it (no thread per job).

The reaper tells a lost job by its silence, so a running job beats every `heartbeat_interval_s`.
The thread starts with the first job in the process and stays, idle, for the next (prefork children
run job after job); a job wakes it only if due before it looks again on its own. A forked child starts
afresh (the registry notices the new pid). Like every thread of this package it blocks SIGTERM
(`worker.termination`). A beat that answers False ends that job's beats; one that raises is logged and
tried next interval (a missed beat is at worst a later reap, never a reason to stop the job).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from celery_mcp_tasks.outage_log import OutageLog
from celery_mcp_tasks.store.base import StoreUnavailable
from celery_mcp_tasks.store.failures import loggable
from celery_mcp_tasks.worker.termination import start_thread

logger = logging.getLogger("celery_mcp_tasks.worker")

Beat = Callable[[], bool]
"""Marks one job's task alive; False once there is nothing left to keep alive."""


@dataclass(eq=False)
class Job:
    beat: Beat
    interval: float
    due: float


class Heartbeats:
    """The registry of running jobs and the one thread that beats them (per process)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._reset(os.getpid())

    def _reset(self, pid: int) -> None:
        self._pid = pid
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._jobs: set[Job] = set()
        self._thread: threading.Thread | None = None
        self._wake_at: float | None = None  # when the thread looks again at the latest (None: never on its own)
        self._idle_s: float | None = None  # with no job running, the thread looks again after this long
        self._outage = OutageLog(logger)  # a store outage: said once, and once more when it is over

    @contextmanager
    def running(self, beat: Beat, interval: float) -> Iterator[None]:
        """Beat `beat` every `interval` seconds (the first one interval from now) until the block ends."""
        job = self.add(beat, interval)
        try:
            yield
        finally:
            with self._changed:
                self._jobs.discard(job)

    def hurry(self, job: Job) -> None:
        """Beat `job` now (and again an interval later) instead of when it is due."""
        with self._changed:
            if job in self._jobs and job.due > self._clock():
                job.due = self._clock()
                self._changed.notify()

    def add(self, beat: Beat, interval: float) -> Job:
        """Beat `beat` every `interval` seconds (the first one interval from now) until it answers False."""
        pid = os.getpid()
        if pid != self._pid:  # after a fork: the parent's thread, jobs and lock (perhaps held at the fork) are not ours
            self._reset(pid)
        job = Job(beat, interval, self._clock() + interval)
        with self._changed:
            if not self._jobs:
                self._outage.forget()  # an outage the last jobs beat through is not this job's to report on
            self._jobs.add(job)
            self._idle_s = interval  # the next job is likely to beat at the same pace
            if self._thread is None or not self._thread.is_alive():  # first job, or a thread that died
                self._thread = start_thread(self._run, "mcp-task-heartbeat")  # never takes a SIGTERM
            elif self._wake_at is None or job.due < self._wake_at:
                self._changed.notify()  # else the thread looks before this job is due: no wake-up per job
        return job

    @property
    def running_jobs(self) -> int:
        with self._lock:
            return len(self._jobs)

    def _run(self) -> None:
        while True:
            with self._changed:
                now = self._clock()
                if not self._jobs:  # looks again within a job's interval of its start: it needs no wake-up
                    self._wake_at = None if self._idle_s is None else now + self._idle_s
                    self._changed.wait(self._idle_s)
                    continue
                due = [job for job in self._jobs if job.due <= now]
                if not due:
                    self._wake_at = min(job.due for job in self._jobs)
                    self._changed.wait(self._wake_at - now)
                    continue
                for job in due:
                    job.due = now + job.interval
            for job in due:
                try:
                    alive = job.beat()
                except StoreUnavailable as exc:  # an outage: one line for it in this process, not one a beat
                    self._outage.failed("task heartbeat failed (%s); will retry", loggable(exc.__cause__ or exc))
                    continue
                except Exception:  # a missed beat is only a later reap; never kill the job for it
                    logger.warning("task heartbeat failed; will retry", exc_info=True)
                    continue
                self._outage.answered("task heartbeats reach the task store again")
                if not alive:  # final, or a newer run owns the task: nothing left to keep alive
                    with self._changed:
                        self._jobs.discard(job)


heartbeats = Heartbeats()
"""This process's registry (its thread starts with the first job that runs here)."""
