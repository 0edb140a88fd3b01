"""An index on plans.workspace_root, so that a rollback finds the plans whose workspaces nest in or
around its own by equality lookups (see core/engine/nesting.py) instead of reading every plan. A hash
index on PostgreSQL: equality is all it serves, and it has no limit on the key's length (a B-tree
entry must fit in a third of a page, and a root may be 4096 bytes).

Revision ID: 0006
Revises: 0005
"""

from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_plans_workspace_root", "plans", ["workspace_root"], postgresql_using="hash")


def downgrade() -> None:
    op.drop_index("ix_plans_workspace_root", table_name="plans")
