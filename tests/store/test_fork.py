"""A forked child never touches its parent's connections, nor inherits its locks.

Celery's prefork pool (and any forking server) copies the parent's engine, its pool
and the pool's sockets into every child. The parent keeps writing from eight
threads while children are forked one after another; each child uses the service
the way a job does (its own, rebuilt per process) and also through an object built
before the fork (the trap: without `dispose(close=False)` at fork, that one checks
out the parent's pooled connections and talks over the parent's sockets), then
collects garbage and exits. The parent must see no error at all.

On SQLite the trap is another: a child forked while a thread of the parent is inside
a write transaction inherits SQLite's in-memory "this process holds the write lock"
and can never write (`store.engine._ForkGate` makes the fork wait for it instead).
"""

from __future__ import annotations

import gc
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from celery_mcp_tasks import McpTasks
from celery_mcp_tasks.app import internals
from celery_mcp_tasks.config import Settings
from celery_mcp_tasks.migrate import upgrade
from tests.support import POSTGRES_URL, fresh_postgres_database

pytestmark = pytest.mark.integration  # forks processes

CHILDREN = 30
WRITERS = 8


@pytest.fixture(params=["embedded", pytest.param("postgres", marks=pytest.mark.postgres)])
def tasks(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[McpTasks]:
    if request.param == "embedded":
        url = f"sqlite:///{tmp_path / 'tasks.db'}"
        upgrade(url)
        app = McpTasks("fork", settings=Settings(data_dir=tmp_path, database_url=url, notify="poll"))
        yield app
        internals(app).service().store.dispose()
        return
    if not POSTGRES_URL:
        pytest.skip("set MCP_TASKS_TEST_POSTGRES_URL to run")
    with fresh_postgres_database(POSTGRES_URL) as url:
        upgrade(url)
        app = McpTasks("fork", settings=Settings(data_dir=tmp_path, database_url=url, notify="poll"))
        yield app
        internals(app).service().store.dispose()


def _child(tasks: McpTasks, built_before_fork: object, keys: list[str]) -> None:
    """Runs in the forked child; never returns (no pytest machinery may run twice)."""
    code = 0
    try:
        own = internals(tasks).service()
        assert own is not built_before_fork, "the service must be rebuilt in a new process"
        for key in keys:
            own.progress(key, f"child {os.getpid()}")
            assert own.record(key) is not None
        for _ in range(5):
            for key in keys:
                assert built_before_fork.record(key) is not None  # type: ignore[attr-defined]
        del own
        gc.collect()
    except BaseException:  # noqa: BLE001 - reported through the exit status
        code = 1
    os._exit(code)


def _wait(pid: int, timeout: float = 20) -> int:
    """The child's exit code; a child stuck (e.g. on a lock copied mid-use) is killed and counts as -9."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.01)
    os.kill(pid, signal.SIGKILL)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


def test_children_forked_under_load_leave_the_parents_connections_alone(tasks: McpTasks) -> None:
    service = internals(tasks).service()
    keys = [service.create(owner=None, tool="t", arguments={}, dispatch=False)[1].key for _ in range(WRITERS)]
    errors: list[str] = []
    done = threading.Event()

    def write(key: str) -> None:
        n = 0
        while not done.is_set():
            try:
                service.progress(key, f"parent {n}")
                assert service.record(key) is not None
                n += 1
                time.sleep(0.001 * (n % 3))  # so some pooled connections sit idle at any moment
            except Exception as exc:  # noqa: BLE001 - the assertion below reports them
                errors.append(f"{type(exc).__name__}: {exc.__cause__ or exc}"[:300])

    writers = [threading.Thread(target=write, args=(key,)) for key in keys]
    for thread in writers:
        thread.start()
    statuses = []
    try:
        time.sleep(0.3)
        for _ in range(CHILDREN):
            pid = os.fork()
            if pid == 0:
                _child(tasks, service, keys)
            statuses.append(_wait(pid))
            if statuses[-1]:
                break  # one stuck child says it all, and each costs the wait's timeout
            time.sleep(0.02)
        time.sleep(0.3)
    finally:
        done.set()
        for thread in writers:
            thread.join(timeout=30)
    assert errors == [], errors[:5]
    assert statuses == [0] * CHILDREN
    assert all(service.record(key).version > 10 for key in keys)  # the parent really was under load
