"""Fleet at scale: time indexes for retention, rollout leases (several managers), notification times,
the time of a device's newest telemetry.

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_telemetry_ts", "telemetry", ["ts"])
    op.create_index("ix_events_ts", "events", ["ts"])
    op.create_index("ix_telemetry_rollup_minute", "telemetry_rollup", ["minute"])
    with op.batch_alter_table("deployments") as batch:
        batch.add_column(sa.Column("lease_owner", sa.String(128)))
        batch.add_column(sa.Column("lease_until", sa.Float))
    with op.batch_alter_table("deployment_devices") as batch:
        batch.add_column(sa.Column("notified_at", sa.Float))
    with op.batch_alter_table("devices") as batch:  # batches arrive out of order: keep the newest telemetry
        batch.add_column(sa.Column("last_telemetry_ts", sa.Float))


def downgrade() -> None:
    with op.batch_alter_table("devices") as batch:
        batch.drop_column("last_telemetry_ts")
    with op.batch_alter_table("deployment_devices") as batch:
        batch.drop_column("notified_at")
    with op.batch_alter_table("deployments") as batch:
        batch.drop_column("lease_until")
        batch.drop_column("lease_owner")
    op.drop_index("ix_telemetry_rollup_minute", "telemetry_rollup")
    op.drop_index("ix_events_ts", "events")
    op.drop_index("ix_telemetry_ts", "telemetry")
