"""Run claims: `started_at`, when a copy of the job claimed the current run.

A broker may deliver one message twice (Redis, after its visibility timeout,
while the first copy still runs). The second copy of the same run skips its
body while the copy that claimed the run heartbeats, and takes over once that
heartbeat is stale. NULL: the current run has not started yet (every row at
upgrade time reads so; its job claims it the next time it starts).

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("mcp_tasks_task") as batch:
        batch.add_column(sa.Column("started_at", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("mcp_tasks_task") as batch:
        batch.drop_column("started_at")
