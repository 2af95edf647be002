"""`celery-mcp-tasks doctor APP`: is this deployment able to run tasks, and if not, what to do.

One row per check, OK / WARN / FAIL (SKIP when a check it depends on failed),
each FAIL with the one-line fix. It runs where a person runs it, with the
app's own settings (the same environment as the web process and workers):

    config    the app loads and its settings validate
    database  the store answers
    schema    the store is migrated to the package's head
    broker    the Celery broker accepts a connection
    workers   a worker consumes every queue the task tools go to, with those tools registered
    janitor   the janitor swept within three intervals (the sweep ledger)
    push      a hint published through the push transport comes back to a listener
    clock     this host's clock agrees with the database's

Each check has a deadline of its own, so a hung database or broker makes a FAIL,
never a doctor that hangs. Exit status 1 when any check fails. URLs are shown with
their password replaced by `***`, and no task id is ever read.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import IO, TYPE_CHECKING

from sqlalchemy.engine import make_url

from celery_mcp_tasks.config import ConfigError, redact_url
from celery_mcp_tasks.ops.doctor_checks import Level, Verdict, clock_check, push_check, workers_check
from celery_mcp_tasks.ops.probes import Finding, ProbeEngine, broker_probe, janitor_probe, schema_probe, store_probe

if TYPE_CHECKING:
    from celery_mcp_tasks.app import McpTasks

__all__ = ["Row", "diagnose", "doctor", "render"]

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
    """`work` in a daemon thread: a check stuck past its deadline is a FAIL and never holds the exit."""
    outcome: list[Verdict] = []

    def run() -> None:
        try:
            outcome.append(work())
        except Exception as exc:  # noqa: BLE001 - a check that raises is a failed check
            outcome.append(Verdict("FAIL", f"the check raised {type(exc).__name__}: {str(exc)[:200]}"))

    thread = threading.Thread(target=run, name="mcp-tasks-doctor", daemon=True)
    thread.start()
    thread.join(deadline_s)
    if not outcome:
        return Verdict("FAIL", f"timed out after {deadline_s:g}s (the service hangs)")
    return outcome[0]


_LEVELS: dict[str, Level] = {"ok": "OK", "warn": "WARN", "fail": "FAIL", "skipped": "SKIP"}


def _from_finding(finding: Finding, fix: str) -> Verdict:
    status = _LEVELS[finding.status]
    return Verdict(status, finding.detail, fix if status == "FAIL" else "")


def _load(app_path: str) -> tuple[McpTasks | None, Verdict]:
    """The app, and the configuration row: an app that does not load is the first FAIL, not a traceback."""
    from celery_mcp_tasks.cli import load_app
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
    tools = sorted(tasks.tools)
    where = f"store {redact_url(tasks.settings.store_url)}, broker {redact_url(str(tasks.celery.conf.broker_url))}"
    if not tools:
        return tasks, Verdict("WARN", f"{app_path} loads but declares no task tools; {where}", "")
    return tasks, Verdict("OK", f"{len(tools)} task tool(s) ({', '.join(tools)}); {where}")


def _janitor_fix(tasks: McpTasks, app_path: str) -> str:
    if tasks.settings.janitor == "worker":
        return f"start a worker (`celery -A {app_path} worker`): with MCP_TASKS_JANITOR=worker the workers sweep"
    from celery_mcp_tasks.ops.janitor_watch import FIX

    return FIX.replace("APP", app_path)


def _janitor(tasks: McpTasks, probe: ProbeEngine, app_path: str) -> Verdict:
    finding = janitor_probe(probe, tasks.settings)
    if finding.status == "skipped":
        return Verdict(
            "WARN",
            finding.detail + ": expired tasks stay and lost jobs are never settled",
            "set MCP_TASKS_JANITOR_INTERVAL_S (default 60) or run `tasks.sweep()` on a schedule of your own",
        )
    if finding.status == "warn":  # never swept, or stale: nothing evicts or reaps
        return Verdict("FAIL", finding.detail, _janitor_fix(tasks, app_path))
    return _from_finding(finding, "check the database (see above)")


def diagnose(app_path: str, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> list[Row]:
    """Every check's row, in order; dependent checks SKIP when what they need failed."""
    tasks, config = _load(app_path)
    rows = [Row("config", config.status, config.detail, config.fix)]
    names = ("database", "schema", "broker", "workers", "janitor", "push", "clock")
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
    push_needs = {"postgres": ("database",), "broker": ("broker",)}.get(tasks.push.mode, ())
    check("push", push_needs, lambda: push_check(tasks, probe, timeout_s=timeout_s))
    check("clock", ("database",), lambda: clock_check(probe))
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
        worst = (
            "fail"
            if any(r.status == "FAIL" for r in rows)
            else "warn"
            if any(r.status == "WARN" for r in rows)
            else "ok"
        )
        out.write(json.dumps({"status": worst, "checks": [asdict(row) for row in rows]}, indent=2) + "\n")
        return
    if out.isatty():
        _rich_table(rows, out)
        return
    width = max(len(row.name) for row in rows)
    out.write(f"{'CHECK'.ljust(width)}  STATUS  DETAIL\n")
    for row in rows:
        out.write(f"{row.name.ljust(width)}  {row.status.ljust(6)}  {row.detail}\n")
        if row.fix:
            out.write(f"{' ' * width}          fix: {row.fix}\n")


_STYLES = {"OK": "green", "WARN": "yellow", "FAIL": "bold red", "SKIP": "dim"}


def _rich_table(rows: Sequence[Row], out: IO[str]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(show_lines=False)
    table.add_column("check")
    table.add_column("status")
    table.add_column("detail / fix", overflow="fold")
    for row in rows:
        text = _escape(row.detail) + (f"\n[bold]fix:[/bold] {_escape(row.fix)}" if row.fix else "")
        table.add_row(row.name, f"[{_STYLES.get(row.status, '')}]{row.status}[/]", text)
    Console(file=out, highlight=False).print(table)


def _escape(text: str) -> str:
    from rich.markup import escape

    return escape(text)


def doctor(app_path: str, *, json_output: bool = False, timeout_s: float = DEFAULT_TIMEOUT_S) -> int:
    """Run every check, show the table, and answer the exit status (1 on any FAIL)."""
    rows = diagnose(app_path, timeout_s=timeout_s)
    render(rows, json_output=json_output)
    return 1 if any(row.status == "FAIL" for row in rows) else 0
