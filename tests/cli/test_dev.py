"""`celery-mcp-tasks dev`: its own listening socket (accepted connections as fast as uvicorn's own), and its
`--call` refusing bad ARGS before anything starts."""

from __future__ import annotations

import asyncio
import collections
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from celery_mcp_tasks.cli.shared import WorkerSupervisor, bind_port
from tests.support import free_port


def test_connections_accepted_on_the_dev_socket_have_tcp_nodelay() -> None:
    """asyncio sets TCP_NODELAY only on a listening socket made with IPPROTO_TCP (DESIGN.md decision 17)."""
    sock = bind_port("dev", "127.0.0.1", 0)
    assert sock.proto == socket.IPPROTO_TCP
    port = sock.getsockname()[1]
    accepted: list[int] = []

    async def main() -> None:
        async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            accepted.append(writer.get_extra_info("socket").getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            writer.close()

        server = await asyncio.start_server(on_connect, sock=sock)
        async with server:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            for _ in range(200):
                if accepted:
                    break
                await asyncio.sleep(0.01)
            writer.close()

    asyncio.run(main())
    assert accepted and accepted[0] != 0, "accepted connections lack TCP_NODELAY: every response waits a delayed ACK"


@pytest.mark.integration
def test_dev_call_with_args_that_are_not_json_refuses_before_starting_anything(tmp_path: Path) -> None:
    """A usage error: one line, exit 2, and nothing made (no data directory, no migration, no worker)."""
    data = tmp_path / "data"
    dev = [sys.executable, "-m", "celery_mcp_tasks.cli", "dev", "examples.quickstart.app", "--data-dir", str(data)]
    done = subprocess.run(
        [*dev, "--port", str(free_port()), "--call", "write_report", '{"topic": NaN}'],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert (
        done.stderr.strip() == "celery-mcp-tasks dev: ARGS is not JSON: NaN is not JSON (JSON has no NaN or Infinity)"
    )
    assert not data.exists()
    missing = tmp_path / "missing.json"  # ARGS from a file (`@PATH`), read before anything starts too
    done = subprocess.run(
        [*dev, "--port", str(free_port()), "--call", "write_report", f"@{missing}"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == f"celery-mcp-tasks dev: cannot read ARGS from '{missing}': No such file or directory"
    assert not data.exists()


def test_the_banner_names_the_broker_the_apps_celery_uses(tmp_path: Path) -> None:
    """A broker set in code (run with `--keep-env`) is the one shown, not the embedded default's folder."""
    from celery import Celery

    from celery_mcp_tasks import McpTasks
    from celery_mcp_tasks.cli.shared import banner
    from celery_mcp_tasks.config import Settings

    tasks = McpTasks(
        "banner",
        celery=Celery("banner", broker="redis://:secret@broker.example:6379/0"),
        settings=Settings(data_dir=tmp_path, database_url="postgresql://db.example/tasks"),
    )
    assert banner(tasks)[1] == "  broker  redis://:***@broker.example:6379/0"
    embedded = McpTasks("embedded", celery=Celery("embedded"), settings=Settings(data_dir=tmp_path))
    assert banner(embedded)[1].startswith("  broker  filesystem:// (")


@pytest.mark.parametrize(
    ("status", "said"),
    [
        (-signal.SIGKILL, "the worker was killed (SIGKILL)"),  # its last line is not why it ended
        (-signal.SIGSEGV, "the worker crashed (SIGSEGV): Fatal Python error: Segmentation fault"),
        (1, "the worker exited (status 1): Fatal Python error: Segmentation fault"),
    ],
)
def test_how_the_worker_died_names_a_kill_a_crash_or_its_status(status: int, said: str) -> None:
    worker = WorkerSupervisor.__new__(WorkerSupervisor)  # only what `why` reads: the status and the output's tail
    worker.died = status
    worker._tail = collections.deque(["Fatal Python error: Segmentation fault", '  File "x.py", line 1', ""])
    assert worker.why() == said
