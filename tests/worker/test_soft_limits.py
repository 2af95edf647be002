"""A soft time limit waits for the store call in flight (`worker.soft_limits`); the end-to-end case, a job
reporting without pause past its limit on real workers: tests/worker/test_job_flows.py."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from types import FrameType
from typing import Any

import pytest

from celery_mcp_tasks.worker import soft_limits


class LimitReached(Exception):
    pass


@pytest.fixture
def pool_handler(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """SIGUSR1 handled as a prefork pool process handles it: raise the limit wherever the thread is."""

    def raise_limit(_signum: int, _frame: FrameType | None) -> None:
        raise LimitReached()

    before = signal.signal(signal.SIGUSR1, raise_limit)
    monkeypatch.setattr(soft_limits, "_handler", None)
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


def test_the_limit_is_raised_as_the_store_call_returns_not_inside_it(pool_handler: None) -> None:
    service = Service()
    shielded: Any = soft_limits.shielded(service)  # type: ignore[arg-type]
    with pytest.raises(LimitReached):
        shielded.write("progress")
    assert service.done == ["progress"]
    assert shielded.name == "service"  # attributes pass through
    with pytest.raises(LimitReached):
        service.write("unshielded")  # outside a shielded call the limit lands where it lands
    assert service.done == ["progress"]
