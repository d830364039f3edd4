"""Schema migrations with Alembic, on the engine edgeinfer already has.

Alembic is the migration tool SQLAlchemy's authors maintain: ordered revision scripts, a version
table, and batch mode that rewrites a SQLite table where SQLite cannot ALTER it — the parts we
would otherwise write by hand, and get wrong on one of the two databases.

:func:`upgrade` runs on every ``FleetDB`` open (and from ``edgeinfer fleet db upgrade``). A database
made before migrations existed (tables, no ``alembic_version``) is stamped with the baseline
first. On PostgreSQL an advisory lock serialises managers that start together; on SQLite the
upgrade runs in one transaction (SQLite's DDL is transactional).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ...errors import ConfigError

BASELINE = "0001"
_LOCK_ID = 0x6564_6765  # "edge": the advisory lock every edgeinfer manager takes to migrate
SCRIPTS = Path(__file__).resolve().parents[1] / "migrations"


def _config(connection: Any) -> Any:
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(SCRIPTS))
    config.attributes["connection"] = connection
    return config


def head() -> str:
    from alembic.script import ScriptDirectory

    return ScriptDirectory(str(SCRIPTS)).get_current_head()


def current(connection: Any) -> str | None:
    from alembic.runtime.migration import MigrationContext

    return MigrationContext.configure(connection).get_current_revision()


def upgrade(engine: Any) -> tuple[str | None, str]:
    """Bring the database to the newest revision; returns (revision before, revision after)."""
    import sqlalchemy as sa
    from alembic import command
    from alembic.script import ScriptDirectory

    known = {script.revision for script in ScriptDirectory(str(SCRIPTS)).walk_revisions()}
    with engine.begin() as connection:
        if connection.dialect.name == "postgresql":
            connection.execute(sa.text("SELECT pg_advisory_xact_lock(:id)"), {"id": _LOCK_ID})
        before = current(connection)
        if before is not None and before not in known:
            raise ConfigError(f"the fleet database is at schema revision {before!r}, newer than this edgeinfer "
                              f"knows (its newest is {head()!r}): upgrade edgeinfer, or use a copy of the database")
        config = _config(connection)
        if before is None and sa.inspect(connection).has_table("devices"):
            command.stamp(config, BASELINE)  # made by edgeinfer before migrations existed
            before = BASELINE
        command.upgrade(config, "head")
        after = current(connection)
    return before, after or head()
