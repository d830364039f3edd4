"""Configurations held by the fleet (fleet/configs.py; docs/fleet.md, *Configuration*): ``config_revisions``, every
revision of every layer (fleet, group, device) with who saved it, when and why, and ``config_targets``, the document
each device of a configuration deployment was given (its sha256: the artifact, content-addressed).

Revision ID: 0012
Revises: 0011
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "config_revisions",
        sa.Column("scope", sa.String(16), primary_key=True),
        sa.Column("name", sa.String(128), primary_key=True),
        sa.Column("revision", sa.Integer, primary_key=True),
        sa.Column("document", sa.JSON, nullable=False),
        sa.Column("sha256", sa.String(64), nullable=False),
        sa.Column("message", sa.Text, nullable=False),
        sa.Column("author", sa.String(128), nullable=False),
        sa.Column("role", sa.String(16)),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("restored_from", sa.Integer),
        sa.Column("applied_at", sa.Float),
        sa.Column("applied_by", sa.String(128)),
    )
    op.create_index("ix_config_revisions_created_at", "config_revisions", ["created_at"])
    op.create_table(
        "config_targets",
        sa.Column("deployment_id", sa.String(64), primary_key=True),
        sa.Column("device_id", sa.String(128), primary_key=True),
        sa.Column("sha256", sa.String(64), nullable=False),
        sa.Column("size", sa.Integer, nullable=False),
        sa.Column("layers", sa.JSON, nullable=False),
    )
    op.create_index("ix_config_targets_device", "config_targets", ["device_id"])
    op.create_index("ix_config_targets_sha256", "config_targets", ["sha256"])


def downgrade() -> None:
    op.drop_index("ix_config_targets_sha256", "config_targets")
    op.drop_index("ix_config_targets_device", "config_targets")
    op.drop_table("config_targets")
    op.drop_index("ix_config_revisions_created_at", "config_revisions")
    op.drop_table("config_revisions")
