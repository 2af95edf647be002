"""The package's own tables. Prefixed `mcp_tasks_` so they sit beside a host
application's tables (and its alembic history) without touching them."""

from __future__ import annotations

import sqlalchemy as sa

from celery_mcp_tasks.model import MAX_OWNER, MAX_TOOL_NAME, TERMINAL_VALUES

TABLE_PREFIX = "mcp_tasks_"
VERSION_TABLE = "mcp_tasks_alembic_version"

metadata = sa.MetaData(
    naming_convention={
        "ix": "ix_%(table_name)s_%(column_0_N_name)s",
        "uq": "uq_%(table_name)s_%(column_0_N_name)s",
        "ck": "ck_%(table_name)s_%(constraint_name)s",
        "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
        "pk": "pk_%(table_name)s",
    }
)

tasks = sa.Table(
    f"{TABLE_PREFIX}task",
    metadata,
    # sha256(task id), hex. The raw id is never stored.
    sa.Column("key", sa.String(64), primary_key=True),
    sa.Column("owner", sa.String(MAX_OWNER), nullable=True),
    sa.Column("tool", sa.String(MAX_TOOL_NAME), nullable=False),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("status_message", sa.Text, nullable=True),
    # Epoch milliseconds: portable, exact, and what the wire renders from.
    sa.Column("created_at", sa.BigInteger, nullable=False),
    sa.Column("updated_at", sa.BigInteger, nullable=False),
    sa.Column("ttl_ms", sa.BigInteger, nullable=True),
    sa.Column("expires_at", sa.BigInteger, nullable=True),
    sa.Column("poll_interval_ms", sa.Integer, nullable=True),
    sa.Column("arguments", sa.JSON, nullable=False),
    sa.Column("input_requests", sa.JSON, nullable=False),
    sa.Column("input_responses", sa.JSON, nullable=False),
    sa.Column("issued_keys", sa.JSON, nullable=False),
    sa.Column("result", sa.JSON, nullable=True),
    sa.Column("error", sa.JSON, nullable=True),
    sa.Column("version", sa.Integer, nullable=False),
    sa.Column("dispatches", sa.Integer, nullable=False),
    sa.Column("heartbeat_at", sa.BigInteger, nullable=True),
    # Run bookkeeping (migration 0002): the dispatch's Celery attempt, the reaper's re-sends, a job parked on input.
    sa.Column("attempt", sa.Integer, nullable=False, server_default="0"),
    sa.Column("resends", sa.Integer, nullable=False, server_default="0"),
    sa.Column("parked", sa.Boolean, nullable=False, server_default=sa.false()),
    # When a copy of the job claimed the run (migration 0003): a redelivered copy stands aside while it heartbeats.
    sa.Column("started_at", sa.BigInteger, nullable=True),
    # The last numeric progress report (migration 0004): done and, when known, total. NULL: never reported.
    sa.Column("progress", sa.Float, nullable=True),
    sa.Column("progress_total", sa.Float, nullable=True),
    # The creating call's W3C `traceparent` (migration 0005): every later run joins the task's one trace.
    sa.Column("trace_context", sa.String(512), nullable=True),
    # An anonymous caller's quota identity (migration 0007): a hash of its address, only with
    # MCP_TASKS_QUOTA_ANONYMOUS=per_client; NULL otherwise (an authenticated caller is its owner).
    sa.Column("caller", sa.String(64), nullable=True),
    sa.Index(None, "expires_at"),
    sa.Index(None, "status", "heartbeat_at"),
    sa.Index(None, "status", "updated_at"),
    # The console's keyset pages (migration 0006), by creation or last change, narrowed to a status, tool or owner.
    sa.Index(None, "created_at", "key"),
    sa.Index(None, "updated_at", "key"),
    sa.Index(None, "status", "created_at", "key"),
    sa.Index(None, "tool", "created_at", "key"),
    sa.Index(None, "owner", "created_at", "key"),
)

UNFINISHED = tasks.c.status.not_in([sa.literal_column(f"'{value}'") for value in TERMINAL_VALUES])
"""`status NOT IN ('cancelled', 'completed', 'failed')`, the values written into the SQL: a partial index's
predicate (below), and what a query says to use that index. Both databases need the literal term: SQLite
matches only the same term, and PostgreSQL proves a match from bound values only in a custom plan (a prepared
statement's generic plan, which psycopg's automatic prepare leads to, would not use the index)."""

# A principal's unfinished tasks (migration 0009): what a quota counts on every creation it checks. Only
# unfinished rows are in it, so the count walks the few the quota allows, not the principal's whole history.
sa.Index(None, tasks.c.owner, tasks.c.caller, postgresql_where=UNFINISHED, sqlite_where=UNFINISHED)

sweeps = sa.Table(
    f"{TABLE_PREFIX}sweep",
    metadata,
    # One row per sweeping duty ("janitor"): its last sweep and the claim on the current interval (`store.sweeps`).
    sa.Column("name", sa.String(32), primary_key=True),
    sa.Column("claimed_at", sa.BigInteger, nullable=True),
    sa.Column("claimed_by", sa.String(128), nullable=True),
    sa.Column("swept_at", sa.BigInteger, nullable=True),
    sa.Column("duration_ms", sa.BigInteger, nullable=True),
    sa.Column("sweeps", sa.BigInteger, nullable=False, server_default="0"),
    # The last sweep's report ({"removed": n, "resent": n, ...}) and the tasks it counted by status.
    sa.Column("report", sa.JSON, nullable=True),
    sa.Column("statuses", sa.JSON, nullable=True),
)

signouts = sa.Table(
    f"{TABLE_PREFIX}console_signout",
    metadata,
    # A console session signed out before it expired (migration 0008): refused by every console process
    # until `expires_at` (epoch ms), when its cookie would have been refused anyway. The session's random id,
    # never the operator's name or anything of a task.
    sa.Column("session", sa.String(64), primary_key=True),
    sa.Column("expires_at", sa.BigInteger, nullable=False),
)
