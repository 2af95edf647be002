"""Numeric progress: `progress` and `progress_total`, a job's last `ctx.progress(message, current, total)`.

`progress` is how much is done, `progress_total` how much there is (NULL when
the job does not know). Both NULL: the job never reported a number (every row
at upgrade time reads so).

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-08
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("mcp_tasks_task") as batch:
        batch.add_column(sa.Column("progress", sa.Float(), nullable=True))
        batch.add_column(sa.Column("progress_total", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("mcp_tasks_task") as batch:
        batch.drop_column("progress_total")
        batch.drop_column("progress")
