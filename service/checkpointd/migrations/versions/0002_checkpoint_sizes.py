"""Workspace totals as 64-bit integers (PostgreSQL's INTEGER stops at 2 GiB); drop the index
that duplicated the unique (plan_id, sequence) one, which already serves pagination.

Revision ID: 0002
Revises: 0001
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.drop_index("ix_checkpoints_plan_sequence", table_name="checkpoints")
    with op.batch_alter_table("checkpoints") as batch:
        batch.alter_column("total_size_bytes", type_=sa.BigInteger, existing_type=sa.Integer,
                           existing_nullable=False)


def downgrade() -> None:
    with op.batch_alter_table("checkpoints") as batch:
        batch.alter_column("total_size_bytes", type_=sa.Integer, existing_type=sa.BigInteger,
                           existing_nullable=False)
    op.create_index("ix_checkpoints_plan_sequence", "checkpoints", ["plan_id", "sequence"])
