"""``edgeinfer fleet db upgrade|current``: the fleet database's schema migrations."""

from __future__ import annotations

from pathlib import Path

import click

from .output import handle_errors, print_json

db_option = click.option("--db", "db_url",
                         help="SQLAlchemy URL (default: sqlite in --data-dir, as `fleet serve` uses).")
data_dir_option = click.option("--data-dir", type=click.Path(file_okay=False, path_type=Path),
                               default=Path("fleet-data"), show_default=True,
                               help="The fleet manager's data dir (for the default SQLite file).")


def database_url(db_url: str | None, data_dir: Path) -> str:
    if db_url:
        return db_url
    data_dir.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{data_dir / 'fleet.sqlite3'}"


@click.group("db")
def db() -> None:
    """The fleet database's schema (Alembic migrations; `fleet serve` also upgrades on start)."""


@db.command("upgrade")
@db_option
@data_dir_option
@click.option("--json", "as_json", is_flag=True)
@handle_errors
def db_upgrade(db_url: str | None, data_dir: Path, as_json: bool) -> None:
    """Bring the database to the newest schema (a database from before migrations is adopted)."""
    from ..fleet.db import create_engine
    from ..fleet.db.migrate import upgrade

    engine = create_engine(database_url(db_url, data_dir))
    try:
        before, after = upgrade(engine)
    finally:
        engine.dispose()
    if as_json:
        print_json({"from": before, "to": after, "changed": before != after})
    else:
        click.echo(f"fleet database: {before or 'empty'} → {after}" if before != after
                   else f"fleet database: already at {after}")


@db.command("current")
@db_option
@data_dir_option
@click.option("--json", "as_json", is_flag=True)
@handle_errors
def db_current(db_url: str | None, data_dir: Path, as_json: bool) -> None:
    """Print the database's schema revision and whether it is the newest."""
    from ..fleet.db import create_engine
    from ..fleet.db.migrate import current, head

    engine = create_engine(database_url(db_url, data_dir))
    try:
        with engine.connect() as conn:
            revision = current(conn)
    finally:
        engine.dispose()
    newest = head()
    if as_json:
        print_json({"revision": revision, "head": newest, "at_head": revision == newest})
    else:
        hint = "newest" if revision == newest else f"newest is {newest}: run `edgeinfer fleet db upgrade`"
        click.echo(f"{revision or 'empty'} ({hint})")
