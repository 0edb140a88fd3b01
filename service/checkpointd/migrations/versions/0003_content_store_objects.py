"""The content store in the database (``--store db``): objects, their chunks, and the
garbage-collection epoch that replicas compare to know their cached object list is stale.

Revision ID: 0003
Revises: 0002
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "objects",
        sa.Column("digest", sa.String(64), primary_key=True),
        sa.Column("size", sa.BigInteger, nullable=False),
        sa.Column("encoding", sa.String(1), nullable=False),
        sa.Column("chunk_count", sa.Integer, nullable=False),
        sa.Column("create_time", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_table(
        "object_chunks",
        sa.Column("digest", sa.String(64), primary_key=True),
        sa.Column("seq", sa.Integer, primary_key=True),
        sa.Column("data", sa.LargeBinary, nullable=False),
    )
    state = op.create_table(
        "content_store_state",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("gc_epoch", sa.BigInteger, nullable=False),
    )
    op.bulk_insert(state, [{"id": 1, "gc_epoch": 0}])


def downgrade() -> None:
    for table in ("content_store_state", "object_chunks", "objects"):
        op.drop_table(table)
