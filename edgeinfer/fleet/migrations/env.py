"""Alembic's entry point: migrations run on the connection edgeinfer hands over (``edgeinfer.fleet.db.migrate``)."""

from __future__ import annotations

from alembic import context

connection = context.config.attributes.get("connection")
if connection is None:
    raise RuntimeError("run fleet migrations through `edgeinfer fleet db upgrade`, which passes the connection")
context.configure(connection=connection, render_as_batch=connection.dialect.name == "sqlite")
with context.begin_transaction():
    context.run_migrations()
