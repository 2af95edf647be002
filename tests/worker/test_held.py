"""The worker's main process keeps the tasks of messages it holds alive (`worker.held`); end to end, a job
waiting for its rate limit: tests/worker/test_celery_options.py."""

from __future__ import annotations

from typing import Any

from celery_mcp_tasks.model import Run
from celery_mcp_tasks.worker.held import Held


class Request:
    def __init__(self) -> None:
        self.time_start: float | None = None
        self.acknowledged = False


class Service:
    def __init__(self, moved_on: set[str] | None = None) -> None:
        self.beats: list[str] = []
        self.moved_on = moved_on or set()

    def heartbeat(self, key: str, run: Run, *, waiting: bool = False) -> bool:
        assert waiting  # a held message's beat never keeps a started copy alive
        self.beats.append(key)
        return key not in self.moved_on


def test_a_held_message_beats_until_it_starts_is_acknowledged_moves_on_or_is_gone() -> None:
    held = Held()
    service: Any = Service(moved_on={"superseded"})
    requests = {name: Request() for name in ("waiting", "started", "acked", "superseded", "gone")}
    for name, request in requests.items():
        held._held[request] = (service, name, Run(1, 0, 1), None)  # as `received` records it, without the thread

    requests["started"].time_start = 1.0
    requests["acked"].acknowledged = True
    del requests["gone"], request  # the worker let go of it: nothing refers to it any more

    assert held.beat() is True
    assert sorted(service.beats) == ["superseded", "waiting"]
    assert len(held) == 1  # only the message still waiting is held

    service.beats.clear()
    held.beat()
    assert service.beats == ["waiting"]


def test_a_message_of_a_task_older_than_a_beat_interval_is_beaten_at_once(monkeypatch: Any) -> None:
    """It may have waited in the broker for most of the stale timeout: the next shared beat could come too
    late. A fresh task's message waits for that beat (no write for messages that start at once)."""
    from celery_mcp_tasks.worker import held as module

    hurried: list[object] = []
    monkeypatch.setattr(module.heartbeats, "add", lambda beat, interval: "the held beat")
    monkeypatch.setattr(module.heartbeats, "hurry", hurried.append)
    monkeypatch.setattr(module, "now_ms", lambda: 100_000)
    held, service = Held(), Service()
    fresh, old = Request(), Request()
    held.received(fresh, service, "fresh", Run(1, 0, 99_000), interval=2.0)  # born 1 s ago
    assert hurried == []
    held.received(old, service, "old", Run(1, 0, 97_000), interval=2.0)  # born 3 s ago
    assert hurried == ["the held beat"] and len(held) == 2


def test_a_hurried_beat_writes_only_for_the_messages_not_beaten_lately() -> None:
    """Draining a backlog, every message received is of an old task and hurries the beat: each hurried beat
    must write for the new message, not again for every message held."""
    import time

    held, service = Held(), Service()
    held._interval = 10.0
    beaten, new = Request(), Request()
    held._held[beaten] = (service, "beaten", Run(1, 0, 1), time.monotonic())  # beaten a moment ago
    held._held[new] = (service, "new", Run(1, 0, 1), None)
    held.beat()
    assert service.beats == ["new"]
    held.beat()  # the next hurried beat: both were beaten lately
    assert service.beats == ["new"]
