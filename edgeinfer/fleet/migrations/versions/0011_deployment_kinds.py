"""Deployment kinds: what a deployment installs (link/vocabulary.py ``DeploymentKind``: a model, the agent itself;
docs/fleet.md, *Deployment kinds*). Every deployment made before is a model's.

Revision ID: 0011
Revises: 0010
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("deployments") as batch:
        batch.add_column(sa.Column("kind", sa.String(16), nullable=False, server_default="model"))


def downgrade() -> None:
    with op.batch_alter_table("deployments") as batch:
        batch.drop_column("kind")
