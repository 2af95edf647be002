"""The operations app's own listener (`/metrics`, `/healthz`, `/readyz`), on a port apart from the MCP one.

A uvicorn server in a daemon thread: outside the main thread it leaves the process's signal handlers
to the MCP server. The command binds its socket first (`cli.shared.start_ops_server`): a port in use is
one warning line, and the MCP server runs on without it.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from typing import Any

DEFAULT_OPS_HOST = "127.0.0.1"
DEFAULT_OPS_PORT = 9101


def ops_port(text: str) -> int:
    """A TCP port, or 0 for `off` (also `none`, `0`): what MCP_TASKS_OPS_PORT and `--ops-port` take."""
    raw = text.strip().lower()
    if raw in ("off", "0", "none"):
        return 0
    if not raw.isdigit() or not 0 < int(raw) < 65536:
        raise ValueError(f"expected a TCP port or off, got {text!r}")
    return int(raw)


def ops_address(host: str | None, port: int | None) -> tuple[str, int | None]:
    """The command line's address, else MCP_TASKS_OPS_HOST / MCP_TASKS_OPS_PORT (`off`: no ops listener)."""
    host = host or os.environ.get("MCP_TASKS_OPS_HOST") or DEFAULT_OPS_HOST
    if port is None:
        raw = os.environ.get("MCP_TASKS_OPS_PORT") or ""
        try:
            port = ops_port(raw) if raw.strip() else DEFAULT_OPS_PORT
        except ValueError as exc:
            raise SystemExit(f"celery-mcp-tasks: configuration error: MCP_TASKS_OPS_PORT: {exc}") from None
    return host, port or None


OPS_THREAD = "mcp-tasks-ops-server"


class _NotTheOpsServers(logging.Filter):
    """uvicorn's access lines of the MCP server only: probes and scrapes of the ops listener are not news."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.threadName != OPS_THREAD


class OpsServer:
    """Serves one ASGI app on a bound socket (it listens once the server starts) in a daemon thread until `stop()`.

    Its access lines are filtered out, not turned off: uvicorn's `access_log=False` empties the process's one
    `uvicorn.access` logger, the MCP server's access lines with it."""

    def __init__(self, app: Any, sock: socket.socket, *, log_level: str | None = None, log_config: Any = None) -> None:
        import uvicorn

        self._sock = sock
        config = uvicorn.Config(app, lifespan="off", log_level=log_level, log_config=log_config)
        access = logging.getLogger("uvicorn.access")
        if not any(isinstance(found, _NotTheOpsServers) for found in access.filters):
            access.addFilter(_NotTheOpsServers())
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [sock]}, daemon=True)
        self._thread.name = OPS_THREAD

    def start(self) -> OpsServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(5)
        self._sock.close()
