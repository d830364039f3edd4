"""Verdicts: each command the manager sends and what the device did with it (fleet/verdicts.py).

``commands`` keeps one row per command id: its device, its word, a summary of its arguments (no secret), who
sent it, when, its expiry, and the device's verdict once it answers (``applied`` with its result, or ``refused``
with its reason and words). ``command_samples`` keeps what the manager did with each sample a capture command
produced (stored, or dropped as a near-duplicate of a stored one), once per sample. ``analytics`` gains the
command that sent its lines and zones and what the device said it applied (revision, lines, zones, when).

Revision ID: 0009
Revises: 0008
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "commands",
        sa.Column("command_id", sa.String(128), primary_key=True),
        sa.Column("device_id", sa.String(128), nullable=False),
        sa.Column("cmd", sa.String(32), nullable=False),
        sa.Column("pipeline", sa.String(64)),
        sa.Column("summary", sa.JSON, nullable=False),
        sa.Column("sent_by", sa.String(128), nullable=False),
        sa.Column("sent_at", sa.Float, nullable=False),
        sa.Column("expires_at", sa.Float, nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("reason", sa.String(64)),
        sa.Column("message", sa.Text),
        sa.Column("result", sa.JSON),
        sa.Column("answered_at", sa.Float),
        sa.Column("updated_at", sa.Float, nullable=False),
    )
    op.create_index("ix_commands_device", "commands", ["device_id", "sent_at"])
    op.create_index("ix_commands_updated_at", "commands", ["updated_at"])
    op.create_index("ix_commands_expires_at", "commands", ["expires_at"])
    op.create_table(
        "command_samples",
        sa.Column("device_id", sa.String(128), primary_key=True),
        sa.Column("sample_id", sa.String(64), primary_key=True),
        sa.Column("command_id", sa.String(128), nullable=False),
        sa.Column("outcome", sa.String(16), nullable=False),
        sa.Column("received_at", sa.Float, nullable=False),
    )
    op.create_index("ix_command_samples_command", "command_samples", ["command_id"])
    for column in (sa.Column("command_id", sa.String(128)), sa.Column("applied_revision", sa.BigInteger),
                   sa.Column("applied_lines", sa.JSON), sa.Column("applied_zones", sa.JSON),
                   sa.Column("applied_at", sa.Float)):
        op.add_column("analytics", column)


def downgrade() -> None:
    with op.batch_alter_table("analytics") as batch:
        for name in ("applied_at", "applied_zones", "applied_lines", "applied_revision", "command_id"):
            batch.drop_column(name)
    op.drop_index("ix_command_samples_command", "command_samples")
    op.drop_table("command_samples")
    for name in ("ix_commands_expires_at", "ix_commands_updated_at", "ix_commands_device"):
        op.drop_index(name, "commands")
    op.drop_table("commands")
