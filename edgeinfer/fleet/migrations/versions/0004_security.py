"""Who may do what: API tokens (hashes only), the audit log, and devices' MQTT credentials.

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "api_tokens",
        sa.Column("token_id", sa.String(32), primary_key=True),
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("token_hash", sa.String(64), nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("created_by", sa.String(128)),
        sa.Column("expires_at", sa.Float),
        sa.Column("revoked_at", sa.Float),
        sa.Column("last_used_at", sa.Float),
    )
    op.create_table(
        "audit_log",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("ts", sa.Float, nullable=False, index=True),
        sa.Column("actor", sa.String(128), nullable=False),
        sa.Column("role", sa.String(16)),
        sa.Column("action", sa.String(64), nullable=False),
        sa.Column("target", sa.String(256)),
        sa.Column("remote", sa.String(128)),
        sa.Column("detail", sa.JSON, nullable=False),
    )
    op.create_table(
        "device_credentials",
        sa.Column("device_id", sa.String(128), primary_key=True),
        sa.Column("fleet", sa.String(128), nullable=False),
        sa.Column("username", sa.String(128), nullable=False, unique=True),
        sa.Column("password_hash", sa.String(256), nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("revoked_at", sa.Float),
    )


def downgrade() -> None:
    op.drop_table("device_credentials")
    op.drop_table("audit_log")
    op.drop_table("api_tokens")
