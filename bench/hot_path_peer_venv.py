"""The peer for bench/bench_hot_path.py: fastmcp-tasks from the registry, in a venv of its own.

The venv lives in a cache directory (BENCH_CACHE_DIR, default ~/.cache/celery-mcp-tasks-bench),
never in the repository, and is reused while it holds the same install. When this
project's environment has uvicorn's faster loop and parser (uvloop, httptools), the
peer gets them too: both servers then run on the same uvicorn stack.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PEER_APP = ROOT / "bench" / "hot_path_peer.py"


class PeerUnavailable(RuntimeError):
    """The peer could not be installed or started here; the message says why, in one line."""


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.startswith("WARNING: Location")]
    return lines[-1][:300] if lines else "(no output)"


def peer_python(version: str) -> Path:
    """The peer venv's interpreter, installing fastmcp-tasks==version there first when needed."""
    cache = Path(os.environ.get("BENCH_CACHE_DIR") or Path.home() / ".cache" / "celery-mcp-tasks-bench")
    venv = cache / f"fastmcp-tasks-{version}"
    python = venv / "bin" / "python"
    extras = [name for name in ("uvloop", "httptools") if importlib.util.find_spec(name) is not None]
    wanted = " ".join([f"fastmcp-tasks=={version}", *extras])
    marker = venv / ".bench-installed"
    if marker.exists() and marker.read_text() == wanted and python.exists():
        return python
    cache.mkdir(parents=True, exist_ok=True)
    steps = [
        [sys.executable, "-m", "venv", "--clear", str(venv)],
        [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", *wanted.split()],
    ]
    for argv in steps:
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=900)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise PeerUnavailable(f"`{' '.join(argv[2:4])}` did not finish: {exc}") from None
        if done.returncode != 0:
            raise PeerUnavailable(f"`pip install {wanted}` failed: {_last_line(done.stderr + done.stdout)}")
    marker.write_text(wanted)
    return python


def _port_open(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.2)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Peer:
    """A running fastmcp-tasks server (its Docket worker inside it) on Redis, under a queue name of its own."""

    python: Path
    redis_url: str
    log: Path
    name: str = field(default_factory=lambda: f"bench-peer-{uuid.uuid4().hex[:8]}")
    url: str = ""
    popen: subprocess.Popen[bytes] | None = None

    def start(self) -> Peer:
        port = _free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith(("MCP_TASKS_", "CELERY_", "FASTMCP_"))}
        env.pop("PYTHONPATH", None)
        env.pop("VIRTUAL_ENV", None)
        env["PYTHONUNBUFFERED"] = "1"
        argv = [str(self.python), str(PEER_APP), str(port), self.redis_url, self.name]
        with self.log.open("wb") as out:
            self.popen = subprocess.Popen(
                argv, cwd=self.log.parent, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        deadline = time.monotonic() + 60
        while not _port_open(port):
            if self.popen.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise PeerUnavailable(f"the fastmcp-tasks server did not start: {_last_line(self.log.read_text())}")
            time.sleep(0.1)
        self.url = f"http://127.0.0.1:{port}/mcp"
        return self

    @property
    def pid(self) -> int:
        assert self.popen is not None
        return self.popen.pid

    def stop(self) -> None:
        if self.popen is not None and self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(self.popen.pid, signal.SIGKILL)
                self.popen.wait(5)
        self._forget_keys()

    def _forget_keys(self) -> None:
        """Docket's keys all start with the queue name: remove them, and nothing else."""
        import redis

        client = redis.Redis.from_url(self.redis_url)
        try:
            keys = list(client.scan_iter(match=f"{self.name}:*", count=1000))
            for start in range(0, len(keys), 500):
                client.delete(*keys[start : start + 500])
        finally:
            client.close()

    def loop_and_parser(self) -> str:
        probe = "import importlib.util as u; print(bool(u.find_spec('uvloop')), bool(u.find_spec('httptools')))"
        out = subprocess.run([str(self.python), "-c", probe], capture_output=True, text=True).stdout.split()
        return stack_name(out[:1] == ["True"], out[1:2] == ["True"])


def stack_name(uvloop: bool, httptools: bool) -> str:
    return f"{'uvloop' if uvloop else 'asyncio'} + {'httptools' if httptools else 'h11'}"
