"""The fleet database on a real SQLite file: ingest, de-duplication, roll-ups, deployments, HTTP API."""

from __future__ import annotations

import json
import textwrap
import urllib.request

import pytest
from support.processes import run_without

from edgeinfer.errors import ConfigError
from edgeinfer.fleet.artifacts import ArtifactStore
from edgeinfer.fleet.db import FleetDB
from edgeinfer.fleet.http import FleetHTTPServer


@pytest.fixture
def db(tmp_path):
    database = FleetDB(f"sqlite:///{tmp_path / 'fleet.db'}")
    yield database
    database.close()


def telemetry(seq: int, boot: str = "b1", fps: float = 30.0, p95: float = 12.0) -> dict:
    pipeline = {"name": "main", "status": "running", "frames": 30, "dropped": 1, "fps": fps,
                "stages": {"latency": {"p50": 8.0, "p95": p95, "p99": 20.0}}}
    return {"boot_id": boot, "seq": seq, "ts": 1_700_000_000.0 + seq, "pipelines": [pipeline]}


def test_telemetry_is_deduplicated_and_rolled_up(db):
    assert db.record_telemetry("f", "cam-1", telemetry(1))
    assert db.record_telemetry("f", "cam-1", telemetry(2, fps=20.0, p95=30.0))
    assert not db.record_telemetry("f", "cam-1", telemetry(2))  # a QoS 1 redelivery
    assert db.record_telemetry("f", "cam-1", telemetry(1, boot="b2"))  # a new boot restarts seq
    rows = db.device_telemetry("cam-1")
    assert [(r["boot_id"], r["seq"]) for r in rows] == [("b1", 1), ("b1", 2), ("b2", 1)]
    (rollup,) = db.device_rollups("cam-1")
    assert rollup["samples"] == 3 and rollup["dropped_sum"] == 3
    assert rollup["fps_mean"] == pytest.approx((30 + 20 + 30) / 3)
    assert rollup["latency_p95_max_ms"] == 30.0


def test_state_birth_and_will(db):
    db.record_state("f", "cam-1", {"online": True, "groups": ["lobby"], "pipelines": [
        {"name": "main", "delegate": "xnnpack", "model": {"path": "/m/mobilenet.tflite", "version": "1",
                                                          "sha256": "a" * 64}}]})
    device = db.get_device("cam-1")
    assert device["online"] and device["model_version"] == 1 and device["groups"] == ["lobby"]
    assert device["model_name"] == "mobilenet.tflite" and device["delegate"] == "xnnpack"
    db.record_state("f", "cam-1", {"online": False})
    device = db.get_device("cam-1")
    assert not device["online"] and device["model_version"] == 1  # the will keeps what was known
    assert [d["device_id"] for d in db.list_devices(group="lobby")] == ["cam-1"]  # the will keeps groups
    db.record_state("f", "cam-1", {"online": True, "groups": ["yard"], "pipelines": [
        {"name": "main", "model": {"path": "/m/birds.tflite", "version": "2"}}]})
    assert db.list_devices(group="lobby") == []
    assert db.get_device("cam-1")["model_version"] == 2


def test_deployment_bookkeeping(db):
    manifest = {"deployment_id": "d1", "model_name": "birds", "version": 2, "sha256": "b" * 64, "size": 10,
                "target": "all"}
    db.create_deployment(manifest, "sig", {"canary_pct": 10}, [["cam-1"], ["cam-2", "cam-3"]])
    db.set_target_state("d1", "cam-1", "active")
    db.set_target_state("d1", "cam-2", "failed", "validation_failed")
    deployment = db.get_deployment("d1")
    assert deployment["counts"] == {"active": 1, "failed": 1, "pending": 1}
    assert [(d["device_id"], d["wave"]) for d in deployment["devices"]] == [("cam-1", 0), ("cam-2", 1), ("cam-3", 1)]
    assert db.latest_version("birds") == 2 and db.latest_version("other") is None


def test_http_api_reads_the_database(db, tmp_path):
    db.record_telemetry("f", "cam-1", telemetry(1))
    with FleetHTTPServer(ArtifactStore(tmp_path / "store"), db) as server:
        with urllib.request.urlopen(f"{server.url}/api/devices") as response:
            devices = json.loads(response.read())
        with urllib.request.urlopen(f"{server.url}/api/devices/cam-1/telemetry?limit=5") as response:
            rows = json.loads(response.read())
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(f"{server.url}/api/deployments/nope")
    assert [d["device_id"] for d in devices] == ["cam-1"]
    assert rows[0]["seq"] == 1
    assert info.value.code == 404


def test_bad_database_url_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="cannot open fleet database"):
        FleetDB("nosuchdialect://x")
    with pytest.raises(ConfigError):
        FleetDB(f"sqlite:///{tmp_path}/missing-dir/deeper/fleet.db")


@pytest.mark.parametrize(("package", "code"), [
    ("sqlalchemy", "from edgeinfer.fleet.db import FleetDB\nFleetDB('sqlite:///:memory:')"),
    ("amqtt", "from edgeinfer.fleet.broker import EmbeddedBroker\nEmbeddedBroker(port=0).start()"),
])
def test_a_missing_fleet_package_names_the_pip_extra(package, code):
    done = run_without({package}, f"""
from edgeinfer.errors import MissingDependency
try:
{textwrap.indent(code, '    ')}
except MissingDependency as exc:
    print(exc)
""")
    assert done.returncode == 0 and done.stderr == "", done.stderr  # nothing left half-open behind it
    assert package in done.stdout and "pip install 'edgeinfer[fleet]'" in done.stdout
