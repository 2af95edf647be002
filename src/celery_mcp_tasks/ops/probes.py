"""The deployment's vital signs, each one bounded blocking call: what `/readyz` and `doctor` both ask.

Every probe returns a `Finding` and never raises, and gives up on its own within a few seconds (connect
and statement timeouts; on PostgreSQL, TCP keepalives and `tcp_user_timeout`), so a thread running it
comes back even when the database or the broker hangs. Details carry no URL, password or task id.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from celery_mcp_tasks.config import Settings
from celery_mcp_tasks.preflight import (
    NOT_CREATED,
    current_revisions,
    missing_sqlite_file,
    probe_engine,
    revision_problem,
    script_heads,
    short_reason,
)
from celery_mcp_tasks.store.engine import READ_ONLY, is_postgres

if TYPE_CHECKING:
    from celery_mcp_tasks.store.ledger import SweepRecord

Status = Literal["ok", "warn", "fail", "skipped"]

PROBE_TIMEOUT_S = 3  # how long one probe waits for the database or the broker

T = TypeVar("T")


@dataclass(frozen=True)
class Finding:
    status: Status
    detail: str


def _elapsed_ms(start: float) -> int:
    return round((time.monotonic() - start) * 1000)


def in_daemon_thread(work: Callable[[], T], *, name: str) -> Future[T]:
    """`work` in a daemon thread of its own, as a future: a probe that hangs past every timeout costs
    that one thread and never holds the interpreter's exit (a pool's threads are joined at exit)."""
    future: Future[T] = Future()

    def run() -> None:
        try:
            future.set_result(work())
        except BaseException as exc:  # noqa: BLE001 - handed to whoever waits on the future
            future.set_exception(exc)

    threading.Thread(target=run, name=name, daemon=True).start()
    return future


class ProbeEngine:
    """One pool-less engine per process for the probes: each probe is a fresh connection, which is what
    a new request would need, and a hung one never holds a pooled connection others wait for."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._engine: Engine | None = None
        self._pid: int | None = None
        self._lock = threading.Lock()

    @property
    def engine(self) -> Engine:
        with self._lock:  # checks run in parallel threads: one engine between them
            if self._engine is None or self._pid != os.getpid():
                self._engine = probe_engine(self.url, timeout_s=PROBE_TIMEOUT_S)
                self._pid = os.getpid()
            return self._engine

    @property
    def postgres(self) -> bool:
        return is_postgres(self.url)

    def read(self, work: Callable[[sa.Connection], Any]) -> Any:
        """Run `work` in a read-only transaction that the server ends after `PROBE_TIMEOUT_S` (a lock wait too)."""
        with self.engine.connect().execution_options(**{READ_ONLY: True}) as conn:
            if self.postgres:  # SET LOCAL, not a startup option: PgBouncer refuses `options`
                conn.execute(sa.text(f"SET LOCAL statement_timeout = {PROBE_TIMEOUT_S * 1000}"))
            try:
                return work(conn)
            finally:
                conn.rollback()


def store_probe(probe: ProbeEngine) -> Finding:
    """The store answers a `SELECT 1` on a new connection."""
    if missing_sqlite_file(probe.url):
        return Finding("fail", NOT_CREATED)
    start = time.monotonic()
    try:
        probe.read(lambda conn: conn.execute(sa.text("SELECT 1")).scalar())
    except Exception as exc:  # noqa: BLE001 - any failure is the answer
        return Finding("fail", f"cannot reach the task store: {short_reason(exc)}")
    return Finding("ok", f"reachable ({_elapsed_ms(start)} ms)")


def schema_probe(probe: ProbeEngine) -> Finding:
    """The store's migrations are at the package's head (the same verdict as the start-up check), but a store
    a newer release migrated is a warning: mid-upgrade this replica keeps serving until it is replaced (the
    migrations only add), and pulling every old replica out of rotation at once would be an outage."""
    if missing_sqlite_file(probe.url):
        return Finding("fail", NOT_CREATED)
    try:
        current = probe.read(current_revisions)
    except Exception as exc:  # noqa: BLE001
        return Finding("fail", f"cannot read the schema revision: {short_reason(exc)}")
    problem = revision_problem(current)
    if problem is not None:
        return Finding("warn" if set(current) - script_heads()[1] else "fail", problem)
    return Finding("ok", f"at head {', '.join(sorted(script_heads()[0]))}")


def broker_probe(celery: Any) -> Finding:
    """The Celery broker accepts a connection (one attempt, no retries); the embedded one: its folders
    exist once it has (the transport makes them when it connects)."""
    url = str(celery.conf.broker_url)
    scheme = url.split("://", 1)[0].lower()
    if scheme == "memory":
        return Finding("ok", "in-memory broker (this process only)")
    start = time.monotonic()
    timeout = {"socket_timeout": PROBE_TIMEOUT_S, "socket_connect_timeout": PROBE_TIMEOUT_S}
    conn = celery.connection_for_write(connect_timeout=PROBE_TIMEOUT_S, transport_options=timeout)
    try:
        conn.ensure_connection(max_retries=0)
    except Exception as exc:  # noqa: BLE001
        return Finding("fail", f"cannot reach the broker: {short_reason(exc)}")
    finally:
        conn.release()
    if scheme == "filesystem":
        from celery_mcp_tasks.worker.kombu_internals.filesystem_transport import FOLDER_OPTIONS

        options = dict(celery.conf.broker_transport_options or {})
        missing = [name for name in FOLDER_OPTIONS if options.get(name) and not Path(options[name]).is_dir()]
        if missing:
            return Finding("fail", f"the embedded broker's folder {options[missing[0]]} is missing")
        return Finding("ok", "embedded filesystem broker: folders present")
    return Finding("ok", f"{scheme} reachable ({_elapsed_ms(start)} ms)")


def janitor_probe(probe: ProbeEngine, settings: Settings, *, since_ms: int | None = None) -> Finding:
    """The janitor's last recorded sweep is recent: "warn" when it is stale (`janitor_stale`, the one definition;
    `since_ms`: when the caller started looking, so a fresh deployment has three intervals for its first sweep)."""
    interval = settings.janitor_interval_s
    if interval is None:
        return Finding("skipped", "no scheduled sweeps (MCP_TASKS_JANITOR_INTERVAL_S=off)")
    from celery_mcp_tasks.worker.janitor import janitor_age, janitor_stale

    if missing_sqlite_file(probe.url):
        return Finding("fail", NOT_CREATED)
    try:
        record = janitor_record(probe)
    except Exception as exc:  # noqa: BLE001
        return Finding("fail", f"cannot read the sweep ledger: {short_reason(exc)}")
    age = janitor_age(record)  # on the database's clock: the sweeper's and this host's may differ
    stale = janitor_stale(settings, record, since_ms=since_ms)
    every = f"expected every {interval:g}s"
    if age is None:
        return Finding("warn" if stale else "ok", f"no sweep recorded yet ({every})")
    if stale:
        return Finding("warn", f"stale: last sweep {_ago(age)} ago, {every}")
    return Finding("ok", f"last sweep {_ago(age)} ago ({every})")


def janitor_record(probe: ProbeEngine) -> SweepRecord | None:
    """The janitor's ledger row with the database's clock, read like every probe; `FileNotFoundError` for an
    embedded store never created (a connect would create it, empty)."""
    from celery_mcp_tasks.store.ledger import JANITOR
    from celery_mcp_tasks.store.sweeps import read_sweep

    if missing_sqlite_file(probe.url):
        raise FileNotFoundError(NOT_CREATED)
    return probe.read(lambda conn: read_sweep(conn, JANITOR))  # type: ignore[no-any-return]


def _ago(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"
