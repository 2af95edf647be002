"""A soft time limit waits for the store call in flight (`worker.soft_limits`); the end-to-end case, a job
reporting without pause past its limit on real workers: tests/worker/test_job_flows.py."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from typing import Any

import pytest
from billiard.pool import soft_timeout_sighandler
from celery.exceptions import SoftTimeLimitExceeded

from celery_mcp_tasks.worker import soft_limits


@pytest.fixture
def pool_handler(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """SIGUSR1 handled as a prefork pool process handles it, then `install()` as before a job's first run."""
    before = signal.signal(signal.SIGUSR1, soft_timeout_sighandler)
    monkeypatch.setattr(soft_limits, "_handler", None)
    monkeypatch.setattr(soft_limits, "_looked", False)
    try:
        soft_limits.install()
        yield
    finally:
        signal.signal(signal.SIGUSR1, before)


class Service:
    def __init__(self) -> None:
        self.done: list[str] = []
        self.name = "service"

    def write(self, what: str) -> str:
        os.kill(os.getpid(), signal.SIGUSR1)  # the limit, in the middle of the call
        self.done.append(what)  # ...which still finishes
        return what

    def read(self) -> str:
        return "read"

    def exit(self) -> None:
        os.kill(os.getpid(), signal.SIGUSR1)
        raise SystemExit(3)


def test_the_limit_is_raised_as_the_store_call_returns_not_inside_it(pool_handler: None) -> None:
    service = Service()
    shielded: Any = soft_limits.shielded(service)  # type: ignore[arg-type]
    with pytest.raises(SoftTimeLimitExceeded):
        shielded.write("progress")
    assert service.done == ["progress"]
    assert shielded.name == "service"  # attributes pass through
    with pytest.raises(SoftTimeLimitExceeded):
        service.write("unshielded")  # outside a shielded call the limit lands where it lands
    assert service.done == ["progress"]
    with pytest.raises(SystemExit):
        shielded.exit()  # an exit the call raised wins over the limit


def test_a_limit_coming_while_the_outcome_is_recorded_is_dropped(pool_handler: None) -> None:
    service = Service()
    shielded: Any = soft_limits.shielded(service)  # type: ignore[arg-type]
    with soft_limits.settling():
        shielded.write("completed")
        service.write("as the bridge writes, unshielded")
    assert service.done == ["completed", "as the bridge writes, unshielded"]
    assert shielded.read() == "read"  # nothing pending is raised later either


def test_only_the_pools_own_handler_is_deferred(monkeypatch: pytest.MonkeyPatch) -> None:
    """Another SIGUSR1 handler (a solo worker's thread dump, a host process's log reopen) runs when it comes."""
    service = Service()
    heard: list[int] = []  # how many writes had finished when the handler ran
    before = signal.signal(signal.SIGUSR1, lambda _signum, _frame: heard.append(len(service.done)))
    monkeypatch.setattr(soft_limits, "_handler", None)
    monkeypatch.setattr(soft_limits, "_looked", False)
    try:
        soft_limits.install()
        shielded: Any = soft_limits.shielded(service)  # type: ignore[arg-type]
        shielded.write("x")
        assert heard == [0]  # inside the call, not after it
    finally:
        signal.signal(signal.SIGUSR1, before)


def test_a_process_looks_for_the_pools_handler_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """`install` runs before every job of ours: after the first, it costs nothing (no signal lookup)."""
    looked: list[None] = []
    monkeypatch.setattr(soft_limits, "_looked", False)
    monkeypatch.setattr(soft_limits, "soft_limit_handler", lambda: looked.append(None))
    for _ in range(3):
        soft_limits.install()
    assert looked == [None]
