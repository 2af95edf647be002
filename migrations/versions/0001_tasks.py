"""The task table.

Revision ID: 0001
Revises:
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "mcp_tasks_task",
        sa.Column("key", sa.String(64), nullable=False),
        sa.Column("owner", sa.String(512), nullable=True),
        sa.Column("tool", sa.String(128), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("status_message", sa.Text(), nullable=True),
        sa.Column("created_at", sa.BigInteger(), nullable=False),
        sa.Column("updated_at", sa.BigInteger(), nullable=False),
        sa.Column("ttl_ms", sa.BigInteger(), nullable=True),
        sa.Column("expires_at", sa.BigInteger(), nullable=True),
        sa.Column("poll_interval_ms", sa.Integer(), nullable=True),
        sa.Column("arguments", sa.JSON(), nullable=False),
        sa.Column("input_requests", sa.JSON(), nullable=False),
        sa.Column("input_responses", sa.JSON(), nullable=False),
        sa.Column("issued_keys", sa.JSON(), nullable=False),
        sa.Column("result", sa.JSON(), nullable=True),
        sa.Column("error", sa.JSON(), nullable=True),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("dispatches", sa.Integer(), nullable=False),
        sa.Column("heartbeat_at", sa.BigInteger(), nullable=True),
        sa.PrimaryKeyConstraint("key", name="pk_mcp_tasks_task"),
    )
    op.create_index("ix_mcp_tasks_task_expires_at", "mcp_tasks_task", ["expires_at"])
    op.create_index("ix_mcp_tasks_task_status_heartbeat_at", "mcp_tasks_task", ["status", "heartbeat_at"])
    op.create_index("ix_mcp_tasks_task_status_updated_at", "mcp_tasks_task", ["status", "updated_at"])


def downgrade() -> None:
    op.drop_index("ix_mcp_tasks_task_status_updated_at", table_name="mcp_tasks_task")
    op.drop_index("ix_mcp_tasks_task_status_heartbeat_at", table_name="mcp_tasks_task")
    op.drop_index("ix_mcp_tasks_task_expires_at", table_name="mcp_tasks_task")
    op.drop_table("mcp_tasks_task")
