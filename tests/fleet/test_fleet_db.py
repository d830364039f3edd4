"""The fleet database on a real SQLite file and a real PostgreSQL: ingest, de-duplication, roll-ups,
retention, deployments, leases, HTTP API."""

from __future__ import annotations

import json
import random
import textwrap
import threading
import urllib.request

import pytest
from support.fleet import api_server
from support.processes import run_without

from edgeinfer.errors import ConfigError
from edgeinfer.fleet.auth import TokenStore
from edgeinfer.fleet.db import FleetDB


@pytest.fixture
def db(db_url):
    database = FleetDB(db_url)
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


def test_a_sqlite_commit_is_on_disk_before_it_returns(tmp_path):
    """Ingest acknowledges a batch once its commit returns: WAL with synchronous=FULL (2), not NORMAL (1),
    on every pooled connection."""
    database = FleetDB(f"sqlite:///{tmp_path / 'fleet.db'}")
    try:
        with database.engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA synchronous").scalar() == 2
            assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
    finally:
        database.close()


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
    assert not db.advance_target("d1", "cam-1", "active")  # never notified: no answer counts
    for device in ("cam-1", "cam-2"):
        assert db.advance_target("d1", device, "notified", now=100.0)
    assert db.advance_target("d1", "cam-1", "active")
    assert db.advance_target("d1", "cam-2", "failed", "validation_failed")
    assert not db.advance_target("d1", "cam-2", "active")  # finished is final
    assert not db.advance_target("d1", "cam-1", "failed")
    assert db.advance_target("d1", "cam-1", "rolled_back", "latency_regression")  # after a trial seen as active
    assert db.advance_target("d1", "cam-1", "active") is False
    assert not db.advance_target("d1", "cam-1", "notified")  # nothing moves it back
    assert db.advance_target("d1", "cam-3", "notified", now=100.0) and db.advance_target("d1", "cam-3", "active")
    deployment = db.get_deployment("d1")
    assert deployment["counts"] == {"rolled_back": 1, "failed": 1, "active": 1}
    assert [(d["device_id"], d["wave"]) for d in deployment["devices"]] == [("cam-1", 0), ("cam-2", 1), ("cam-3", 1)]
    assert deployment["devices"][1]["detail"] == "validation_failed" and deployment["devices"][1]["notified_at"] == 100
    assert [d["deployment_id"] for d in db.running_deployments()] == ["d1"]
    db.set_deployment_status("d1", "succeeded")
    assert db.running_deployments() == []


def test_leases_go_to_one_owner_until_they_run_out(db):
    manifest = {"deployment_id": "d1", "model_name": "m", "version": 2, "sha256": "b" * 64, "size": 1, "target": "all"}
    db.create_deployment(manifest, "sig", {}, [["cam-1"]])
    assert db.try_lease("d1", "a", 10, now=100.0)
    assert not db.try_lease("d1", "b", 10, now=105.0)
    assert db.try_lease("d1", "a", 10, now=105.0)  # renewed to 115
    assert not db.try_lease("d1", "b", 10, now=114.0)
    assert db.try_lease("d1", "b", 10, now=116.0)  # a stopped renewing
    db.release_lease("d1", "a")  # not a's any more: nothing happens
    assert not db.try_lease("d1", "a", 10, now=117.0)
    db.release_lease("d1", "b")
    assert db.try_lease("d1", "a", 10, now=117.0)
    db.set_deployment_status("d1", "aborted", "x")
    assert not db.try_lease("d1", "a", 10, now=118.0)  # only running deployments are driven


def test_many_owners_racing_for_a_lease_get_exactly_one(db):
    manifest = {"deployment_id": "d1", "model_name": "m", "version": 2, "sha256": "b" * 64, "size": 1, "target": "all"}
    db.create_deployment(manifest, "sig", {}, [["cam-1"]])
    winners: list[str] = []
    start = threading.Barrier(8)

    def contend(owner: str) -> None:
        start.wait()
        if db.try_lease("d1", owner, 60, now=1000.0):
            winners.append(owner)

    threads = [threading.Thread(target=contend, args=(f"owner-{i}",)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(winners) == 1


def full_telemetry(device: str, boot: str, seq: int, *, fps: float, p95: float | None) -> dict:
    stages = {"latency": {"p50": 1.0, "p95": p95, "p99": 2.0}} if p95 is not None else {}
    return {"v": 1, "type": "telemetry", "fleet": "f", "device": device, "ts": 1_700_000_000.0 + seq,
            "boot_id": boot, "seq": seq, "interval_s": 1.0,
            "pipelines": [{"name": "main", "status": "running", "frames": 30, "dropped": seq % 3, "fps": fps,
                           "stages": stages}],
            "system": {"cpu_percent": 1.0, "rss_bytes": 1}, "spool": {"pending": 0, "dropped": 0}}


def test_batches_store_each_message_once_and_roll_up_only_what_was_stored(db):
    """10,000 messages in batches of 500, a fifth of them redelivered (in the same batch or a later one)."""
    rng = random.Random(3)
    devices = [f"cam-{i:02d}" for i in range(20)]
    messages = [("f", d, full_telemetry(d, "b" * 32, seq, fps=rng.uniform(5, 30),
                                         p95=None if seq % 7 == 0 else rng.uniform(1, 50)))
                for seq in range(1, 501) for d in devices]
    stream = messages + rng.sample(messages, 2000)
    rng.shuffle(stream)
    stored = duplicates = 0
    for start in range(0, len(stream), 500):
        s, dup = db.store_telemetry(stream[start:start + 500])
        stored, duplicates = stored + s, duplicates + dup
    assert (stored, duplicates) == (10_000, 2000)
    for device in ("cam-00", "cam-13"):
        mine = [m for _, d, m in messages if d == device]
        by_minute: dict[int, list[dict]] = {}
        for m in mine:
            by_minute.setdefault(int(m["ts"] // 60), []).append(m)
        rollups = {r["minute"]: r for r in db.device_rollups(device)}
        assert sorted(rollups) == sorted(by_minute)
        for minute, group in by_minute.items():
            p95s = [m["pipelines"][0]["stages"]["latency"]["p95"] for m in group if m["pipelines"][0]["stages"]]
            assert rollups[minute]["samples"] == len(group)
            assert rollups[minute]["fps_sum"] == pytest.approx(sum(m["pipelines"][0]["fps"] for m in group))
            assert rollups[minute]["dropped_sum"] == sum(m["pipelines"][0]["dropped"] for m in group)
            assert rollups[minute]["latency_p95_max_ms"] == pytest.approx(max(p95s) if p95s else None)
    assert db.get_device("cam-05")["last_telemetry"]["seq"] == 500


def test_two_writers_with_overlapping_batches_store_each_message_once(db_url):
    writers = [FleetDB(db_url), FleetDB(db_url)]
    devices = [f"cam-{i:02d}" for i in range(10)]
    messages = [("f", d, full_telemetry(d, "c" * 32, seq, fps=10.0, p95=5.0)) for seq in range(1, 301) for d in devices]
    results: list[tuple[int, int]] = []

    def write(db: FleetDB, seed: int) -> None:
        rng = random.Random(seed)
        mine = messages[:]
        rng.shuffle(mine)
        for start in range(0, len(mine), 200):
            results.append(db.store_telemetry(mine[start:start + 200]))

    threads = [threading.Thread(target=write, args=(w, i)) for i, w in enumerate(writers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sum(s for s, _ in results) == len(messages) and sum(d for _, d in results) == len(messages)
    keys = [(d, m["seq"]) for d in devices for m in writers[0].device_telemetry(d, 10_000)]
    assert len(keys) == len(set(keys)) == len(messages)
    assert sum(r["samples"] for d in devices for r in writers[0].device_rollups(d)) == len(messages)
    for w in writers:
        w.close()


def test_retention_deletes_by_age(db):
    day = 86_400.0
    now = 1_800_000_000.0
    for age_days, seq in ((10, 1), (8, 2), (3, 3), (0.5, 4)):
        message = full_telemetry("cam-1", "d" * 32, seq, fps=1.0, p95=1.0) | {"ts": now - age_days * day}
        db.store_telemetry([("f", "cam-1", message)])
        db.store_events([("f", "cam-1", {"event": "fallback", "ts": now - age_days * 10 * day})])
    for age_days in (400, 366, 30):
        db.audit_many([{"actor": "ops", "role": "operator", "action": "deployment.create", "target": "x",
                        "remote": "127.0.0.1", "detail": {}}], now=now - age_days * day)
    deleted = db.prune(raw_max_age_s=7 * day, rollup_max_age_s=90 * day, now=now, batch=1)
    assert deleted == {"telemetry": 2, "telemetry_rollup": 0, "events": 1, "audit_log": 2,  # a year's audit kept
                       "commands": 0}
    assert [m["seq"] for m in db.device_telemetry("cam-1")] == [3, 4]
    assert len(db.device_rollups("cam-1")) == 4  # roll-ups stay longer
    assert db.prune(raw_max_age_s=7 * day, rollup_max_age_s=5 * day, now=now)["telemetry_rollup"] == 2


def test_http_api_reads_the_database(db, tmp_path):
    db.record_telemetry("f", "cam-1", telemetry(1))
    tokens = TokenStore(db)
    viewer = {"Authorization": f"Bearer {tokens.create(name='dashboard', role='viewer')['token']}"}

    def get(path: str):
        return urllib.request.urlopen(urllib.request.Request(f"{server.url}{path}", headers=viewer))

    with api_server(db, tmp_path / "api") as (server, _):
        with get("/api/devices") as response:
            devices = json.loads(response.read())
        with get("/api/devices/cam-1/telemetry?limit=5") as response:
            rows = json.loads(response.read())
        with pytest.raises(urllib.error.HTTPError) as info:
            get("/api/deployments/nope")
    assert [d["device_id"] for d in devices] == ["cam-1"]
    assert rows[0]["seq"] == 1
    assert info.value.code == 404


def test_bad_database_url_is_a_config_error(tmp_path, postgres):
    with pytest.raises(ConfigError, match="cannot open fleet database"):
        FleetDB("nosuchdialect://x")
    with pytest.raises(ConfigError):
        FleetDB(f"sqlite:///{tmp_path}/missing-dir/deeper/fleet.db")
    with pytest.raises(ConfigError, match="cannot open fleet database"):
        FleetDB(postgres.url_for("no_such_database"))


@pytest.mark.parametrize(("package", "code"), [
    ("sqlalchemy", "from edgeinfer.fleet.db import FleetDB\nFleetDB('sqlite:///:memory:')"),
    ("alembic", "from edgeinfer.fleet.db import FleetDB\nFleetDB('sqlite:///:memory:')"),
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


@pytest.mark.parametrize(("package", "command"), [("fastapi", "fleet serve"), ("pydantic", "deploy")])
def test_the_fleet_commands_name_the_pip_extra_they_need(package, command, tmp_path):
    """`edgeinfer fleet ...` is where the fleet manager's packages are imported: one line naming the extra."""
    model = tmp_path / "m.tflite"
    args = ["fleet", "serve", "--data-dir", str(tmp_path / "data")] if command == "fleet serve" else \
        ["deploy", str(model), "--version", "2", "--all"]
    model.write_bytes(b"not a model at all")
    done = run_without({package}, f"""
import sys
from edgeinfer.cli import main
sys.argv = ["edgeinfer", *{args!r}]
main()
""")
    assert done.returncode == 1 and package in done.stderr and "pip install 'edgeinfer[fleet]'" in done.stderr, \
        done.stderr
    assert done.stderr.count("\n") == 1  # one line, no traceback


def test_commands_take_their_devices_first_answer_once_and_count_a_captures_samples_once(db):
    """The verdicts' SQL on both databases (fleet/db/commands.py): a command re-sent keeps its record, a device's
    answer moves only its own command still sent, a sample counts once, old records go."""
    import time

    now = time.time()
    db.record_state("f", "cam-1", {"online": True, "groups": []})
    sent = {"device_id": "cam-1", "cmd": "capture", "pipeline": "door", "summary": {"frames": 2}, "sent_by": "ops",
            "expires_at": now + 60}
    assert db.commands.record({"command_id": "c1", **sent}) and not db.commands.record({"command_id": "c1", **sent})
    db.commands.record({"command_id": "c2", **sent, "cmd": "ping", "pipeline": None})
    answer = {"event": "cmd_result", "cmd_id": "c1", "ts": now, "data": {"ok": True, "result": {"frames": 2}}}
    other = {"event": "cmd_rejected", "cmd_id": "c2", "ts": now, "data": {"reason": "failed"}, "message": "x"}
    db.store_events([("f", "cam-2", other)])  # another device cannot answer cam-1's command
    db.store_events([("f", "cam-1", answer), ("f", "cam-1", answer)])
    db.store_events([("f", "cam-1", {**other, "cmd_id": "c1"})])  # a later contradicting answer changes nothing
    found = db.commands.get("c1")
    assert (found["state"], found["result"], found["reason"]) == ("applied", {"frames": 2}, None)
    assert db.commands.get("c2")["state"] == "sent"
    for _ in range(2):  # a retried upload counts once
        db.commands.count_sample("cam-1", "s1", "c1", "stored")
        db.commands.count_sample("cam-1", "s2", "c1", "duplicate")
    found = db.commands.get("c1")
    assert (found["samples_stored"], found["samples_duplicates"]) == (1, 1)
    assert [c["command_id"] for c in db.commands.of_device("cam-1", cmd="capture", pipeline="door")] == ["c1"]
    assert {c["command_id"] for c in db.commands.changed(now - 5, time.time() + 1)} == {"c1", "c2"}
    assert db.commands.changed(time.time() + 5, time.time() + 6) == []
    assert db.prune(now=now + 100 * 86_400.0)["commands"] == 2 and db.commands.get("c1") is None


def test_telemetry_does_not_bring_a_device_its_state_says_is_offline_back_online(db):
    """An agent that stops sends its last window after its offline state: the state decides."""
    db.record_telemetry("f", "cam-new", telemetry(1))
    assert db.get_device("cam-new")["online"]  # first heard of by its telemetry: online
    db.record_state("f", "cam-1", {"online": True, "groups": []})
    db.record_state("f", "cam-1", {"online": False, "reason": "shutdown"})
    db.record_telemetry("f", "cam-1", telemetry(2))
    device = db.get_device("cam-1")
    assert not device["online"] and device["last_telemetry"]["seq"] == 2


def test_the_lines_and_zones_a_device_applied_only_move_forward(db):
    key = ("cam-1", "door", "")
    db.record_state("f", "cam-1", {"online": True, "groups": []})
    for _ in range(2):
        db.save_analytics(key, {"a": [0, 0, 5, 5]}, {}, command_id="c-2")

    def changed(revision: int, lines: dict) -> dict:
        data = {"pipeline": "door", "stream": "", "revision": revision, "lines": lines, "zones": {}}
        return {"event": "analytics_changed", "ts": 1.0, "data": data}

    db.store_events([("f", "cam-1", changed(2, {"a": [0, 0, 5, 5]})), ("f", "cam-1", changed(1, {"old": [1, 1, 2, 2]})),
                     ("f", "cam-1", changed(3, {"bad": "not a line"}))])  # an older revision; a malformed one
    row = db.analytics(key)
    assert (row["revision"], row["command_id"], row["applied_revision"], row["applied_lines"]) == (
        2, "c-2", 2, {"a": [0, 0, 5, 5]})
