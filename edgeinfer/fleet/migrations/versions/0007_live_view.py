"""The live view: the latest frame of each watched device / pipeline / stream, and each pipeline's lines and
zones as last sent.

``live_frames`` keeps one row per (device, pipeline, stream): who watches until when (``watched_until``, renewed
by whichever manager holds viewers) and the newest JPEG with its size and times, overwritten by each frame, so
every manager behind a load balancer serves the frames any of them received; nothing else is recorded.
``analytics`` holds the lines and zones an operator last sent and their revision.

Revision ID: 0007
Revises: 0006
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "live_frames",
        sa.Column("device_id", sa.String(128), primary_key=True),
        sa.Column("pipeline", sa.String(64), primary_key=True),
        sa.Column("stream", sa.String(64), primary_key=True),
        sa.Column("watched_until", sa.Float, nullable=False),
        sa.Column("seq", sa.BigInteger, nullable=False),
        sa.Column("jpeg", sa.LargeBinary),
        sa.Column("width", sa.Integer),
        sa.Column("height", sa.Integer),
        sa.Column("frame_time", sa.Float),
        sa.Column("frame_id", sa.String(64)),
        sa.Column("received_at", sa.Float),
    )
    if op.get_bind().dialect.name == "postgresql":  # JPEG does not compress: do not try
        op.execute("ALTER TABLE live_frames ALTER COLUMN jpeg SET STORAGE EXTERNAL")
    op.create_table(
        "analytics",
        sa.Column("device_id", sa.String(128), primary_key=True),
        sa.Column("pipeline", sa.String(64), primary_key=True),
        sa.Column("stream", sa.String(64), primary_key=True),
        sa.Column("revision", sa.BigInteger, nullable=False),
        sa.Column("lines", sa.JSON, nullable=False),
        sa.Column("zones", sa.JSON, nullable=False),
        sa.Column("updated_at", sa.Float, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("analytics")
    op.drop_table("live_frames")
