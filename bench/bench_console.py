"""The console's reads at a million rows on PostgreSQL: list pages and the overview, p50/p95 in ms.

    MCP_TASKS_TEST_POSTGRES_URL=postgresql://postgres@127.0.0.1:5432/test python -m bench.bench_console [--rows N]

Fills a fresh database (migrated to head, so with migration 0006's indexes) with
N rows spread over 30 days (10 tools, 1 000 owners), then times
`SqlStore.browse` (first page, a deep page by cursor, by status, tool, owner tag,
text) and `SqlStore.overview`. The newest `--recent` rows (10 000: the last
~7 hours) have every status, 2 in 7 active; older ones are final, as in a live
store (the janitor fails a `working` task whose heartbeat went stale, an
unanswered question times out): about 2 900 active tasks among a million.
The live updates' cost for open pages is bench/bench_console_live.py's.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable

import sqlalchemy as sa

from celery_mcp_tasks.migrate import upgrade
from celery_mcp_tasks.model import now_ms
from celery_mcp_tasks.store.rows import Filter, owner_tag
from celery_mcp_tasks.store.sql import SqlStore
from tests.support import fresh_postgres_database

FILL = """
INSERT INTO mcp_tasks_task (key, owner, tool, status, status_message, created_at, updated_at, ttl_ms,
    expires_at, arguments, input_requests, input_responses, issued_keys, version, dispatches, attempt, resends,
    parked)
SELECT encode(sha256(('row-' || i)::bytea), 'hex'),
       CASE WHEN i % 10 = 0 THEN NULL ELSE 'sub:iss:user' || (i % 1000) END,
       'tool' || (i % 10),
       CASE WHEN i <= :recent
            THEN (ARRAY['completed','completed','completed','failed','cancelled','working','input_required'])[1 + i % 7]
            ELSE (ARRAY['completed','completed','completed','failed','cancelled'])[1 + i % 5] END,
       'step ' || (i % 100) || ' of the job',
       :now - (i::bigint * 2592) , :now - (i::bigint * 2592) + 500, 86400000, NULL,
       '{}', '{}', '{}', '[]', 2, 1, 0, 0, false
FROM generate_series(1, :rows) AS i
"""


def timed(fn: Callable[[], object], repeat: int) -> tuple[float, float]:
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1000)
    samples.sort()
    return statistics.median(samples), samples[int(len(samples) * 0.95) - 1]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=50)
    parser.add_argument("--recent", type=int, default=10_000, help="the newest rows, which may be active")
    args = parser.parse_args()
    base = os.environ["MCP_TASKS_TEST_POSTGRES_URL"]
    with fresh_postgres_database(base) as url:
        upgrade(url)
        store = SqlStore.from_url(url)
        now = now_ms()
        start = time.perf_counter()
        with store.engine.begin() as conn:
            conn.execute(sa.text(FILL), {"now": now, "rows": args.rows, "recent": args.recent})
        with store.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(sa.text("VACUUM ANALYZE mcp_tasks_task"))
        print(f"filled {args.rows} rows in {time.perf_counter() - start:.1f} s")
        deep = None
        page = store.browse(Filter(), "-created", None, 50, now_ms=now)
        for _ in range(20):  # the 21st page
            page = store.browse(Filter(), "-created", page.next_cursor, 50, now_ms=now)
            deep = page.next_cursor
        cases: dict[str, Callable[[], object]] = {
            "list, first page": lambda: store.browse(Filter(), "-created", None, 50, now_ms=now),
            "list, page 21 by cursor": lambda: store.browse(Filter(), "-created", deep, 50, now_ms=now),
            "list, -updated": lambda: store.browse(Filter(), "-updated", None, 50, now_ms=now),
            "list, status=working": lambda: store.browse(
                Filter(statuses=frozenset({"working"})), "-created", None, 50, now_ms=now
            ),
            "list, status=active": lambda: store.browse(
                Filter(statuses=frozenset({"working", "input_required"})), "-created", None, 50, now_ms=now
            ),
            "list, tool=tool3": lambda: store.browse(Filter(tool="tool3"), "-created", None, 50, now_ms=now),
            "list, owner tag": lambda: store.browse(
                Filter(owner=owner_tag("sub:iss:user7")), "-created", None, 50, now_ms=now
            ),
            "list, owner namespace": lambda: store.browse(Filter(owner="sub:iss"), "-created", None, 50, now_ms=now),
            "list, text": lambda: store.browse(Filter(text="step 42 "), "-created", None, 50, now_ms=now),
            "list, min_age=7d": lambda: store.browse(Filter(min_age_s=7 * 86400), "-created", None, 50, now_ms=now),
            "overview": lambda: store.overview(now),
        }
        for name, fn in cases.items():
            p50, p95 = timed(fn, args.repeat)
            print(f"{name:<28} p50 {p50:8.1f} ms   p95 {p95:8.1f} ms")
        store.dispose()


if __name__ == "__main__":
    main()
