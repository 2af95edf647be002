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

Why a child folds its files at exit: prometheus_client keeps a dead process's
counter and histogram files for ever, and every scrape reads every file, so
with `--max-tasks-per-child` (a new child every few tasks) the directory and
the scrape's cost would grow for the worker's whole life. In a private
directory (ours alone) an exiting child adds its counts into one `*_merged.db`
file per type and removes its own, under a lock the endpoint also takes, so a
scrape sees the child's counts exactly once, before or after. A deployment's
PROMETHEUS_MULTIPROC_DIR may have readers of its own: it is left as
prometheus_client writes it.

Only the `celery worker` command starts this (`celeryd_init` is its signal): an
in-process test worker or a web process never opens a port here.
"""

from __future__ import annotations

import contextlib
import glob
import logging
import os
import shutil
import tempfile
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, cast

from celery import signals

from celery_mcp_tasks.ops.metrics import use_multiprocess

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

    from prometheus_client.registry import Collector

__all__ = ["MERGED", "MULTIPROC_DIR", "PRIVATE_PREFIX", "WorkerExporter", "fold_files", "install", "remove_orphans"]

logger = logging.getLogger("celery_mcp_tasks.ops.metrics")

MULTIPROC_DIR = "PROMETHEUS_MULTIPROC_DIR"
PRIVATE_PREFIX = "celery-mcp-tasks-metrics-"
"""A private directory's name: this prefix, the worker's pid, a random tail."""
MERGED = "merged"
"""`counter_merged.db`, ...: the counts of the children that exited (the collector reads any `TYPE_*.db`)."""
_ADDITIVE = ("counter", "histogram", "summary")  # values that sum across processes (gauges are per process)
_LOCK_FILE = ".fold.lock"  # not `*.db`: the collector never reads it


@contextlib.contextmanager
def _locked(directory: str, *, exclusive: bool) -> Iterator[None]:
    """The directory's fold lock: a fold is exclusive, a scrape shares it with other scrapes."""
    import fcntl

    with open(os.path.join(directory, _LOCK_FILE), "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def fold_files(directory: str, pid: int) -> int:
    """Add process `pid`'s counter, histogram and summary files into the `*_merged.db` ones; how many went.

    The merged file is written beside, under a name no reader globs, and
    replaces the old one before the process's own file is removed, all under
    the lock: a scrape (which holds it too) sees the counts once.
    """
    from prometheus_client.mmap_dict import MmapedDict

    folded = 0
    with _locked(directory, exclusive=True):
        for kind in _ADDITIVE:
            own = os.path.join(directory, f"{kind}_{pid}.db")
            if not os.path.exists(own):
                continue
            merged = os.path.join(directory, f"{kind}_{MERGED}.db")
            totals: dict[str, float] = {}
            for path in (merged, own):
                if os.path.exists(path):
                    for key, value, _timestamp, _pos in MmapedDict.read_all_values_from_file(path):  # type: ignore[no-untyped-call]
                        totals[key] = totals.get(key, 0.0) + value
            partial = f"{merged}.partial"
            with contextlib.suppress(FileNotFoundError):
                os.unlink(partial)  # left by a fold that was killed: never reopen (and add to) it
            out = MmapedDict(partial)  # type: ignore[no-untyped-call]
            try:
                for key, value in totals.items():
                    out.write_value(key, value, 0.0)  # type: ignore[no-untyped-call]
            finally:
                out.close()  # type: ignore[no-untyped-call]
            os.replace(partial, merged)
            os.unlink(own)
            folded += 1
    return folded


class _Locked:
    """The multiprocess collector, read under the fold lock (a scrape never meets a fold half done)."""

    def __init__(self, directory: str) -> None:
        from prometheus_client.multiprocess import MultiProcessCollector

        self._directory = directory
        self._inner = MultiProcessCollector(None, path=directory)  # type: ignore[no-untyped-call]

    def collect(self) -> list[Any]:
        with _locked(self._directory, exclusive=False):
            return list(self._inner.collect())  # type: ignore[no-untyped-call]


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
        if self.private:
            registry.register(cast("Collector", _Locked(self.directory)))
        else:
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
        """A pool process ends (in that process): drop its live gauges; in a private directory, fold its
        counters and histograms into the merged files (elsewhere they stay as they are)."""
        if self.directory is None:
            return
        from prometheus_client.multiprocess import mark_process_dead

        try:
            mark_process_dead(pid, self.directory)  # type: ignore[no-untyped-call]
            if self.private:
                fold_files(self.directory, pid)
        except Exception:  # its files stay: counted still, only not folded
            logger.warning("metrics: could not fold the counts of process %d", pid, exc_info=True)

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


def install(celery: Any, port: int | None, *, addr: str = "0.0.0.0") -> None:
    """Connect the exporter to the `celery worker` of `celery` (by signal; nothing happens at install)."""
    exporter = WorkerExporter(port, addr=addr)

    def ours(instance: Any) -> bool:
        return getattr(instance, "app", None) is celery

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
        if getattr(sender, "app", None) is celery:
            exporter.stop()

    signals.celeryd_init.connect(_init, weak=False)
    signals.celeryd_after_setup.connect(_after_setup, weak=False)
    signals.worker_process_shutdown.connect(_child_exit, weak=False)
    signals.worker_shutdown.connect(_shutdown, weak=False)
