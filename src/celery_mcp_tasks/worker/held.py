"""A message this worker holds but has not started keeps its task alive.

The reaper tells a lost job by its silence, and a job beats only once it runs. A worker also holds
messages it has not started: prefetched while its pool is busy, waiting for a `rate_limit` slot, or
counting down an ETA. Those are not lost, and the reaper must not send them again (the copy held would
then be skipped as superseded, and after `max_sends` the task would fail as lost while a healthy worker
had it). So the worker's main process, which receives every message (`task_received`), beats the task of
each one it holds until that message starts (its run beats from then on), is acknowledged, or is gone.
If the worker dies, the beats stop with it and the reaper acts as before. A held copy of a run another
copy has started (a redelivery) beats nothing: if that copy died, its silence is the reaper's to see.
One beat per process, at the heartbeat interval, over the messages held then: a message that starts
within the interval costs nothing.
"""

from __future__ import annotations

import threading
import time
import weakref
from typing import Any

from celery import signals

from celery_mcp_tasks.model import Run, now_ms
from celery_mcp_tasks.service import TaskService
from celery_mcp_tasks.worker.heartbeats import Job, heartbeats
from celery_mcp_tasks.worker.job import McpJob, row_key, run_of


class Held:
    """This process's held messages of our jobs, and the one beat that keeps their tasks alive."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # request -> (service, row key, run, when its task was last beaten from here: None, not yet)
        self._held: weakref.WeakKeyDictionary[Any, tuple[TaskService, str, Run, float | None]] = (
            weakref.WeakKeyDictionary()
        )
        self._beat: Job | None = None
        self._interval = 0.0

    def received(self, request: Any, service: TaskService, key: str, run: Run, interval: float) -> None:
        """Held from now on. A task older than a beat interval (its message waited in the broker, or it was
        resumed) is beaten now, not up to an interval later: its last beat may be about to go stale."""
        with self._lock:
            self._held[request] = (service, key, run, None)
            beat = self._beat
            if beat is None:
                beat = self._beat = heartbeats.add(self.beat, interval)
                self._interval = interval
        if run.born is not None and now_ms() - run.born > interval * 1000:
            heartbeats.hurry(beat)

    def __len__(self) -> int:
        with self._lock:
            return len(self._held)

    def beat(self) -> bool:
        """Marks the task of every message still held alive, but for those beaten less than half an interval
        ago (a beat hurried for a new message writes for that one); drops the rest. Always True: it beats on."""
        now = time.monotonic()
        with self._lock:
            held = list(self._held.items())
        for request, (service, key, run, beaten) in held:
            if beaten is not None and now - beaten < self._interval / 2:
                continue
            if request.time_start is None and not request.acknowledged and service.heartbeat(key, run, waiting=True):
                with self._lock:
                    if request in self._held:
                        self._held[request] = (service, key, run, now)
                continue
            with self._lock:  # started (its run beats now), done, or its task moved on: no longer ours to beat
                self._held.pop(request, None)
        return True


held = Held()


def on_received(sender: Any = None, request: Any = None, **_: Any) -> None:
    """`task_received`, in the worker's main process: a message of one of our jobs is held from now on."""
    job = getattr(request, "task", None)
    if not isinstance(job, McpJob):
        return
    headers = request.request_dict
    key, run = row_key(headers), run_of(headers)
    if key is not None and run is not None:
        held.received(request, job.mcp_runtime.service(), key, run, job.mcp_runtime.heartbeat_interval_s)


_installed = False


def install() -> None:
    global _installed
    if not _installed:
        signals.task_received.connect(on_received, weak=False)  # connected by call: Celery's signals are untyped
        _installed = True
