"""Roll-up drop counts as 64-bit integers: a minute's sum of per-window drop counts can pass 2**31.

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("telemetry_rollup") as batch:
        batch.alter_column("dropped_sum", type_=sa.BigInteger, existing_type=sa.Integer, existing_nullable=False)


def downgrade() -> None:
    with op.batch_alter_table("telemetry_rollup") as batch:
        batch.alter_column("dropped_sum", type_=sa.Integer, existing_type=sa.BigInteger, existing_nullable=False)
