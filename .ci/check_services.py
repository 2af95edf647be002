"""Fail CI loudly when PostgreSQL or Redis does not answer: their tests must run, never skip."""

import os
import sys

import psycopg
import redis

problems = []
try:
    url = os.environ["MCP_TASKS_TEST_POSTGRES_URL"]
    with psycopg.connect(url, connect_timeout=5) as conn:
        conn.execute("SELECT 1")
    print("postgresql: ok")
except Exception as exc:  # noqa: BLE001 - any failure is a CI failure
    problems.append(f"PostgreSQL at MCP_TASKS_TEST_POSTGRES_URL does not answer: {exc}")
try:
    redis.Redis.from_url(os.environ["MCP_TASKS_TEST_REDIS_URL"], socket_connect_timeout=5).ping()
    print("redis: ok")
except Exception as exc:  # noqa: BLE001
    problems.append(f"Redis at MCP_TASKS_TEST_REDIS_URL does not answer: {exc}")
if problems:
    print("\n".join(problems), file=sys.stderr)
    sys.exit(1)
