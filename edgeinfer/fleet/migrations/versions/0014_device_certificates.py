"""Devices' client certificates (fleet/device_certs.py): every one the fleet's CA issued, by serial, with its device,
lifetime and revocation — the certificate revocation list is its revoked rows.

Revision ID: 0014
Revises: 0013
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "device_certificates",
        sa.Column("serial", sa.String(64), primary_key=True),
        sa.Column("device_id", sa.String(128), nullable=False),
        sa.Column("issued_at", sa.Float, nullable=False),
        sa.Column("not_after", sa.Float, nullable=False),
        sa.Column("revoked_at", sa.Float),
    )
    op.create_index("ix_device_certificates_device_id", "device_certificates", ["device_id"])


def downgrade() -> None:
    op.drop_index("ix_device_certificates_device_id", table_name="device_certificates")
    op.drop_table("device_certificates")
