"""The peer for bench/bench_hot_path.py: a fastmcp-tasks server with the same no-op task tool.

Runs only in the venv the benchmark builds for it (fastmcp-tasks from the registry,
never this project's dependencies): `python bench/hot_path_peer.py PORT REDIS_URL QUEUE`.
As its README says to run a tool as a task on Redis: `TasksExtension(url=...)` and
`@mcp.tool(task=True)`. Its worker runs inside this web process (Docket's lifespan).
"""

from __future__ import annotations

import sys

import uvicorn
from fastmcp import FastMCP
from fastmcp_tasks import TasksExtension


def build(redis_url: str, queue: str) -> FastMCP:
    mcp = FastMCP("bench-peer")
    mcp.add_extension(TasksExtension(url=redis_url, name=queue))

    @mcp.tool(task=True)
    async def noop(n: int = 0) -> str:
        """Does nothing (the benchmark measures creation, not execution)."""
        return "ok"

    return mcp


def main() -> None:
    port, redis_url, queue = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    app = build(redis_url, queue).http_app(path="/mcp")
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", timeout_graceful_shutdown=5)


if __name__ == "__main__":
    main()
