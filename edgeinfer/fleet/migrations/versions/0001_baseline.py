"""The schema edgeinfer created with ``create_all`` before migrations existed (databases made then are
stamped with this revision, then upgraded).

Revision ID: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "devices",
        sa.Column("device_id", sa.String(128), primary_key=True),
        sa.Column("fleet", sa.String(128), nullable=False),
        sa.Column("groups", sa.JSON, nullable=False),
        sa.Column("online", sa.Boolean, nullable=False),
        sa.Column("state", sa.JSON),
        sa.Column("model_name", sa.String(256)),
        sa.Column("model_version", sa.Integer),
        sa.Column("model_sha256", sa.String(64)),
        sa.Column("delegate", sa.String(64)),
        sa.Column("last_telemetry", sa.JSON),
        sa.Column("first_seen", sa.Float, nullable=False),
        sa.Column("last_seen", sa.Float, nullable=False),
    )
    op.create_table(
        "telemetry",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("device_id", sa.String(128), nullable=False),
        sa.Column("boot_id", sa.String(64), nullable=False),
        sa.Column("seq", sa.BigInteger, nullable=False),
        sa.Column("ts", sa.Float, nullable=False),
        sa.Column("fps", sa.Float),
        sa.Column("latency_p95_ms", sa.Float),
        sa.Column("dropped", sa.Integer),
        sa.Column("payload", sa.JSON, nullable=False),
        sa.UniqueConstraint("device_id", "boot_id", "seq", name="telemetry_once"),
    )
    op.create_index("ix_telemetry_device_id", "telemetry", ["device_id"])
    op.create_table(
        "telemetry_rollup",
        sa.Column("device_id", sa.String(128), primary_key=True),
        sa.Column("minute", sa.BigInteger, primary_key=True),
        sa.Column("samples", sa.Integer, nullable=False),
        sa.Column("fps_sum", sa.Float, nullable=False),
        sa.Column("latency_p95_max_ms", sa.Float),
        sa.Column("dropped_sum", sa.Integer, nullable=False),
    )
    op.create_table(
        "events",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("device_id", sa.String(128), nullable=False),
        sa.Column("ts", sa.Float, nullable=False),
        sa.Column("kind", sa.String(64), nullable=False),
        sa.Column("payload", sa.JSON, nullable=False),
    )
    op.create_index("ix_events_device_id", "events", ["device_id"])
    op.create_table(
        "deployments",
        sa.Column("deployment_id", sa.String(64), primary_key=True),
        sa.Column("model_name", sa.String(256), nullable=False),
        sa.Column("version", sa.Integer, nullable=False),
        sa.Column("sha256", sa.String(64), nullable=False),
        sa.Column("size", sa.BigInteger, nullable=False),
        sa.Column("target", sa.String(1024), nullable=False),
        sa.Column("options", sa.JSON, nullable=False),
        sa.Column("status", sa.String(32), nullable=False),
        sa.Column("detail", sa.Text),
        sa.Column("manifest", sa.JSON, nullable=False),
        sa.Column("signature", sa.Text, nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("updated_at", sa.Float, nullable=False),
    )
    op.create_table(
        "deployment_devices",
        sa.Column("deployment_id", sa.String(64), primary_key=True),
        sa.Column("device_id", sa.String(128), primary_key=True),
        sa.Column("wave", sa.Integer, nullable=False),
        sa.Column("state", sa.String(32), nullable=False),
        sa.Column("detail", sa.Text),
        sa.Column("updated_at", sa.Float, nullable=False),
    )


def downgrade() -> None:
    for table in ("deployment_devices", "deployments", "events", "telemetry_rollup", "telemetry", "devices"):
        op.drop_table(table)
