"""Operations: a task's trace context, and the janitor's sweep record.

`mcp_tasks_task.trace_context` keeps the W3C `traceparent` of the call that
created a task, so every run of its job joins one trace (NULL with tracing
off, and for every row at upgrade time). `mcp_tasks_sweep` holds one row per
sweeping duty: the last sweep's time and counts, and the claim that lets
several in-worker janitors sweep once per interval between them.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("mcp_tasks_task") as batch:
        batch.add_column(sa.Column("trace_context", sa.String(512), nullable=True))
    op.create_table(
        "mcp_tasks_sweep",
        sa.Column("name", sa.String(32), nullable=False),
        sa.Column("claimed_at", sa.BigInteger(), nullable=True),
        sa.Column("claimed_by", sa.String(128), nullable=True),
        sa.Column("swept_at", sa.BigInteger(), nullable=True),
        sa.Column("duration_ms", sa.BigInteger(), nullable=True),
        sa.Column("sweeps", sa.BigInteger(), nullable=False, server_default="0"),
        sa.Column("report", sa.JSON(), nullable=True),
        sa.Column("statuses", sa.JSON(), nullable=True),
        sa.PrimaryKeyConstraint("name", name="pk_mcp_tasks_sweep"),
    )


def downgrade() -> None:
    op.drop_table("mcp_tasks_sweep")
    with op.batch_alter_table("mcp_tasks_task") as batch:
        batch.drop_column("trace_context")
