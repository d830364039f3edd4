"""Fixtures of the fleet tests: a real PostgreSQL for the whole session, a fresh database per test; a real
Mosquitto per test (``broker``; modules that need the managed one define their own) and a fleet manager on it."""

from __future__ import annotations

import pytest
from support.broker import running_broker
from support.fleet import running_fleet
from support.postgres import PostgresServer


@pytest.fixture(scope="session")
def postgres(tmp_path_factory):
    server = PostgresServer(tmp_path_factory.mktemp("postgres")).start()
    yield server
    server.stop("immediate")


@pytest.fixture
def postgres_url(postgres) -> str:
    return postgres.create_database()


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request, tmp_path) -> str:
    """The same test on SQLite (a file) and on PostgreSQL (a fresh database)."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'fleet.sqlite3'}"
    return request.getfixturevalue("postgres_url")


@pytest.fixture
def broker(tmp_path):
    with running_broker(tmp_path) as b:
        yield b


@pytest.fixture
def manager(tmp_path, broker):
    with running_fleet(tmp_path / "fleet", broker.url) as m:
        yield m
