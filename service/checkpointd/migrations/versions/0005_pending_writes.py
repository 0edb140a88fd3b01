"""Pending writes (PutPendingWrites): writes tasks made after a checkpoint, deleted with it.

Revision ID: 0005
Revises: 0004
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "pending_writes",
        sa.Column("checkpoint_id", sa.String(26), sa.ForeignKey("checkpoints.checkpoint_id", ondelete="CASCADE"),
                  primary_key=True),
        sa.Column("task_id", sa.String(256), primary_key=True),
        sa.Column("idx", sa.Integer, primary_key=True),
        sa.Column("channel", sa.String(256), nullable=False),
        sa.Column("value_type", sa.String(64), nullable=False),
        sa.Column("value", sa.LargeBinary, nullable=False),
        sa.Column("task_path", sa.String(1024), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("pending_writes")
