"""Canary analysis: a deployment's stored verdict.

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("deployments") as batch:
        batch.add_column(sa.Column("analysis", sa.JSON))


def downgrade() -> None:
    with op.batch_alter_table("deployments") as batch:
        batch.drop_column("analysis")
