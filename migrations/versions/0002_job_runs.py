"""Run bookkeeping for the Celery runtime: attempt, resends, parked.

`attempt` lets out-of-order retry signals be ignored, `resends` bounds the
stale reaper, `parked` marks a job blocked in `wait_for_input` (answering it
must not enqueue a second job).

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("mcp_tasks_task") as batch:
        batch.add_column(sa.Column("attempt", sa.Integer(), nullable=False, server_default="0"))
        batch.add_column(sa.Column("resends", sa.Integer(), nullable=False, server_default="0"))
        batch.add_column(sa.Column("parked", sa.Boolean(), nullable=False, server_default=sa.false()))


def downgrade() -> None:
    with op.batch_alter_table("mcp_tasks_task") as batch:
        batch.drop_column("parked")
        batch.drop_column("resends")
        batch.drop_column("attempt")
