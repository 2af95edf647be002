"""Fair queues: one principal's burst cannot starve another's jobs.

With MCP_TASKS_FAIR_QUEUES=N, a job sent to the default queue goes to one of its N shards
(`<queue>.fair0` ..), chosen by a hash of the task's owner (of its client for an anonymous caller counted
per client), and every worker consumes them all. Workers
take from their queues in turn, so a thousand queued jobs of one principal hold back another's next job
by about one job per shard in use. Free at send time (a hash) and in the store. A tool routed to a queue
of its own keeps it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection
from typing import Any

from kombu.entity import Exchange, Queue

from celery_mcp_tasks.model import owner_bytes
from celery_mcp_tasks.worker.celery_internals import exec_options


def shard_queue(queue: str, owner: str | None, shards: int, caller: str | None = None) -> str:
    """The shard of `queue` the owner's jobs go to; an anonymous one's by its client (`caller`, with
    MCP_TASKS_QUOTA_ANONYMOUS=per_client), as its quotas count."""
    who = owner_bytes(owner) if owner is not None or caller is None else owner_bytes(None) + caller.encode()
    digest = hashlib.sha256(who).digest()
    return f"{queue}.fair{int.from_bytes(digest[:8], 'big') % shards}"


def shard_queues(queue: str, shards: int) -> list[str]:
    return [f"{queue}.fair{index}" for index in range(shards)]


def unconsumed_shards(queue: str, consumed: Collection[str], shards: int) -> list[str]:
    """The shards of `queue` a worker consuming the queues `consumed` (its `-Q`) leaves out while it consumes
    `queue` itself: someone chose its queues and forgot the shards (none: it consumes all, or not `queue`)."""
    if queue not in consumed:
        return []
    return [name for name in shard_queues(queue, shards) if name not in consumed]


def routed_queue(celery: Any, celery_name: str) -> str | None:
    """The queue `send_task` routes a job to (its own options, `task_routes`, else the default queue); None for
    a route naming only an exchange and routing key (the broker's bindings decide)."""
    job = celery.tasks.get(celery_name)
    options = exec_options(job) if job else {}
    queue = celery.amqp.router.route(options, celery_name, (), {}, job).get("queue")
    return None if queue is None else str(getattr(queue, "name", queue))


def consume_shards(conf: Any, shards: int) -> None:
    """Declare the default queue's shards beside it in `task_queues`, so a `celery worker` without
    `-Q` consumes them all (a worker given `-Q` must name them too)."""
    default = str(conf.task_default_queue)
    queues = list(conf.task_queues or ())
    if not queues:
        exchange = Exchange(conf.task_default_exchange or default, type=conf.task_default_exchange_type or "direct")
        queues.append(Queue(default, exchange, routing_key=conf.task_default_routing_key or default))
    names = {queue.name for queue in queues}
    queues += [
        Queue(name, Exchange(name), routing_key=name) for name in shard_queues(default, shards) if name not in names
    ]
    conf.task_queues = queues
