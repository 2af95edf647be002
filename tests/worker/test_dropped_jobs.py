"""The bridge's `task_unknown` handler: which app's service settles a dropped job (end to end with real worker
processes: tests/integration/test_rolling_upgrade.py)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from celery import Celery

from celery_mcp_tasks.model import Run
from celery_mcp_tasks.worker import bridge
from celery_mcp_tasks.worker.job import BORN_HEADER, DISPATCH_HEADER, KEY_HEADER


class Holder:
    """Stands for an `McpTasks`: `service` is the bound method the bridge keeps; the service says whether the
    dropped job's task was its own."""

    def __init__(self, owns: bool) -> None:
        self.owns = owns
        self.asked: list[tuple[str, Run, str]] = []

    def service(self) -> Any:
        return self

    def dropped(self, key: str, run: Run, *, tool: str) -> bool:
        self.asked.append((key, run, tool))
        return self.owns


def test_a_dropped_job_is_offered_to_each_app_on_the_celery_app_until_one_owns_it() -> None:
    app = Celery("shared", set_as_current=False)
    first, second, third = Holder(False), Holder(True), Holder(True)
    for holder in (first, second, third):
        bridge.install(app, holder.service)
    headers = {KEY_HEADER: "k" * 64, DISPATCH_HEADER: "2", BORN_HEADER: "7", "retries": 1, "shadow": "added"}
    bridge.on_unknown(sender=SimpleNamespace(app=app), message=SimpleNamespace(headers=headers), name="app.added")
    assert first.asked == second.asked == [("k" * 64, Run(2, 1, 7), "added")]
    assert third.asked == []  # the second one's task: settled there


def test_a_message_that_is_not_our_jobs_or_an_app_without_us_is_left_to_celery() -> None:
    app = Celery("ours", set_as_current=False)
    holder = Holder(True)
    bridge.install(app, holder.service)
    plain = SimpleNamespace(headers={"id": "x", "task": "app.plain"})  # a plain Celery task's message
    bridge.on_unknown(sender=SimpleNamespace(app=app), message=plain, name="app.plain")
    ours = SimpleNamespace(headers={KEY_HEADER: "k" * 64, DISPATCH_HEADER: "1"})
    bridge.on_unknown(sender=SimpleNamespace(app=Celery("other", set_as_current=False)), message=ours, name="x")
    bridge.on_unknown(sender=SimpleNamespace(app=[]), message=ours, name="x")  # not hashable: no app of ours
    assert holder.asked == []
