"""Baseline: plans, checkpoints, request_id operations and config values, as checkpointd
created them before it had migrations (such databases are stamped at this revision).

Revision ID: 0001
Revises: none
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def _time() -> sa.Column:
    return sa.Column("create_time", sa.DateTime(timezone=True), nullable=False)


def upgrade() -> None:
    op.create_table(
        "plans",
        sa.Column("plan_id", sa.String(26), primary_key=True),
        sa.Column("workspace_root", sa.String(4096), nullable=True),
        sa.Column("last_sequence", sa.Integer, nullable=False),
        _time(),
    )
    op.create_table(
        "checkpoints",
        sa.Column("checkpoint_id", sa.String(26), primary_key=True),
        sa.Column("plan_id", sa.String(26), sa.ForeignKey("plans.plan_id"), nullable=False),
        sa.Column("sequence", sa.Integer, nullable=False),
        sa.Column("phase", sa.String(32), nullable=False),
        sa.Column("trigger", sa.String(32), nullable=False),
        sa.Column("source_tool", sa.String(256), nullable=False),
        sa.Column("description", sa.String, nullable=False),
        sa.Column("labels", sa.JSON, nullable=False),
        _time(),
        sa.Column("workspace_root", sa.String(4096), nullable=True),
        sa.Column("tree_digest", sa.String(64), nullable=True),
        sa.Column("file_count", sa.Integer, nullable=False),
        sa.Column("total_size_bytes", sa.Integer, nullable=False),
        sa.Column("state_digest", sa.String(64), nullable=True),
        sa.Column("state_size_bytes", sa.Integer, nullable=False),
        sa.Column("skipped", sa.JSON, nullable=False),
        sa.Column("ignore_patterns", sa.JSON, nullable=False),
        sa.Column("excluded_paths", sa.JSON, nullable=False),
        sa.Column("rollback_target_checkpoint_id", sa.String(26), nullable=True),
        sa.UniqueConstraint("plan_id", "sequence", name="uq_checkpoints_plan_sequence"),
    )
    op.create_index("ix_checkpoints_plan_sequence", "checkpoints", ["plan_id", "sequence"])
    op.create_table(
        "operations",
        sa.Column("request_id", sa.String(128), primary_key=True),
        sa.Column("method", sa.String(64), nullable=False),
        sa.Column("fingerprint", sa.String(64), nullable=False),
        sa.Column("result", sa.JSON, nullable=False),
        _time(),
    )
    op.create_table(
        "config_values",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("plan_id", sa.String(26), nullable=False),
        sa.Column("key", sa.String(128), nullable=False),
        sa.Column("value", sa.JSON, nullable=False),
        sa.Column("update_time", sa.DateTime(timezone=True), nullable=False),
        sa.UniqueConstraint("plan_id", "key", name="uq_config_plan_key"),
    )


def downgrade() -> None:
    for table in ("config_values", "operations", "checkpoints", "plans"):
        op.drop_table(table)
