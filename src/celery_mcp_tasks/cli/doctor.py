"""`celery-mcp-tasks doctor APP`: is this deployment able to run tasks, and if not, what to do.

One row per check (OK / WARN / FAIL, SKIP when a check it needs failed), each FAIL with its fix, each
check under a deadline of its own. URLs are shown with their password replaced by `***`; no task id is read.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import secrets
import sys
import time
import warnings as py_warnings
from collections.abc import Callable, Sequence
from concurrent.futures import wait
from dataclasses import asdict, dataclass
from typing import IO, TYPE_CHECKING, Any, Literal

from sqlalchemy.engine import make_url

from celery_mcp_tasks.cli.shared import celery_target, load_app, tool_queues
from celery_mcp_tasks.config import ConfigError, redact_url, unknown_settings
from celery_mcp_tasks.model import TaskRecord, TaskStatus, now_ms
from celery_mcp_tasks.ops.probes import (
    Finding,
    ProbeEngine,
    broker_probe,
    in_daemon_thread,
    janitor_probe,
    schema_probe,
    store_probe,
)
from celery_mcp_tasks.preflight import SKEW_WARN_S, clock_offset, short_reason
from celery_mcp_tasks.worker.fairness import routed_queue, shard_queues

if TYPE_CHECKING:
    from celery_mcp_tasks.app import Internals, McpTasks

# The checks below go further than `/readyz` (a broadcast to every worker, a listener of their own, a
# clock comparison): a command a person runs, not a probe every few seconds. None raises.

Level = Literal["OK", "WARN", "FAIL", "SKIP"]

SKEW_FAIL_S = 30.0


@dataclass(frozen=True)
class Verdict:
    status: Level
    detail: str
    fix: str = ""


def _internals(tasks: McpTasks) -> Internals:
    from celery_mcp_tasks.app import internals  # loaded with the app: a broken install is a FAIL row, not a traceback

    return internals(tasks)


def _worker_command(app_path: str, queues: list[str], default_queue: str) -> str:
    extra = "" if queues == [default_queue] else f" -Q {','.join(queues)}"
    return f"start a worker with this app's settings: `celery -A {app_path} worker{extra}`"


def workers_check(tasks: McpTasks, app_path: str, *, timeout_s: float) -> Verdict:
    """At least one worker consumes each tool queue (`inspect active_queues`) and has its tools registered.

    Workers answering to one node name (two `celery@host` on a host) hide each other's replies, so what
    they consume cannot be told: a WARN saying so, with the fix, in place of Celery's warning on stderr."""
    from celery.exceptions import DuplicateNodenameWarning

    with py_warnings.catch_warnings(record=True) as caught:
        py_warnings.simplefilter("always", DuplicateNodenameWarning)
        verdict = _consumers_check(tasks, app_path, timeout_s=timeout_s)
    shared = [str(w.message).splitlines()[0] for w in caught if issubclass(w.category, DuplicateNodenameWarning)]
    for other in (w for w in caught if not issubclass(w.category, DuplicateNodenameWarning)):
        py_warnings.showwarning(other.message, other.category, other.filename, other.lineno)
    if not shared:
        return verdict
    # Which reply was kept is chance, so no verdict drawn from them holds: the same WARN every time.
    detail = f"workers share a node name, so their replies hide each other and what they consume cannot be told ({shared[0]})"
    fix = f"give each worker a node name of its own: `celery -A {app_path} worker -n NAME@%h`"
    return Verdict("WARN", detail, fix)


def _janitor_queue(tasks: McpTasks) -> str | None:
    """The queue beat sends the janitor to (routed as Celery routes it), when beat sends it; else None (also for
    a route naming only an exchange: no queue to check)."""
    from celery_mcp_tasks.worker.janitor import JANITOR_TASK

    if tasks.settings.janitor != "beat" or tasks.settings.janitor_interval_s is None:
        return None
    return routed_queue(tasks.celery, JANITOR_TASK)


def _consumers_check(tasks: McpTasks, app_path: str, *, timeout_s: float) -> Verdict:
    needed = tool_queues(tasks)
    if not needed:
        if _internals(tasks).tools:
            return Verdict("SKIP", "the task tools are routed by exchange alone: no queue to check")
        return Verdict("SKIP", "the app declares no task tools")
    celery = tasks.celery
    default_queue = str(celery.conf.task_default_queue)
    tools = {tool.name: tool.celery_name for tool in _internals(tasks).tools.values()}
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
        fair = tasks.settings.fair_queues
        shards = set(shard_queues(default_queue, fair)) if fair is not None else set()
        others = [queue for queue in idle if queue not in shards]
        fixes = [_worker_command(app_path, others, default_queue)] if others else []
        if len(others) < len(idle):  # some are shards
            every = ",".join([default_queue, *shard_queues(default_queue, fair or 0)])
            fixes.append(
                f"give the workers MCP_TASKS_FAIR_QUEUES={fair}, as here, and a worker started with -Q the shards too"
                f" (-Q {every}): a worker consumes the shards its own setting names, and jobs sent to a shard no"
                " worker consumes wait until the janitor fails them as lost"
            )
        fix = "; and ".join(fixes)
        unconsumed = "; ".join(f"{queue!r} (tools {', '.join(needed[queue])})" for queue in idle)
        said = f"{len(active)} worker(s) answered, none consumes queue{'s' if len(idle) > 1 else ''} {unconsumed}"
        return Verdict("FAIL", said, fix)
    sweeps = _janitor_queue(tasks)
    if sweeps is not None and not any(q.get("name") == sweeps for qs in active.values() for q in qs or ()):
        return Verdict(
            "FAIL",
            f"no worker consumes queue {sweeps!r}, where beat sends the janitor: nothing re-sends lost jobs, fails "
            "unanswered questions or removes expired tasks",
            f"add {sweeps!r} to a worker's -Q (`celery -A {app_path} worker -Q {','.join([*sorted(needed), sweeps])}`),"
            " or set MCP_TASKS_JANITOR=worker to sweep inside the workers",
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
                    f"make the workers on {queue!r} import {app_path} (in -A, or the Celery app's include=[...]), "
                    "with this version of it, and restart them",
                )
            if len(having) < len(names):
                warnings.append(f"{len(names) - len(having)} worker(s) on {queue!r} lack {tool!r}")
    where = ", ".join(f"{queue!r}: {len(names)} worker(s)" for queue, names in consumers.items())
    if warnings:
        return Verdict(
            "WARN", f"{where}; {'; '.join(warnings)}", f"restart the stale workers with this version of {app_path}"
        )
    return Verdict("OK", f"{where}; every task tool registered")


async def _deliver(listener: Any, hub: Any, publish: Callable[[TaskRecord], None], timeout_s: float) -> float | str:
    """Start `listener` as a web process does, publish one hint, and time its arrival (seconds), or say why not."""
    import anyio
    import anyio.to_thread

    key = secrets.token_hex(32)  # a task that does not exist: listeners that hear it find no stream watching it
    at = now_ms()
    record = TaskRecord(
        key=key,
        owner=None,
        tool="doctor",
        status=TaskStatus.WORKING,
        created_at=at,
        updated_at=at,
        ttl_ms=None,
        version=2,
    )
    # Watched before the listener starts: a PostgreSQL listener LISTENs only while the hub follows a row.
    watch = hub.watch([key])
    async with anyio.create_task_group() as tg:
        tg.start_soon(listener.run)
        try:
            deadline = time.monotonic() + timeout_s
            with anyio.move_on_after(timeout_s):
                await listener.ready.wait()
            if not listener.ready.is_set():
                return f"the listener did not connect within {timeout_s:g}s"
            await watch.next(0)  # a listener that starts listening asks every watch to re-read: not the probe's hint
            start = time.monotonic()
            try:
                await anyio.to_thread.run_sync(publish, record)
            except Exception as exc:  # noqa: BLE001
                return f"publishing the hint failed: {short_reason(exc)}"
            while time.monotonic() < deadline:
                taken = await watch.next(timeout=max(deadline - time.monotonic(), 0.01))
                if taken and taken.get(key) is not None:  # the probe's hint (a re-read request carries no version)
                    return time.monotonic() - start
            return f"the hint was published but not received within {timeout_s:g}s"
        finally:
            watch.close()
            tg.cancel_scope.cancel()
    return "the probe did not finish"


def push_check(tasks: McpTasks, probe: ProbeEngine, *, timeout_s: float) -> Verdict:
    """A hint published through the app's push transport reaches a listener like a web process's."""
    import anyio

    from celery_mcp_tasks.notify.hub import Hub

    mode = _internals(tasks).push.mode
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

    try:
        offset, uncertainty = probe.read(clock_offset)
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


_RING_FIX = (
    "set MCP_TASKS_ENCRYPTION_KEYS to the ring the web processes and workers use (the newest key first), "
    "the same on every process"
)


def encryption_check(tasks: McpTasks, probe: ProbeEngine) -> Verdict:
    """This process's key ring against the store: it opens the newest sealed rows (as every process checks at
    start), and how many rows each key sealed, so a retired key still in use and a pending `db reencrypt`
    show before a client meets them."""
    from celery_mcp_tasks.store.rekeying import ring_check, sealed_census

    ring = tasks.settings.key_ring()
    try:
        problem, census = probe.read(lambda conn: (ring_check(conn, ring), sealed_census(conn)))
    except Exception as exc:  # noqa: BLE001
        return Verdict("FAIL", f"cannot read the task store: {short_reason(exc)}", "check the database (see above)")
    if problem is not None:
        return Verdict("FAIL", problem, _RING_FIX)
    clear = census.pop(None, 0)
    if ring is None:
        return Verdict("OK", f"off: {clear} task(s) stored in clear (set MCP_TASKS_ENCRYPTION_KEYS to seal payloads)")
    first = ring.primary_id
    retired = {key_id: rows for key_id, rows in census.items() if key_id not in ring.key_ids}
    older = sum(rows for key_id, rows in census.items() if key_id != first and key_id not in retired)
    if retired:
        keys = ", ".join(f"{key_id} ({rows})" for key_id, rows in sorted(retired.items()))
        return Verdict(
            "WARN",
            f"{sum(retired.values())} task(s) sealed with a key not in the ring read as failed: key {keys}",
            "put that key back in MCP_TASKS_ENCRYPTION_KEYS (after the first) on every process, then run "
            "`celery-mcp-tasks db reencrypt` before retiring it",
        )
    detail = f"on: {census.get(first, 0)} task(s) sealed with key {first}, the first of {len(ring.key_ids)}"
    if older or clear:
        return Verdict(
            "WARN",
            f"{detail}; {older} sealed with an older key, {clear} in clear",
            "run `celery-mcp-tasks db reencrypt` with this ring (then an older key can be retired)",
        )
    return Verdict("OK", detail)


# -- the report -----------------------------------------------------------------------------

DEFAULT_TIMEOUT_S = 3.0
_CHECK_DEADLINE_FLOOR_S = 10.0
_SCHEMA_FIX = "run `celery-mcp-tasks db upgrade` (or upgrade celery-mcp-tasks if a newer release migrated the store)"


@dataclass(frozen=True)
class Row:
    name: str
    status: str
    detail: str
    fix: str = ""


def _with_deadline(work: Callable[[], Verdict], deadline_s: float) -> Verdict:
    """`work` in a daemon thread (`in_daemon_thread`): a check stuck past its deadline is a FAIL and never
    holds the exit; a check that raises is a failed check."""
    future = in_daemon_thread(work, name="mcp-tasks-doctor")
    if not wait([future], timeout=deadline_s).done:
        return Verdict("FAIL", f"timed out after {deadline_s:g}s (the service hangs)")
    exc = future.exception()
    if exc is not None:
        return Verdict("FAIL", f"the check raised {type(exc).__name__}: {str(exc)[:200]}")
    return future.result()


_LEVELS: dict[str, Level] = {"ok": "OK", "warn": "WARN", "fail": "FAIL", "skipped": "SKIP"}


def _from_finding(finding: Finding, fix: str) -> Verdict:
    status = _LEVELS[finding.status]
    return Verdict(status, finding.detail, fix if status == "FAIL" else "")


def _load(app_path: str) -> tuple[McpTasks | None, Verdict]:
    """The app, and the configuration row: an app that does not load is the first FAIL, not a traceback."""
    from celery_mcp_tasks.preflight import shared_store_problem

    try:
        tasks = load_app(app_path)
    except SystemExit as exc:
        detail = str(exc.code).removeprefix("celery-mcp-tasks: ")
        return None, Verdict("FAIL", detail, "fix what the message names, then run doctor again")
    except ConfigError as exc:
        return None, Verdict("FAIL", f"configuration error: {exc}", "fix the setting the message names")
    except Exception as exc:  # noqa: BLE001 - the user's module raised while importing
        detail = f"importing {app_path} raised {type(exc).__name__}: {str(exc)[:200]}"
        return None, Verdict(
            "FAIL", detail, f"fix the module (`python -c 'import {app_path.partition(':')[0]}'` shows where)"
        )
    problem = shared_store_problem(tasks.settings, "process", str(tasks.celery.conf.broker_url))
    if problem is not None:
        return tasks, Verdict("FAIL", problem, "set MCP_TASKS_DATABASE_URL to the database every process shares")
    try:  # what `serve` and the worker warn about, or refuse with MCP_TASKS_STRICT_SETTINGS on
        unknown = unknown_settings(os.environ)
    except ConfigError as exc:
        return tasks, Verdict("FAIL", f"configuration error: {exc}", "fix the setting the message names")
    tools = sorted(_internals(tasks).tools)
    where = f"store {redact_url(tasks.settings.store_url)}, broker {redact_url(str(tasks.celery.conf.broker_url))}"
    found = list(unknown)
    try:  # what `dev` refuses: a worker started as the docs say would not start
        celery_target(app_path, tasks)
    except SystemExit as exc:
        found.append(str(exc.code).removeprefix("celery-mcp-tasks: "))
    if not tools:
        found.append(f"{app_path} loads but declares no task tools")
    if found:
        return tasks, Verdict("WARN", f"{'; '.join(found)}; {where}", "")
    return tasks, Verdict("OK", f"{len(tools)} task tool(s) ({', '.join(tools)}); {where}")


def _janitor_fix(tasks: McpTasks, app_path: str) -> str:
    if tasks.settings.janitor == "worker":
        return f"start a worker (`celery -A {app_path} worker`): with MCP_TASKS_JANITOR=worker the workers sweep"
    from celery_mcp_tasks.worker.janitor import FIX

    return FIX.replace("APP", app_path)


def _janitor(tasks: McpTasks, probe: ProbeEngine, app_path: str) -> Verdict:
    finding = janitor_probe(probe, tasks.settings)
    if finding.status == "skipped":
        return Verdict(
            "WARN",
            finding.detail + ": expired tasks stay and lost jobs are never settled",
            "set MCP_TASKS_JANITOR_INTERVAL_S (default 60), or send the `celery_mcp_tasks.janitor` task"
            " on a schedule of your own",
        )
    if finding.status == "warn" and finding.detail.startswith("no sweep recorded yet"):
        # A deployment started less than an interval ago has not swept yet: say when to expect
        # it (as /readyz does not call it stale then either), and what to do if that has passed.
        every = tasks.settings.janitor_interval_s
        return Verdict(
            "WARN",
            f"{finding.detail}: the first sweep comes about {every:g}s after the sweeper starts",
            f"if beat (or a worker, with MCP_TASKS_JANITOR=worker) has run longer than that: {_janitor_fix(tasks, app_path)}",
        )
    if finding.status == "warn":  # stale: nothing evicts or reaps
        return Verdict("FAIL", finding.detail, _janitor_fix(tasks, app_path))
    return _from_finding(finding, "check the database (see above)")


def diagnose(app_path: str, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> list[Row]:
    """Every check's row, in order; dependent checks SKIP when what they need failed."""
    tasks, config = _load(app_path)
    rows = [Row("config", config.status, config.detail, config.fix)]
    names = ("database", "schema", "broker", "workers", "janitor", "push", "clock", "encryption")
    if tasks is None:
        env_urls = [os.environ.get(name, "") for name in ("MCP_TASKS_DATABASE_URL", "CELERY_BROKER_URL")]
        return _redacted(rows + [Row(name, "SKIP", "the app did not load") for name in names], env_urls)
    settings = tasks.settings
    store_url = redact_url(settings.store_url)
    broker_url = redact_url(str(tasks.celery.conf.broker_url))
    probe = ProbeEngine(settings.store_url)
    deadline = max(_CHECK_DEADLINE_FLOOR_S, timeout_s * 3)
    verdicts: dict[str, Verdict] = {}

    def check(name: str, needs: Sequence[str], work: Callable[[], Verdict]) -> None:
        missing = [need for need in needs if verdicts.get(need, Verdict("OK", "")).status == "FAIL"]
        if config.status == "FAIL":
            missing.insert(0, "config")
        if missing:
            verdicts[name] = Verdict("SKIP", f"needs {' and '.join(missing)}")
        else:
            verdicts[name] = _with_deadline(work, deadline)

    db_fix = f"start the database or fix MCP_TASKS_DATABASE_URL (now {store_url})"
    if settings.database_url is None or store_url.startswith("sqlite"):
        db_fix = "run `celery-mcp-tasks db upgrade` (it creates the store) or fix MCP_TASKS_DATABASE_URL"
    check("database", (), lambda: _from_finding(store_probe(probe), db_fix))
    check("schema", ("database",), lambda: _from_finding(schema_probe(probe), _SCHEMA_FIX))
    broker_fix = f"start the broker or fix CELERY_BROKER_URL (now {broker_url})"
    check("broker", (), lambda: _from_finding(broker_probe(tasks.celery), broker_fix))
    check("workers", ("broker",), lambda: workers_check(tasks, app_path, timeout_s=timeout_s))
    check("janitor", ("database", "schema"), lambda: _janitor(tasks, probe, app_path))
    push_needs = {"postgres": ("database",), "broker": ("broker",)}.get(_internals(tasks).push.mode, ())
    check("push", push_needs, lambda: push_check(tasks, probe, timeout_s=timeout_s))
    check("clock", ("database",), lambda: clock_check(probe))
    check("encryption", ("database", "schema"), lambda: encryption_check(tasks, probe))
    rows += [Row(name, v.status, v.detail, v.fix) for name, v in verdicts.items()]
    return _redacted(rows, [settings.store_url, str(tasks.celery.conf.broker_url)])


def _redacted(rows: list[Row], urls: Sequence[str]) -> list[Row]:
    """Belt and braces: no password from the app's URLs survives in any detail a driver worded."""
    secrets: list[str] = []
    for url in urls:
        try:
            password = make_url(url).password
        except Exception:  # noqa: BLE001 - a broker URL list, or not RFC-1738: nothing to look for
            password = None
        if password:
            secrets.append(str(password))

    def scrub(text: str) -> str:
        for secret in secrets:
            text = text.replace(secret, "***")
        return text

    return [Row(row.name, row.status, scrub(row.detail), scrub(row.fix)) for row in rows]


def render(rows: Sequence[Row], *, json_output: bool = False, stream: IO[str] | None = None) -> None:
    """A rich table on a terminal, aligned plain text otherwise, or one JSON document."""
    out = stream or sys.stdout
    if json_output:
        statuses = {row.status for row in rows}
        worst = "fail" if "FAIL" in statuses else "warn" if "WARN" in statuses else "ok"
        out.write(json.dumps({"status": worst, "checks": [asdict(row) for row in rows]}, indent=2) + "\n")
    elif out.isatty():
        from rich.console import Console
        from rich.markup import escape
        from rich.table import Table

        table = Table(show_lines=False)
        table.add_column("check")
        table.add_column("status")
        table.add_column("detail / fix", overflow="fold")
        for row in rows:
            text = escape(row.detail) + (f"\n[bold]fix:[/bold] {escape(row.fix)}" if row.fix else "")
            table.add_row(row.name, f"[{_STYLES.get(row.status, '')}]{row.status}[/]", text)
        Console(file=out, highlight=False).print(table)
    else:
        width = max(len(row.name) for row in rows)
        out.write(f"{'CHECK'.ljust(width)}  STATUS  DETAIL\n")
        for row in rows:
            out.write(f"{row.name.ljust(width)}  {row.status.ljust(6)}  {row.detail}\n")
            if row.fix:
                out.write(f"{' ' * width}          fix: {row.fix}\n")


_STYLES = {"OK": "green", "WARN": "yellow", "FAIL": "bold red", "SKIP": "dim"}


def doctor(app_path: str, *, json_output: bool = False, timeout_s: float = DEFAULT_TIMEOUT_S) -> int:
    """Run every check, show the table, and answer the exit status (1 on any FAIL)."""
    rows = diagnose(app_path, timeout_s=timeout_s)
    render(rows, json_output=json_output)
    return 1 if any(row.status == "FAIL" for row in rows) else 0


def run(args: argparse.Namespace) -> int:
    return doctor(args.app, json_output=args.json_output, timeout_s=args.timeout)
