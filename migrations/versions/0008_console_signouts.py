"""The operators' console: sessions signed out before they expired.

A console session is a signed cookie; signing out deletes it from the browser, and
this table makes every console process refuse a copy of it too, until the cookie
would have expired anyway (`expires_at`, epoch ms). Rows past that are deleted
by the next sign-out.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "mcp_tasks_console_signout",
        sa.Column("session", sa.String(64), nullable=False),
        sa.Column("expires_at", sa.BigInteger, nullable=False),
        sa.PrimaryKeyConstraint("session", name="pk_mcp_tasks_console_signout"),
    )


def downgrade() -> None:
    op.drop_table("mcp_tasks_console_signout")
