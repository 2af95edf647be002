"""The operators' console: indexes for browsing tasks by keyset at a million rows.

Every list the console shows is a keyset page ordered by `(created_at, key)` or
`(updated_at, key)`, optionally narrowed to one status, tool or owner; these
indexes make the first page and the thousandth cost the same. The live updates'
"rows written since" read walks `(updated_at, key)` too, and the owner index
serves the loose index scan that resolves an owner tag.

On PostgreSQL the indexes are built CONCURRENTLY (outside the migration's
transaction), so a live store keeps taking writes while a big table is indexed;
`IF NOT EXISTS` lets a run that died half-way be run again, once the INVALID
index a build that died leaves behind is dropped (IF NOT EXISTS would keep it,
unused, for good). The migration lock (env.py) is a session lock, so it holds
across this block's commit.

Revision ID: 0006
Revises: 0005
Create Date: 2027-01-10
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

_TABLE = "mcp_tasks_task"
_INDEXES = {
    "ix_mcp_tasks_task_created_at_key": ["created_at", "key"],
    "ix_mcp_tasks_task_updated_at_key": ["updated_at", "key"],
    "ix_mcp_tasks_task_status_created_at_key": ["status", "created_at", "key"],
    "ix_mcp_tasks_task_tool_created_at_key": ["tool", "created_at", "key"],
    "ix_mcp_tasks_task_owner_created_at_key": ["owner", "created_at", "key"],
}


def _concurrently() -> bool:
    return op.get_context().dialect.name == "postgresql"


def upgrade() -> None:
    if not _concurrently():
        for name, columns in _INDEXES.items():
            op.create_index(name, _TABLE, columns)
        return
    with op.get_context().autocommit_block():
        for name, columns in _INDEXES.items():
            if _invalid(name):
                op.drop_index(name, table_name=_TABLE, postgresql_concurrently=True, if_exists=True)
            op.create_index(name, _TABLE, columns, postgresql_concurrently=True, if_not_exists=True)


def _invalid(name: str) -> bool:
    """Whether an index of that name exists, left INVALID by a concurrent build that failed or was cancelled."""
    if op.get_context().as_sql:  # offline (--sql): no database to ask
        return False
    query = sa.text("SELECT NOT indisvalid FROM pg_index WHERE indexrelid = to_regclass(:name)")
    return bool(op.get_bind().execute(query, {"name": name}).scalar())


def downgrade() -> None:
    if not _concurrently():
        for name in reversed(_INDEXES):
            op.drop_index(name, table_name=_TABLE)
        return
    with op.get_context().autocommit_block():
        for name in reversed(_INDEXES):
            op.drop_index(name, table_name=_TABLE, postgresql_concurrently=True, if_exists=True)
