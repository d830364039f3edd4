"""Events with evidence: a device's snapshot and clip per triggered event, in the database, and the
event id on the events that have some.

The files live in PostgreSQL (or SQLite) so that every manager behind a load balancer serves what
any of them received: ``evidence`` holds one row per file, ``evidence_chunks`` its bytes, 1 MiB a
row (docs/fleet.md, *Events with evidence*). On PostgreSQL the chunks are stored uncompressed
(``STORAGE EXTERNAL``): JPEG does not compress, so trying costs CPU for nothing.

Revision ID: 0006
Revises: 0005
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("events") as batch:
        batch.add_column(sa.Column("event_id", sa.String(64)))
    op.create_index("ix_events_device_event", "events", ["device_id", "event_id"])
    op.create_table(
        "evidence",
        sa.Column("device_id", sa.String(128), primary_key=True),
        sa.Column("event_id", sa.String(64), primary_key=True),
        sa.Column("file", sa.String(16), primary_key=True),
        sa.Column("size", sa.BigInteger, nullable=False),
        sa.Column("sha256", sa.String(64), nullable=False),
        sa.Column("chunks", sa.Integer, nullable=False),
        sa.Column("frames", sa.Integer),
        sa.Column("created_at", sa.Float, nullable=False),
    )
    op.create_index("ix_evidence_created_at", "evidence", ["created_at"])
    op.create_table(
        "evidence_chunks",
        sa.Column("device_id", sa.String(128), primary_key=True),
        sa.Column("event_id", sa.String(64), primary_key=True),
        sa.Column("file", sa.String(16), primary_key=True),
        sa.Column("seq", sa.Integer, primary_key=True),
        sa.Column("data", sa.LargeBinary, nullable=False),
    )
    if op.get_bind().dialect.name == "postgresql":
        op.execute("ALTER TABLE evidence_chunks ALTER COLUMN data SET STORAGE EXTERNAL")


def downgrade() -> None:
    op.drop_table("evidence_chunks")
    op.drop_index("ix_evidence_created_at", "evidence")
    op.drop_table("evidence")
    op.drop_index("ix_events_device_event", "events")
    with op.batch_alter_table("events") as batch:
        batch.drop_column("event_id")
