"""A claim counts its places: ``claims.used``, its pending and approved requests (fleet/db/claims.py), kept in the
transaction that adds a request or rejects one — so admitting a device locks the claim's row for one ``UPDATE``, not
for a count of every request the claim ever made (10,000 devices of one claim: 10,000 counts growing to 10,000 rows).
Counted here once from the requests already made.

Revision ID: 0015
Revises: 0014
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("claims") as batch:
        batch.add_column(sa.Column("used", sa.Integer, nullable=False, server_default="0"))
    op.execute("UPDATE claims SET used = (SELECT count(*) FROM provisioning WHERE provisioning.claim_id = "
               "claims.claim_id AND provisioning.state <> 'rejected')")


def downgrade() -> None:
    with op.batch_alter_table("claims") as batch:
        batch.drop_column("used")
