"""The checks only `doctor` runs: who consumes the task tools' queues, push end to end, clock skew.

Each takes a loaded app and answers a `Verdict`; none raises. They go further
than `/readyz` (a broadcast to every worker, a listener of their own, a clock
comparison), which is why they belong to a command a person runs, not to a
probe that runs every few seconds.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import sqlalchemy as sa

from celery_mcp_tasks.model import TaskRecord, TaskStatus, now_ms
from celery_mcp_tasks.ops.probes import ProbeEngine, short_reason

if TYPE_CHECKING:
    from celery_mcp_tasks.app import McpTasks

__all__ = ["Level", "Verdict", "clock_check", "push_check", "tool_queues", "workers_check"]

Level = Literal["OK", "WARN", "FAIL", "SKIP"]

SKEW_WARN_S = 1.0
SKEW_FAIL_S = 30.0


@dataclass(frozen=True)
class Verdict:
    status: Level
    detail: str
    fix: str = ""


def tool_queues(tasks: McpTasks) -> dict[str, list[str]]:
    """{queue: [task tools sent to it]}, routed as `send_task` routes them (the job's options, task_routes)."""
    celery = tasks.celery
    queues: dict[str, list[str]] = {}
    for tool in sorted(tasks.tools.values(), key=lambda t: t.name):
        job = celery.tasks.get(tool.celery_name)
        options = {k: v for k, v in (job._get_exec_options() if job else {}).items() if v is not None}
        queue = celery.amqp.router.route(options, tool.celery_name, (), {}, job).get("queue")
        queues.setdefault(str(getattr(queue, "name", queue)), []).append(tool.name)
    return queues


def _worker_command(app_path: str, queues: list[str], default_queue: str) -> str:
    extra = "" if queues == [default_queue] else f" -Q {','.join(queues)}"
    return f"start a worker with this app's settings: `celery -A {app_path} worker{extra}`"


def workers_check(tasks: McpTasks, app_path: str, *, timeout_s: float) -> Verdict:
    """At least one worker consumes each tool queue (`inspect active_queues`) and has its tools registered."""
    needed = tool_queues(tasks)
    if not needed:
        return Verdict("SKIP", "the app declares no task tools")
    celery = tasks.celery
    default_queue = str(celery.conf.task_default_queue)
    tools = {tool.name: tool.celery_name for tool in tasks.tools.values()}
    try:
        active: dict[str, Any] = celery.control.inspect(timeout=timeout_s).active_queues() or {}
    except Exception as exc:  # noqa: BLE001
        return Verdict("FAIL", f"cannot ask the workers: {short_reason(exc)}", "check the broker (see above)")
    if not active:
        return Verdict(
            "FAIL",
            f"no worker answered within {timeout_s:g}s",
            _worker_command(app_path, sorted(needed), default_queue),
        )
    consumers = {
        queue: sorted(name for name, qs in active.items() if any(q.get("name") == queue for q in qs or ()))
        for queue in needed
    }
    idle = [queue for queue, names in consumers.items() if not names]
    if idle:
        queue = idle[0]
        return Verdict(
            "FAIL",
            f"{len(active)} worker(s) answered, none consumes queue {queue!r} (tools {', '.join(needed[queue])})",
            _worker_command(app_path, [queue], default_queue),
        )
    answering = sorted({name for names in consumers.values() for name in names})
    try:
        registered: dict[str, Any] = (
            celery.control.inspect(destination=answering, timeout=timeout_s, limit=len(answering)).registered() or {}
        )
    except Exception as exc:  # noqa: BLE001
        return Verdict("FAIL", f"cannot ask the workers: {short_reason(exc)}", "check the broker (see above)")
    warnings: list[str] = []
    for queue, names in consumers.items():
        for tool in needed[queue]:
            having = [name for name in names if tools[tool] in set(registered.get(name) or ())]
            if not having:
                return Verdict(
                    "FAIL",
                    f"no worker on queue {queue!r} has tool {tool!r} registered",
                    f"deploy this version of {app_path} to the workers on {queue!r} and restart them",
                )
            if len(having) < len(names):
                warnings.append(f"{len(names) - len(having)} worker(s) on {queue!r} lack {tool!r}")
    where = ", ".join(f"{queue!r}: {len(names)} worker(s)" for queue, names in consumers.items())
    if warnings:
        return Verdict(
            "WARN", f"{where}; {'; '.join(warnings)}", f"restart the stale workers with this version of {app_path}"
        )
    return Verdict("OK", f"{where}; every task tool registered")


def _probe_record(key: str) -> TaskRecord:
    """A hint's worth of a task that does not exist: listeners that hear it find no stream watching it."""
    at = now_ms()
    return TaskRecord(
        key=key,
        owner=None,
        tool="doctor",
        status=TaskStatus.WORKING,
        created_at=at,
        updated_at=at,
        ttl_ms=None,
        version=2,
    )


async def _deliver(listener: Any, hub: Any, publish: Callable[[TaskRecord], None], timeout_s: float) -> float | str:
    """Start `listener` as a web process does, publish one hint, and time its arrival (seconds), or say why not."""
    import anyio

    key = secrets.token_hex(32)
    watch = hub.watch([key])
    outcome: float | str = "the probe did not finish"
    async with anyio.create_task_group() as tg:
        tg.start_soon(listener.run)
        try:
            outcome = await _round_trip(listener, watch, key, publish, timeout_s)
        finally:
            watch.close()
            tg.cancel_scope.cancel()
    return outcome


async def _round_trip(
    listener: Any, watch: Any, key: str, publish: Callable[[TaskRecord], None], timeout_s: float
) -> float | str:
    import anyio
    import anyio.to_thread

    deadline = time.monotonic() + timeout_s
    with anyio.move_on_after(timeout_s):
        await listener.ready.wait()
    if not listener.ready.is_set():
        return f"the listener did not connect within {timeout_s:g}s"
    start = time.monotonic()
    try:
        await anyio.to_thread.run_sync(publish, _probe_record(key))
    except Exception as exc:  # noqa: BLE001
        return f"publishing the hint failed: {short_reason(exc)}"
    while time.monotonic() < deadline:
        taken = await watch.next(timeout=max(deadline - time.monotonic(), 0.01))
        if taken and key in taken:
            return time.monotonic() - start
    return f"the hint was published but not received within {timeout_s:g}s"


def push_check(tasks: McpTasks, probe: ProbeEngine, *, timeout_s: float) -> Verdict:
    """A hint published through the app's push transport reaches a listener like a web process's."""
    import anyio

    from celery_mcp_tasks.notify.hub import Hub

    mode = tasks.push.mode
    if mode == "off":
        return Verdict(
            "WARN",
            "push is off: listen streams only acknowledge, clients poll tasks/get",
            "unset MCP_TASKS_NOTIFY=off (or drop notifier=None) to push task changes",
        )
    if mode == "poll":
        if tasks.settings.notify == "poll" and (probe.postgres or not tasks.settings.embedded_broker):
            return Verdict(
                "WARN",
                "MCP_TASKS_NOTIFY=poll on a deployment that could push: streams read the store every 0.1 s",
                "unset MCP_TASKS_NOTIFY (auto picks PostgreSQL NOTIFY or the broker's fanout)",
            )
        return Verdict("SKIP", "poll mode (the embedded default): streams read row versions, nothing is published")
    hub = Hub()
    listener: Any
    publish: Callable[[TaskRecord], None]
    if mode == "postgres":
        from celery_mcp_tasks.notify.postgres import PgListener, PgNotifier

        listener = PgListener(tasks.settings.store_url, hub)
        publish = PgNotifier(lambda: probe.engine).task_changed  # pg_notify, as the store's write hook sends it
        fix = "let web processes LISTEN on the database (no PgBouncer in transaction mode), or MCP_TASKS_NOTIFY=broker"
    else:
        from celery_mcp_tasks.notify.broker import BrokerListener, BrokerPublisher, hint_exchange
        from celery_mcp_tasks.notify.push import BrokerAccess

        broker = BrokerAccess.of(tasks.celery)
        listener = BrokerListener(broker.connection, hint_exchange(broker.namespace), hub)
        publish = BrokerPublisher(broker.producer_pool, hint_exchange(broker.namespace)).task_changed
        fix = "check that the broker allows fanout exchanges and transient queues, or MCP_TASKS_NOTIFY=poll"
    quiet = logging.getLogger("celery_mcp_tasks.notify")
    level = quiet.level
    quiet.setLevel(logging.ERROR)  # the listener's reconnect warnings would interleave with the table
    try:
        outcome = anyio.run(_deliver, listener, hub, publish, timeout_s)
    except Exception as exc:  # noqa: BLE001
        outcome = short_reason(exc)
    finally:
        quiet.setLevel(level)
    if isinstance(outcome, str):
        return Verdict("FAIL", f"{mode}: {outcome}", fix)
    return Verdict("OK", f"{mode}: a hint published and received in {outcome * 1000:.0f} ms")


def clock_check(probe: ProbeEngine) -> Verdict:
    """This host's clock against the database's: heartbeats and TTLs compare times across hosts (the sweep
    ledger alone stamps and ages everything on the database's clock)."""
    if not probe.postgres:
        return Verdict("OK", "SQLite: the store is on this machine, one clock")

    def skew(conn: sa.Connection) -> tuple[float, float]:
        before = time.time()
        database = float(conn.execute(sa.text("SELECT extract(epoch FROM clock_timestamp())")).scalar_one())
        after = time.time()
        return database - (before + after) / 2, (after - before) / 2

    try:
        offset, uncertainty = probe.read(skew)
    except Exception as exc:  # noqa: BLE001
        return Verdict(
            "FAIL", f"cannot read the database's clock: {short_reason(exc)}", "check the database (see above)"
        )
    side = "behind" if offset > 0 else "ahead of"
    detail = f"this host is {abs(offset):.3f}s {side} the database (±{uncertainty:.3f}s)"
    if abs(offset) < 0.001:
        detail = f"this host and the database agree (±{uncertainty:.3f}s)"
    fix = "synchronize the clocks of this host and the database server (NTP, chrony)"
    if abs(offset) > SKEW_FAIL_S:
        return Verdict("FAIL", detail, fix)
    if abs(offset) > SKEW_WARN_S:
        return Verdict("WARN", detail, fix)
    return Verdict("OK", detail)
