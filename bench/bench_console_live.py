"""Live updates for open console pages: the console process's CPU with 0, 1 and N pages open.

    MCP_TASKS_TEST_POSTGRES_URL=postgresql://postgres@127.0.0.1:5432/test \\
        python -m bench.bench_console_live [--pages 50] [--rate 50] [--seconds 10]

A real `celery-mcp-tasks console` process on a fresh PostgreSQL store (change
hints by NOTIFY, as in production). This process writes a steady stream of task
changes: progress on 100 working tasks, `--rate` a second, each a committed
UPDATE with its NOTIFY, as workers make them. Measured, for each phase over the
same `--seconds` of the same stream: the console's CPU (utime + stime from
/proc), first with no page open (the floor: its listener still takes every
hint and drops it), then with one page and with `--pages` pages following
`GET /api/events` (raw HTTP clients, each counting the changes it hears). A
page costs the server one queue put and one SSE write per change it is sent;
the store read per tick is shared by all pages.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

from bench.listen_streams import SseStream
from celery_mcp_tasks.app import internals
from celery_mcp_tasks.migrate import upgrade
from tests.support import Backend, Deployment, fresh_postgres_database

APP = "bench.task_app"
TOKEN = "bench-console-token-0123456789abcdef"
TASKS = 100


class ConsolePage(SseStream):
    """One open console page's live stream: `GET /api/events` with the operator token, read raw."""

    @classmethod
    async def follow(cls, root: str, token: str) -> ConsolePage:
        parts = urlsplit(root)
        reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
        writer.write(
            f"GET /api/events HTTP/1.1\r\nHost: {parts.netloc}\r\nAccept: text/event-stream\r\n"
            f"Authorization: Bearer {token}\r\n\r\n".encode()
        )
        await writer.drain()
        status = await reader.readline()
        headers = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").lower()
        if b" 200 " not in status or "text/event-stream" not in headers or "chunked" not in headers:
            writer.close()
            raise RuntimeError(f"/api/events answered {status.decode().strip()}")
        return cls(reader, writer)


def cpu_s(pid: int) -> float:
    """User + system CPU seconds `pid` has used (/proc/<pid>/stat)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Writer(threading.Thread):
    """Progress on `TASKS` working tasks at `rate` changes a second, through the product's own service."""

    def __init__(self, rate: float) -> None:
        super().__init__(daemon=True)
        from bench.task_app import tasks  # after the environment names the bench's store

        self.service = internals(tasks).service()
        self.keys = [self.service.create(owner=None, tool="noop", arguments={})[1].key for _ in range(TASKS)]
        self.rate = rate
        self.written = 0
        self.stopping = threading.Event()

    def run(self) -> None:
        began = time.perf_counter()
        while not self.stopping.is_set():
            key = self.keys[self.written % TASKS]
            self.service.progress(key, f"step {self.written}", current=self.written % 1000, total=1000)
            self.written += 1
            delay = began + self.written / self.rate - time.perf_counter()
            if delay > 0:
                self.stopping.wait(delay)


async def _pages_open(root: str, pages: int, seconds: float, pid: int) -> tuple[float, list[int]]:
    opened = [await ConsolePage.follow(root, TOKEN) for _ in range(pages)]
    heard = [0] * pages

    async def listen(n: int) -> None:
        while True:
            await opened[n].message()
            heard[n] += 1

    readers = [asyncio.create_task(listen(n)) for n in range(pages)]
    await asyncio.sleep(1.0)  # the pages settle (the server's first look at the store)
    heard[:] = [0] * pages
    before = cpu_s(pid)
    await asyncio.sleep(seconds)
    used = cpu_s(pid) - before
    counts = list(heard)
    for reader in readers:
        reader.cancel()
    for page in opened:
        page.close()
    await asyncio.sleep(0.5)  # the server sees the pages go
    return used, counts


def phase(root: str, pid: int, pages: int, seconds: float) -> tuple[float, list[int]]:
    if pages == 0:
        before = cpu_s(pid)
        time.sleep(seconds)
        return cpu_s(pid) - before, []
    return asyncio.run(_pages_open(root, pages, seconds, pid))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pages", type=int, default=50)
    parser.add_argument("--rate", type=float, default=50.0, help="task changes a second")
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args()
    base = os.environ["MCP_TASKS_TEST_POSTGRES_URL"]
    broker = os.environ.get("MCP_TASKS_TEST_REDIS_URL") or "memory://"
    with fresh_postgres_database(base) as url, tempfile.TemporaryDirectory() as tmp:
        upgrade(url)
        os.environ.update(MCP_TASKS_DATABASE_URL=url, CELERY_BROKER_URL=broker)
        backend = Backend("bench", {"MCP_TASKS_DATABASE_URL": url, "CELERY_BROKER_URL": broker})
        with Deployment(APP, backend, Path(tmp)) as deployment:
            root = deployment.console(TOKEN)
            pid = deployment.procs[-1].popen.pid
            writer = Writer(args.rate)
            writer.start()
            try:
                time.sleep(1.0)
                results = {n: phase(root, pid, n, args.seconds) for n in (0, 1, args.pages)}
            finally:
                writer.stopping.set()
                writer.join()
            changes = writer.written
    floor = results[0][0]
    print(f"console process CPU, {args.rate:g} task changes/s over {args.seconds:g} s ({changes} changes in all)")
    for n, (used, heard) in results.items():
        share = 100 * used / args.seconds
        extra = "" if n == 0 else f"   {used / floor if floor else float('inf'):5.2f}x the floor"
        per_page = "" if n == 0 else f"   +{100 * (used - floor) / args.seconds / n:5.2f}% a page"
        got = "" if not heard else f"   changes heard per page: min {min(heard)}, max {max(heard)}"
        print(f"{n:>3} pages open  {share:6.2f}% of one core{extra}{per_page}{got}")
    if any(min(heard, default=1) == 0 for _, heard in results.values()):
        sys.exit("a page heard no change: the measurement is void")


if __name__ == "__main__":
    main()
