"""A worker's metrics endpoint: real `celery worker --pool=prefork -c 2` processes on the embedded backend.

The children's counts reach the main process's endpoint through the multiprocess files; a port
in use costs one warning line, never the worker; a private directory goes with its worker.
"""

from __future__ import annotations

import os
import socket
import sys
import tempfile
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.mmap_dict import MmapedDict, mmap_key
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.parser import text_string_to_metric_families

from celery_mcp_tasks.ops.metrics import MERGED, PRIVATE_PREFIX, WorkerExporter, fold_files, remove_orphans
from tests.support import Backend, Deployment, McpHttp, Proc, free_port, process_env, spawn, wait_until

APP = "examples.conformance.app"
NO_SUCH_PID = 2**22 + 1  # above Linux's largest pid_max: never a live process
METRICS_ON = {"MCP_TASKS_METRICS": "on"}  # the Prometheus plugin is opt-in


def finished(text: str) -> float:
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "mcp_tasks_finished_total"
    )


@pytest.fixture
def deployment(tmp_path: Path) -> Iterator[Deployment]:
    backend = Backend("embedded", {"MCP_TASKS_DATA_DIR": str(tmp_path / "data")})
    with Deployment(APP, backend, tmp_path) as running:
        running.web()  # migrates the embedded store
        yield running


def run_one(deployment: Deployment) -> None:
    client = McpHttp(deployment.url)
    try:
        assert client.wait_for(client.create("slow_compute", {"seconds": 0}))["status"] == "completed"
    finally:
        client.close()


@pytest.mark.integration
def test_the_pool_children_counts_are_served_by_the_main_process(deployment: Deployment, tmp_path: Path) -> None:
    directory = tmp_path / "multiproc"
    port = free_port()
    worker = deployment.worker(
        pool="prefork",
        concurrency=2,
        env={**METRICS_ON, "MCP_TASKS_WORKER_METRICS_PORT": str(port), "PROMETHEUS_MULTIPROC_DIR": str(directory)},
    )
    run_one(deployment)

    url = f"http://127.0.0.1:{port}/metrics"
    wait_until(lambda: finished(httpx.get(url, timeout=5).text) == 1, 20, "the child's finish on the endpoint")
    writers = {path.stem.rsplit("_", 1)[1] for path in directory.glob("counter_*.db")}
    assert str(worker.popen.pid) not in writers and writers  # a child counted, not the main process
    worker.stop()
    assert list(directory.glob("counter_*.db"))  # the deployment's directory is left as it was


def listening_on(port: int) -> set[str]:
    """The IPv4 addresses a TCP socket listens on at `port` (from /proc/net/tcp: no tool needed)."""
    found = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        address, _, hex_port = local.partition(":")
        if state == "0A" and int(hex_port, 16) == port:  # 0A: LISTEN
            found.add(socket.inet_ntoa(bytes.fromhex(address)[::-1]))
    return found


@pytest.mark.integration
def test_the_worker_metrics_port_listens_where_its_host_setting_says(deployment: Deployment, tmp_path: Path) -> None:
    """On the embedded default it listens on 127.0.0.1; MCP_TASKS_WORKER_METRICS_HOST names another address."""
    temp = tmp_path / "tmp"
    temp.mkdir()
    for host, expected in ((None, "127.0.0.1"), ("0.0.0.0", "0.0.0.0")):
        port = free_port()
        env = {**METRICS_ON, "MCP_TASKS_WORKER_METRICS_PORT": str(port), "TMPDIR": str(temp)}
        worker = deployment.worker(
            pool="prefork",
            concurrency=1,
            env={**env, **({} if host is None else {"MCP_TASKS_WORKER_METRICS_HOST": host})},
        )
        try:
            wait_until(lambda port=port: listening_on(port), 30, "the worker's metrics port")
            assert listening_on(port) == {expected}
        finally:
            worker.stop()


@pytest.mark.integration
def test_a_port_in_use_is_one_warning_and_the_worker_runs_on(deployment: Deployment, tmp_path: Path) -> None:
    temp = tmp_path / "tmp"
    temp.mkdir()
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))  # the address the exporter binds
        taken.listen()
        port = taken.getsockname()[1]
        worker = deployment.worker(
            pool="prefork",
            concurrency=2,
            env={**METRICS_ON, "MCP_TASKS_WORKER_METRICS_PORT": str(port), "TMPDIR": str(temp)},
        )
        run_one(deployment)

        warnings = [line for line in worker.text().splitlines() if "is not free" in line]
        assert len(warnings) == 1, worker.text()
        assert f"worker metrics port {port} is not free" in warnings[0]
        assert worker.popen.poll() is None
        assert [path.name for path in temp.iterdir() if path.name.startswith(PRIVATE_PREFIX)]
        worker.stop()
    assert not [path for path in temp.iterdir() if path.name.startswith(PRIVATE_PREFIX)]  # removed on shutdown


@pytest.mark.integration
def test_with_the_port_off_no_endpoint_and_no_directory(deployment: Deployment, tmp_path: Path) -> None:
    temp = tmp_path / "tmp"
    temp.mkdir()
    worker = deployment.worker(
        pool="prefork", concurrency=2, env={**METRICS_ON, "MCP_TASKS_WORKER_METRICS_PORT": "off", "TMPDIR": str(temp)}
    )
    run_one(deployment)

    assert "worker metrics on" not in worker.text()
    assert not [path for path in temp.iterdir() if path.name.startswith(PRIVATE_PREFIX)]


def test_a_killed_workers_private_directory_is_removed_by_the_next(tmp_path: Path) -> None:
    orphan = tmp_path / f"{PRIVATE_PREFIX}{NO_SUCH_PID}-abc"
    mine = tmp_path / f"{PRIVATE_PREFIX}{os.getpid()}-def"
    unrelated = tmp_path / f"{PRIVATE_PREFIX}notapid-x"
    for path in (orphan, mine, unrelated):
        path.mkdir()
        (path / "counter_1.db").write_bytes(b"")

    assert remove_orphans(str(tmp_path)) == [str(orphan)]
    assert sorted(path.name for path in tmp_path.iterdir()) == sorted([mine.name, unrelated.name])


def test_an_exporter_that_could_not_bind_stops_cleanly(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        exporter = WorkerExporter(taken.getsockname()[1], addr="127.0.0.1")
        exporter.directory = tempfile.mkdtemp(prefix=f"{PRIVATE_PREFIX}{os.getpid()}-", dir=tmp_path)
        exporter.private = True
        with caplog.at_level("WARNING", logger="celery_mcp_tasks.ops.metrics"):
            exporter.serve()
    assert exporter.server is None
    assert [record.levelname for record in caplog.records] == ["WARNING"]
    exporter.stop()
    assert not list(tmp_path.iterdir())


# -- a child's files folded at its exit ---------------------------------------------------------


def write_files(directory: Path, pid: int, finished: float, run_bucket: float) -> None:
    """What a pool process leaves: a counter and a histogram file, written as prometheus_client writes them."""
    counter = MmapedDict(str(directory / f"counter_{pid}.db"))
    key = mmap_key("mcp_tasks_finished", "mcp_tasks_finished_total", ["tool", "status"], ["t", "completed"], "F")
    counter.write_value(key, finished, 0.0)
    counter.close()
    histogram = MmapedDict(str(directory / f"histogram_{pid}.db"))
    for name, labels, number in (("_bucket", ["1.0"], run_bucket), ("_bucket", ["+Inf"], 0.0), ("_sum", [], 0.5)):
        names = ["tool", "le"] if labels else ["tool"]
        histogram.write_value(
            mmap_key("mcp_tasks_run", f"mcp_tasks_run_seconds{name}", names, ["t", *labels], "R"), number, 0.0
        )
    histogram.close()


def collected(directory: Path) -> bytes:
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(directory))
    return generate_latest(registry)


def test_a_folded_child_s_counts_read_exactly_as_before(tmp_path: Path) -> None:
    write_files(tmp_path, 101, finished=2, run_bucket=2)
    write_files(tmp_path, 102, finished=3, run_bucket=1)
    before = collected(tmp_path)

    assert fold_files(str(tmp_path), 101) == 2
    assert collected(tmp_path) == before
    assert fold_files(str(tmp_path), 102) == 2
    assert collected(tmp_path) == before
    assert sorted(path.name for path in tmp_path.glob("*.db")) == [f"counter_{MERGED}.db", f"histogram_{MERGED}.db"]
    assert fold_files(str(tmp_path), 103) == 0  # a process that counted nothing


def test_a_scrape_during_folds_sees_every_child_s_count_exactly_once(tmp_path: Path) -> None:
    directory = tempfile.mkdtemp(prefix=f"{PRIVATE_PREFIX}{os.getpid()}-", dir=tmp_path)
    pids = range(1000, 1060)
    for pid in pids:
        write_files(Path(directory), pid, finished=1, run_bucket=1)
    exporter = WorkerExporter(free_port(), addr="127.0.0.1")
    exporter.directory, exporter.private = directory, True
    exporter.serve()
    assert exporter.server is not None
    folding = threading.Thread(target=lambda: [exporter.child_exited(pid) for pid in pids])
    totals: list[float] = []
    try:
        folding.start()
        while folding.is_alive() or not totals:
            response = httpx.get(f"http://127.0.0.1:{exporter.port}/metrics", timeout=5)
            assert response.status_code == 200
            totals.append(finished(response.text))
        folding.join()
        totals.append(finished(httpx.get(f"http://127.0.0.1:{exporter.port}/metrics", timeout=5).text))
    finally:
        exporter.stop()
    assert set(totals) == {len(pids)}, totals  # never one short, never one twice, never a failed scrape


def _worker_with_short_lived_children(deployment: Deployment, port: int, temp: Path) -> Proc:
    """`celery worker --max-tasks-per-child 1`: a new pool process for every task."""
    argv = [sys.executable, "-m", "celery", "-A", APP, "worker", "-P", "prefork", "-c", "2"]
    argv += ["--max-tasks-per-child", "1", "--loglevel", "INFO", "--without-mingle", "--without-gossip"]
    argv += ["-n", f"short-{uuid.uuid4().hex[:6]}@%h"]
    env = process_env(
        deployment.backend, **deployment.env(**METRICS_ON, MCP_TASKS_WORKER_METRICS_PORT=str(port), TMPDIR=str(temp))
    )
    proc = spawn("short-lived-children", argv, env, deployment.log_dir)
    deployment.procs.append(proc)
    wait_until(lambda: " ready." in proc.text() or proc.popen.poll() is not None, 60, "the worker to be ready")
    assert proc.popen.poll() is None, proc.text()
    return proc


@pytest.mark.integration
def test_short_lived_children_leave_one_merged_file_not_one_per_child(deployment: Deployment, tmp_path: Path) -> None:
    temp = tmp_path / "tmp"
    temp.mkdir()
    port = free_port()
    worker = _worker_with_short_lived_children(deployment, port, temp)
    for _ in range(6):
        run_one(deployment)

    url = f"http://127.0.0.1:{port}/metrics"
    wait_until(lambda: finished(httpx.get(url, timeout=5).text) == 6, 20, "every child's finish on the endpoint")
    (directory,) = [path for path in temp.iterdir() if path.name.startswith(PRIVATE_PREFIX)]
    wait_until(lambda: (directory / f"counter_{MERGED}.db").exists(), 20, "the exited children folded")
    writers = {path.stem.split("_", 1)[1] for path in directory.glob("counter_*.db")}
    assert MERGED in writers and len(writers) <= 4, writers  # merged, the main process, at most two live children
    assert finished(httpx.get(url, timeout=5).text) == 6
    assert "could not fold" not in worker.text()
