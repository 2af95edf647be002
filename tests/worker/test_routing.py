"""Which queue a task's job goes to, as the console shows it: the queue `send` routes the job to."""

from __future__ import annotations

from dataclasses import dataclass

from celery import Celery

from celery_mcp_tasks.worker.dispatch import CeleryDispatcher
from celery_mcp_tasks.worker.fairness import shard_queue
from tests.builders import record


@dataclass
class Tool:
    name: str
    celery_name: str
    terminate: bool = False


def test_the_queue_shown_is_the_one_the_job_is_sent_to() -> None:
    app = Celery("routing", broker="memory://")
    app.conf.task_default_queue = "jobs"
    app.conf.task_routes = {"t.routed": {"queue": "reports"}, "t.by_exchange": {"exchange": "x", "routing_key": "k"}}
    tools = {name: Tool(name, f"t.{name}") for name in ("plain", "routed", "by_exchange")}
    plain = CeleryDispatcher(app, tools)  # type: ignore[arg-type]
    fair = CeleryDispatcher(app, tools, fair_queues=4)  # type: ignore[arg-type]
    assert plain.queue_of(record(tool="plain")) == "jobs"
    assert plain.queue_of(record(tool="routed")) == "reports"
    assert plain.queue_of(record(tool="by_exchange")) is None  # the broker's bindings decide: not "None"
    owned = record(tool="plain", owner="sub:iss:alice")
    assert fair.queue_of(owned) == shard_queue("jobs", "sub:iss:alice", 4)  # the owner's shard, as `send` sends it
    assert fair.queue_of(record(tool="routed", owner="sub:iss:alice")) == "reports"  # a queue of its own is kept
