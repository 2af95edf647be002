"""Quotas: an index of each principal's unfinished tasks.

A quota (MCP_TASKS_QUOTA_ACTIVE, a tool's `max_active`) counts the caller's unfinished
tasks in every creation it checks. Without this index that count read the caller's whole
history: 22 ms for a caller with 2,000 settled tasks in a 100,000-row store, while the
caller's creations queue on its lock. The index holds unfinished rows only (a partial
index), so the count walks the few a quota allows, and it stays small.

On PostgreSQL it is built CONCURRENTLY, as 0006's are (a live store keeps taking writes;
an INVALID index a build that died left behind is dropped and built again).

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

_TABLE = "mcp_tasks_task"
_NAME = "ix_mcp_tasks_task_owner_caller"
_UNFINISHED = sa.text("status NOT IN ('cancelled', 'completed', 'failed')")  # as the store's schema writes it


def upgrade() -> None:
    if op.get_context().dialect.name != "postgresql":
        op.create_index(_NAME, _TABLE, ["owner", "caller"], sqlite_where=_UNFINISHED)
        return
    with op.get_context().autocommit_block():
        if _invalid():
            op.drop_index(_NAME, table_name=_TABLE, postgresql_concurrently=True, if_exists=True)
        op.create_index(
            _NAME,
            _TABLE,
            ["owner", "caller"],
            postgresql_concurrently=True,
            if_not_exists=True,
            postgresql_where=_UNFINISHED,
        )


def _invalid() -> bool:
    """Whether the index exists, left INVALID by a concurrent build that failed or was cancelled."""
    if op.get_context().as_sql:  # offline (--sql): no database to ask
        return False
    query = sa.text("SELECT NOT indisvalid FROM pg_index WHERE indexrelid = to_regclass(:name)")
    return bool(op.get_bind().execute(query, {"name": _NAME}).scalar())


def downgrade() -> None:
    if op.get_context().dialect.name != "postgresql":
        op.drop_index(_NAME, table_name=_TABLE)
        return
    with op.get_context().autocommit_block():
        op.drop_index(_NAME, table_name=_TABLE, postgresql_concurrently=True, if_exists=True)
