"""Schema migrations (Alembic) on a real SQLite file and a real PostgreSQL: a database made by the
previous edgeinfer (``create_all``, no version table) is adopted and upgraded with its data; the
migrated schema is exactly what the code queries; unknown revisions are refused."""

from __future__ import annotations

import json
import subprocess

import pytest
import sqlalchemy as sa
from support.processes import edgeinfer_cmd

from edgeinfer.errors import ConfigError
from edgeinfer.fleet.db import FleetDB, create_engine
from edgeinfer.fleet.db.migrate import current, head


def previous_schema(metadata: sa.MetaData) -> None:
    """The tables exactly as edgeinfer 0.x created them with ``metadata.create_all`` (frozen copy)."""
    sa.Table("devices", metadata,
             sa.Column("device_id", sa.String(128), primary_key=True),
             sa.Column("fleet", sa.String(128), nullable=False),
             sa.Column("groups", sa.JSON, nullable=False, default=list),
             sa.Column("online", sa.Boolean, nullable=False, default=False),
             sa.Column("state", sa.JSON), sa.Column("model_name", sa.String(256)),
             sa.Column("model_version", sa.Integer), sa.Column("model_sha256", sa.String(64)),
             sa.Column("delegate", sa.String(64)), sa.Column("last_telemetry", sa.JSON),
             sa.Column("first_seen", sa.Float, nullable=False), sa.Column("last_seen", sa.Float, nullable=False))
    sa.Table("telemetry", metadata,
             sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
             sa.Column("device_id", sa.String(128), nullable=False, index=True),
             sa.Column("boot_id", sa.String(64), nullable=False), sa.Column("seq", sa.BigInteger, nullable=False),
             sa.Column("ts", sa.Float, nullable=False), sa.Column("fps", sa.Float),
             sa.Column("latency_p95_ms", sa.Float), sa.Column("dropped", sa.Integer),
             sa.Column("payload", sa.JSON, nullable=False),
             sa.UniqueConstraint("device_id", "boot_id", "seq", name="telemetry_once"))
    sa.Table("telemetry_rollup", metadata,
             sa.Column("device_id", sa.String(128), primary_key=True),
             sa.Column("minute", sa.BigInteger, primary_key=True),
             sa.Column("samples", sa.Integer, nullable=False), sa.Column("fps_sum", sa.Float, nullable=False),
             sa.Column("latency_p95_max_ms", sa.Float), sa.Column("dropped_sum", sa.Integer, nullable=False))
    sa.Table("events", metadata,
             sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
             sa.Column("device_id", sa.String(128), nullable=False, index=True),
             sa.Column("ts", sa.Float, nullable=False), sa.Column("kind", sa.String(64), nullable=False),
             sa.Column("payload", sa.JSON, nullable=False))
    sa.Table("deployments", metadata,
             sa.Column("deployment_id", sa.String(64), primary_key=True),
             sa.Column("model_name", sa.String(256), nullable=False), sa.Column("version", sa.Integer, nullable=False),
             sa.Column("sha256", sa.String(64), nullable=False), sa.Column("size", sa.BigInteger, nullable=False),
             sa.Column("target", sa.String(1024), nullable=False), sa.Column("options", sa.JSON, nullable=False),
             sa.Column("status", sa.String(32), nullable=False), sa.Column("detail", sa.Text),
             sa.Column("manifest", sa.JSON, nullable=False), sa.Column("signature", sa.Text, nullable=False),
             sa.Column("created_at", sa.Float, nullable=False), sa.Column("updated_at", sa.Float, nullable=False))
    sa.Table("deployment_devices", metadata,
             sa.Column("deployment_id", sa.String(64), primary_key=True),
             sa.Column("device_id", sa.String(128), primary_key=True),
             sa.Column("wave", sa.Integer, nullable=False), sa.Column("state", sa.String(32), nullable=False),
             sa.Column("detail", sa.Text), sa.Column("updated_at", sa.Float, nullable=False))


def make_previous_database(url: str) -> None:
    metadata = sa.MetaData()
    previous_schema(metadata)
    engine = sa.create_engine(url)
    metadata.create_all(engine)
    t = metadata.tables
    with engine.begin() as conn:
        conn.execute(t["devices"].insert().values(device_id="cam-1", fleet="f", groups=["lobby"], online=True,
                                                  first_seen=1.0, last_seen=2.0, model_version=1))
        conn.execute(t["telemetry"].insert(), [
            {"device_id": "cam-1", "boot_id": "b", "seq": seq, "ts": 1_700_000_000.0 + seq, "fps": 30.0,
             "dropped": 0, "payload": {"seq": seq, "boot_id": "b"}} for seq in (1, 2, 3)])
        conn.execute(t["deployments"].insert().values(
            deployment_id="d1", model_name="m", version=2, sha256="a" * 64, size=1, target="all", options={},
            status="running", manifest={"deployment_id": "d1"}, signature="s", created_at=1.0, updated_at=1.0))
        conn.execute(t["deployment_devices"].insert().values(deployment_id="d1", device_id="cam-1", wave=0,
                                                             state="notified", updated_at=1.0))
    engine.dispose()


def test_a_database_from_before_migrations_is_adopted_and_upgraded_with_its_data(db_url):
    make_previous_database(db_url)
    db = FleetDB(db_url)
    try:
        with db.engine.connect() as conn:
            assert current(conn) == head()
        assert [m["seq"] for m in db.device_telemetry("cam-1")] == [1, 2, 3]
        assert db.get_device("cam-1")["groups"] == ["lobby"]
        assert db.try_lease("d1", "me", 10)  # the new columns are there and work
        assert db.advance_target("d1", "cam-1", "active")
        assert db.record_telemetry("f", "cam-1", {"boot_id": "b", "seq": 4, "ts": 1_700_000_004.0, "pipelines": []})
        assert not db.record_telemetry("f", "cam-1", {"boot_id": "b", "seq": 2, "ts": 1.0, "pipelines": []})
    finally:
        db.close()
    FleetDB(db_url).close()  # a second open is a no-op


def test_the_migrated_schema_is_the_schema_the_code_queries(db_url):
    """Alembic's own comparison of a migrated database with edgeinfer.fleet.db.schema finds nothing."""
    from alembic.autogenerate import compare_metadata
    from alembic.runtime.migration import MigrationContext

    from edgeinfer.fleet.db.schema import tables

    FleetDB(db_url).close()
    engine = create_engine(db_url)
    with engine.connect() as conn:
        diffs = compare_metadata(MigrationContext.configure(conn, opts={"compare_type": True}), tables(sa).metadata)
    engine.dispose()
    assert diffs == []


def test_a_database_newer_than_this_edgeinfer_is_refused(db_url):
    FleetDB(db_url).close()
    engine = create_engine(db_url)
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE alembic_version SET version_num = '9999'"))
    engine.dispose()
    with pytest.raises(ConfigError, match="newer than this edgeinfer"):
        FleetDB(db_url)


def test_fleet_db_upgrade_and_current_commands(tmp_path):
    url = f"sqlite:///{tmp_path / 'old.sqlite3'}"
    make_previous_database(url)

    def run(*args: str) -> dict:
        done = subprocess.run(edgeinfer_cmd("fleet", "db", *args, "--db", url, "--json"), capture_output=True,
                              text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    assert run("current") == {"revision": None, "head": head(), "at_head": False}
    assert run("upgrade") == {"from": "0001", "to": head(), "changed": True}
    assert run("current")["at_head"] and run("upgrade")["changed"] is False
    bad = subprocess.run(edgeinfer_cmd("fleet", "db", "upgrade", "--db", "sqlite:////nonexistent/dir/x.db"),
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0 and "cannot open fleet database" in bad.stderr


def test_a_claims_places_are_counted_from_its_requests_made_before_and_kept_as_devices_come_and_are_rejected(db_url):
    """Migration 0015: ``claims.used`` counted from the requests a database at 0014 holds (pending and approved, not
    rejected), then kept by every request admitted, refused (its place given back) and rejected (its place freed)."""
    from alembic import command

    from edgeinfer.errors import ProvisioningRefused
    from edgeinfer.fleet.claims import _admit
    from edgeinfer.fleet.db.migrate import _config
    from edgeinfer.fleet.db.schema import tables

    t = tables(sa)
    engine = create_engine(db_url)
    with engine.begin() as conn:
        command.upgrade(_config(conn), "0014")
        conn.execute(t.claims.insert(), {"claim_id": "c1", "token_hash": "0" * 64, "fleet": "f", "groups": ["g"],
                                         "approve": "manual", "max_devices": 3, "has_serials": False,
                                         "name_template": "cam-{serial}", "created_at": 1.0})
        conn.execute(t.provisioning.insert(), [request(f"s{n}", f"cam-s{n}", state) for n, state in
                                               enumerate(("pending", "approved", "rejected"))])
    engine.dispose()
    db = FleetDB(db_url)
    try:
        def used() -> int:
            with db.engine.connect() as conn:
                return conn.execute(sa.select(db.t.claims.c.used)).scalar_one()

        def add(serial: str) -> dict | None:  # a batch of one request: a place taken, then the row, or refused
            with db.claims.batch() as tx:
                claim = tx.take_places("c1", 1)
                _admit(claim, claim["used"] - 1, False)  # raised: the batch rolls back, its place with it
                row = request(serial, f"cam-{serial}")
                return row if tx.write([row], [], []) else None

        assert used() == 2 and db.claims.list_claims()[0]["used"] == 2
        assert add("s3")["device_id"] == "cam-s3" and used() == 3
        with pytest.raises(ProvisioningRefused, match="exhausted"):
            add("s4")
        assert used() == 3 and db.claims.request_for("s4") is None  # refused: nothing kept, no place taken
        assert db.claims.decide("cam-s0", "rejected", {"decided_at": 2.0, "decided_by": "op"})["state"] == "rejected"
        assert used() == 2
        assert db.claims.decide("cam-s0", "rejected", {"decided_at": 3.0, "decided_by": "op"})["decided_at"] == 2.0
        assert used() == 2  # rejected once: freed once
        assert db.claims.decide("cam-s3", "approved", {"decided_at": 2.0})["state"] == "approved" and used() == 2
        assert add("s1") is None and used() == 2  # its serial is taken: the insert's place given back
        assert add("s4")["device_id"] == "cam-s4" and used() == 3
    finally:
        db.close()


def request(serial: str, device_id: str | None = None, state: str = "pending") -> dict:
    """A provisioning request's row (``device_id``: as stored; None: not named yet)."""
    row = {"serial": serial, "claim_id": "c1", "fleet": "f", "groups": ["g"], "state": state,
           "public_key_sha256": "0" * 64, "csr": "-", "hardware": {"serial": serial}, "remote": None,
           "requested_at": 1.0}
    return row if device_id is None else {**row, "device_id": device_id}
