"""Real web and worker processes running `tests.apps.runtime_app`, per backend.

Lost-work timings are shrunk through the environment (stale timeout 3 s,
janitor every second) so a killed worker is settled in seconds.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support import TERMINAL, Backend, Deployment, McpHttp, Proc, celery_id_of, wait_until

RUNTIME_APP = "tests.apps.runtime_app"
STALE_TIMEOUT_S = 3.0
JANITOR_INTERVAL_S = 1.0
FAST = {"MCP_TASKS_STALE_TIMEOUT_S": f"{STALE_TIMEOUT_S:g}", "MCP_TASKS_JANITOR_INTERVAL_S": f"{JANITOR_INTERVAL_S:g}"}


@pytest.fixture(scope="module")
def deployment(backend: Backend, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    with Deployment(RUNTIME_APP, backend, tmp_path_factory.mktemp(f"runtime-{backend.name}")) as deployment:
        yield deployment


@pytest.fixture(scope="module")
def runtime_env() -> dict[str, str]:
    """The settings both processes run with (a module overrides this fixture to change them)."""
    return dict(FAST)


@pytest.fixture(scope="module")
def web(deployment: Deployment, runtime_env: dict[str, str]) -> str:
    return deployment.web(**runtime_env)


@pytest.fixture(scope="module")
def worker(deployment: Deployment, web: str, runtime_env: dict[str, str]) -> Proc:
    """One prefork worker (2 processes) with beat, so the janitor runs every second."""
    return deployment.worker(beat=True, env=runtime_env)


@pytest.fixture
def client(web: str) -> Iterator[McpHttp]:
    client = McpHttp(web)
    yield client
    client.close()


def accept(**content: Any) -> dict[str, Any]:
    return {"action": "accept", "content": content}


def follow(
    client: McpHttp, task_id: str, timeout: float = 30, worker: Proc | None = None
) -> tuple[dict[str, Any], list[tuple[str, str | None]]]:
    """Poll until the task is final; returns it and every distinct (status, statusMessage) seen on the way.

    Given the `worker`, a timeout says what its log holds of the job's runs (nothing: never received).
    """
    seen: list[tuple[str, str | None]] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        task = client.get(task_id)
        state = (task["status"], task.get("statusMessage"))
        if not seen or seen[-1] != state:
            seen.append(state)
        if task["status"] in TERMINAL:
            return task, seen
        time.sleep(0.03)
    runs = ""
    if worker is not None:
        ids = [celery_id_of(client, task_id, dispatch) for dispatch in (1, 2, 3)]
        lines = [line for line in worker.text().splitlines() if any(cid in line for cid in ids)]
        runs = "; the worker's lines about its runs:\n" + ("\n".join(lines[-20:]) or "(none: never received)")
    raise TimeoutError(f"task still not final after {timeout}s; seen {seen}{runs}")


def job_pid(client: McpHttp, task_id: str, timeout: float = 20) -> int:
    """The pool process running a fixture job (it reports `pid=N: ...` as its statusMessage)."""

    def reported() -> int | None:
        match = re.match(r"pid=(\d+)", client.get(task_id).get("statusMessage") or "")
        return int(match.group(1)) if match else None

    return wait_until(reported, timeout, "the job to report its pid")


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (reaped later by its parent) is as good as dead.
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


def text_of(task: dict[str, Any]) -> str:
    return task["result"]["content"][0]["text"]
