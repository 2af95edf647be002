"""Quotas: who an anonymous caller is.

`mcp_tasks_task.caller` tells anonymous callers apart for the per-principal quotas
when MCP_TASKS_QUOTA_ANONYMOUS=per_client: a hash of the client's address, never
the address itself. NULL for every task of an authenticated caller (the owner is
the caller then), with the setting off, and for every row at upgrade time.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("mcp_tasks_task") as batch:
        batch.add_column(sa.Column("caller", sa.String(64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("mcp_tasks_task") as batch:
        batch.drop_column("caller")
