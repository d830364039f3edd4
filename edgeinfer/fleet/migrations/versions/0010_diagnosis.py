"""Logs and diagnosis from afar: ``device_logs``, the log lines devices sent on request (redacted on the device
and again on receipt; one row per line, once per (device, boot, seq), bounded per device and aged out), and
``diagnosis``, one row per device: when its logs were last asked for and by which command, until when someone
follows them, when its lines last came, and its last doctor request and result (fleet/diagnosis.py).

Revision ID: 0010
Revises: 0009
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "device_logs",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("device_id", sa.String(128), nullable=False),
        sa.Column("boot_id", sa.String(32), nullable=False),
        sa.Column("seq", sa.BigInteger, nullable=False),
        sa.Column("ts", sa.Float, nullable=False),
        sa.Column("level", sa.SmallInteger, nullable=False),
        sa.Column("logger", sa.String(128), nullable=False),
        sa.Column("message", sa.Text, nullable=False),
        sa.Column("received_at", sa.Float, nullable=False),
        sa.UniqueConstraint("device_id", "boot_id", "seq", name="device_logs_once"),
    )
    op.create_index("ix_device_logs_device", "device_logs", ["device_id", "id"])
    op.create_index("ix_device_logs_ts", "device_logs", ["ts"])
    op.create_table(
        "diagnosis",
        sa.Column("device_id", sa.String(128), primary_key=True),
        sa.Column("logs_requested_at", sa.Float),
        sa.Column("logs_command_id", sa.String(64)),
        sa.Column("follow_until", sa.Float),
        sa.Column("logs_received_at", sa.Float),
        sa.Column("logs_complete", sa.Boolean),
        sa.Column("logs_dropped", sa.BigInteger),
        sa.Column("doctor_requested_at", sa.Float),
        sa.Column("doctor_command_id", sa.String(64)),
        sa.Column("doctor_received_at", sa.Float),
        sa.Column("doctor_result", sa.Text),
    )


def downgrade() -> None:
    op.drop_table("diagnosis")
    op.drop_index("ix_device_logs_ts", "device_logs")
    op.drop_index("ix_device_logs_device", "device_logs")
    op.drop_table("device_logs")
