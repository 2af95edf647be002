"""Builders of domain values for unit tests."""

from __future__ import annotations

from collections.abc import Callable

from celery_mcp_tasks.model import TaskRecord, TaskStatus


def record(**changes: object) -> TaskRecord:
    """A working `TaskRecord` with plain defaults; keyword arguments override any field."""
    values: dict[str, object] = dict(
        key="k",
        owner=None,
        tool="t",
        status=TaskStatus.WORKING,
        created_at=1_000,
        updated_at=1_000,
        ttl_ms=60_000,
        poll_interval_ms=500,
    )
    values.update(changes)
    return TaskRecord(**values)  # type: ignore[arg-type]


class SendOnly:
    """A `service.Dispatcher` that hands every send to `sent` (e.g. a list's `append`) and never revokes."""

    def __init__(self, sent: Callable[[TaskRecord], object]) -> None:
        self.sent = sent

    def send(self, record: TaskRecord) -> None:
        self.sent(record)

    def revoke(self, record: TaskRecord) -> None:
        pass


class Clock:
    """A service clock a test moves by hand (`clock.now += ms`)."""

    def __init__(self) -> None:
        self.now = 100_000

    def __call__(self) -> int:
        return self.now
