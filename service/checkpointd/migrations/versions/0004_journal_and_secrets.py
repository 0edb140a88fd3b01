"""Rollback journal entries in the database (so every replica sees an interrupted rollback),
and server secrets shared by the replicas of one database (e.g. the page-token key).

Revision ID: 0004
Revises: 0003
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "rollback_journal",
        sa.Column("plan_id", sa.String(26), primary_key=True),
        sa.Column("entry", sa.JSON, nullable=False),
        sa.Column("create_time", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_table(
        "server_secrets",
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("value", sa.LargeBinary, nullable=False),
        sa.Column("create_time", sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    for table in ("server_secrets", "rollback_journal"):
        op.drop_table(table)
