"""A worker's metrics: its own and its prefork children's, served by the worker's main process.

A prefork child counts in its own memory, where no scrape could reach it; so a
`celery worker` counts in prometheus_client's multiprocess files instead, one
file per process in one directory, and its main process serves them all. When
the worker starts (`celeryd_init`: the main process, before the pool forks and
before any metric object exists) it takes PROMETHEUS_MULTIPROC_DIR if the
deployment set one, or makes a private directory, removed when the worker
stops. Once logging is set up (`celeryd_after_setup`, still before the fork) it
serves them on MCP_TASKS_WORKER_METRICS_PORT (`off`: no endpoint); a port in
use is one warning line and the worker runs on, unscraped. A child that exits
is marked dead: its live gauges go, its counters stay (totals never go back).
A private directory left by a worker that was killed is removed by the next
worker that starts on the host.

Only the `celery worker` command starts this (`celeryd_init` is its signal): an
in-process test worker or a web process never opens a port here.
"""

from __future__ import annotations

import glob
import logging
import os
import shutil
import tempfile
import threading
from typing import TYPE_CHECKING, Any

from celery import signals

from celery_mcp_tasks.ops.metrics import use_multiprocess

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

    from celery_mcp_tasks.app import McpTasks

__all__ = ["MULTIPROC_DIR", "PRIVATE_PREFIX", "WorkerExporter", "install", "remove_orphans"]

logger = logging.getLogger("celery_mcp_tasks.ops.metrics")

MULTIPROC_DIR = "PROMETHEUS_MULTIPROC_DIR"
PRIVATE_PREFIX = "celery-mcp-tasks-metrics-"
"""A private directory's name: this prefix, the worker's pid, a random tail."""


def remove_orphans(parent: str | None = None) -> list[str]:
    """Remove the private directories of workers that are gone (killed before they could clean up)."""
    removed: list[str] = []
    for path in glob.glob(os.path.join(parent or tempfile.gettempdir(), f"{PRIVATE_PREFIX}*-*")):
        owner = os.path.basename(path).removeprefix(PRIVATE_PREFIX).split("-", 1)[0]
        if not owner.isdigit() or _alive(int(owner)):
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


class WorkerExporter:
    """One worker's multiprocess directory and the HTTP endpoint that serves it."""

    def __init__(self, port: int | None, *, addr: str = "0.0.0.0") -> None:
        self.port = port
        self.addr = addr
        self.directory: str | None = None
        self.private = False
        self.server: WSGIServer | None = None
        self._thread: threading.Thread | None = None

    def prepare(self) -> None:
        """Decide how this worker counts: in files under one directory, before any child exists."""
        directory = os.environ.get(MULTIPROC_DIR)
        if not directory:
            if self.port is None:
                return  # no endpoint of ours and no directory of the deployment's: nothing would read files
            remove_orphans()
            directory = tempfile.mkdtemp(prefix=f"{PRIVATE_PREFIX}{os.getpid()}-")
            self.private = True
        os.makedirs(directory, exist_ok=True)
        self.directory = directory
        use_multiprocess(directory)

    def serve(self) -> None:
        """Serve every process's files on the port; one warning line when that cannot be done."""
        if self.port is None or self.directory is None or self.server is not None:
            return
        from prometheus_client import CollectorRegistry, start_http_server
        from prometheus_client.multiprocess import MultiProcessCollector

        registry = CollectorRegistry()
        MultiProcessCollector(registry, path=self.directory)  # type: ignore[no-untyped-call]
        try:
            self.server, self._thread = start_http_server(self.port, addr=self.addr, registry=registry)
        except OSError as exc:
            logger.warning(
                "celery-mcp-tasks: worker metrics port %d is not free (%s); this worker runs without its "
                "metrics endpoint (set MCP_TASKS_WORKER_METRICS_PORT to a free port, or off)",
                self.port,
                exc.strerror or type(exc).__name__,
            )
            return
        logger.info("celery-mcp-tasks: worker metrics on http://%s:%d/metrics", self.addr, self.port)

    def child_exited(self, pid: int) -> None:
        """A pool process ends: drop its live gauges (its counters stay in the directory)."""
        if self.directory is None:
            return
        from prometheus_client.multiprocess import mark_process_dead

        try:
            mark_process_dead(pid, self.directory)  # type: ignore[no-untyped-call]
        except OSError:
            logger.debug("metrics: could not clean up after process %d", pid, exc_info=True)

    def stop(self) -> None:
        """The worker stops: close the endpoint, remove a private directory."""
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None
        if self.private and self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)
            self.directory = None
            self.private = False


def install(tasks: McpTasks) -> None:
    """Connect the exporter to this app's `celery worker` (by signal; nothing happens at install)."""
    settings = tasks.settings
    # The embedded default is one machine (as `serve` binds 127.0.0.1); a deployment is scraped from afar.
    local = settings.database_url is None and settings.embedded_broker
    exporter = WorkerExporter(settings.worker_metrics_port, addr="127.0.0.1" if local else "0.0.0.0")

    def ours(instance: Any) -> bool:
        return getattr(instance, "app", None) is tasks.celery

    # Connected by call, as in worker/startup.py: Celery's signals are untyped.
    def _init(sender: Any = None, instance: Any = None, **_: Any) -> None:
        if ours(instance):
            exporter.prepare()

    def _after_setup(sender: Any = None, instance: Any = None, **_: Any) -> None:
        if ours(instance):
            exporter.serve()

    def _child_exit(sender: Any = None, pid: int | None = None, **_: Any) -> None:
        exporter.child_exited(pid if pid is not None else os.getpid())

    def _shutdown(sender: Any = None, **_: Any) -> None:
        if getattr(sender, "app", None) is tasks.celery:
            exporter.stop()

    signals.celeryd_init.connect(_init, weak=False)
    signals.celeryd_after_setup.connect(_after_setup, weak=False)
    signals.worker_process_shutdown.connect(_child_exit, weak=False)
    signals.worker_shutdown.connect(_shutdown, weak=False)
