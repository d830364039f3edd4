"""Zero-touch provisioning (fleet/claims.py; docs/provisioning.md): ``claims`` (a token baked into an image, kept as
its hash), ``claim_serials`` (the serials a claim admits when it names them) and ``provisioning`` (each device's
request: pending, approved with its certificate, or rejected).

Revision ID: 0013
Revises: 0012
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "claims",
        sa.Column("claim_id", sa.String(32), primary_key=True),
        sa.Column("token_hash", sa.String(64), nullable=False),
        sa.Column("fleet", sa.String(128), nullable=False),
        sa.Column("groups", sa.JSON, nullable=False),
        sa.Column("approve", sa.String(16), nullable=False),
        sa.Column("max_devices", sa.Integer),
        sa.Column("has_serials", sa.Boolean, nullable=False),
        sa.Column("name_template", sa.String(128), nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("created_by", sa.String(128)),
        sa.Column("expires_at", sa.Float),
        sa.Column("revoked_at", sa.Float),
    )
    op.create_table(
        "claim_serials",
        sa.Column("claim_id", sa.String(32), primary_key=True),
        sa.Column("serial", sa.String(64), primary_key=True),
    )
    op.create_table(
        "provisioning",
        sa.Column("device_id", sa.String(128), primary_key=True),
        sa.Column("serial", sa.String(64), nullable=False, unique=True),
        sa.Column("claim_id", sa.String(32), nullable=False),
        sa.Column("fleet", sa.String(128), nullable=False),
        sa.Column("groups", sa.JSON, nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("public_key_sha256", sa.String(64), nullable=False),
        sa.Column("csr", sa.Text, nullable=False),
        sa.Column("hardware", sa.JSON, nullable=False),
        sa.Column("remote", sa.String(128)),
        sa.Column("requested_at", sa.Float, nullable=False),
        sa.Column("decided_at", sa.Float),
        sa.Column("decided_by", sa.String(128)),
        sa.Column("certificate", sa.Text),
        sa.Column("cert_serial", sa.String(64)),
        sa.Column("not_after", sa.Float),
    )
    op.create_index("ix_provisioning_claim_id", "provisioning", ["claim_id"])


def downgrade() -> None:
    op.drop_index("ix_provisioning_claim_id", "provisioning")
    op.drop_table("provisioning")
    op.drop_table("claim_serials")
    op.drop_table("claims")
