"""Samples for datasets: one row per sample a device uploaded — its JPEG, what the model said
(``detections``), the labels a person corrected (``labels``), whether it was reviewed, and the device's
perceptual hash that keeps a static scene's near-identical frames out (fleet/samples.py).

Revision ID: 0008
Revises: 0007
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "samples",
        sa.Column("device_id", sa.String(128), primary_key=True),
        sa.Column("sample_id", sa.String(64), primary_key=True),
        sa.Column("pipeline", sa.String(64), nullable=False),
        sa.Column("stream", sa.String(64), nullable=False),
        sa.Column("rule", sa.String(128), nullable=False),
        sa.Column("model_name", sa.String(128), nullable=False),
        sa.Column("model_sha256", sa.String(64), nullable=False),
        sa.Column("model_version", sa.String(128), nullable=False),
        sa.Column("width", sa.Integer, nullable=False),
        sa.Column("height", sa.Integer, nullable=False),
        sa.Column("captured_at", sa.Float, nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("size", sa.BigInteger, nullable=False),
        sa.Column("sha256", sa.String(64), nullable=False),
        sa.Column("phash", sa.String(16), nullable=False),
        sa.Column("jpeg", sa.LargeBinary, nullable=False),
        sa.Column("detections", sa.JSON, nullable=False),
        sa.Column("labels", sa.JSON),
        sa.Column("label_names", sa.Text, nullable=False),
        sa.Column("reviewed", sa.Boolean, nullable=False),
        sa.Column("reviewed_at", sa.Float),
    )
    op.create_index("ix_samples_created_at", "samples", ["created_at"])
    op.create_index("ix_samples_scene", "samples", ["device_id", "pipeline", "stream", "created_at"])
    if op.get_bind().dialect.name == "postgresql":  # JPEG does not compress: do not try
        op.execute("ALTER TABLE samples ALTER COLUMN jpeg SET STORAGE EXTERNAL")


def downgrade() -> None:
    op.drop_index("ix_samples_scene", "samples")
    op.drop_index("ix_samples_created_at", "samples")
    op.drop_table("samples")
