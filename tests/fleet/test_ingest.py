"""Ingest against a real Mosquitto: past the queue's bound the broker holds back (nothing dropped), the
counters add up on /metrics, a manager restart loses nothing, and two managers store each message once."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid

import pytest
from support.broker import Collector
from support.fleet import api_get
from support.processes import wait_until as wait

from edgeinfer.fleet.broker import ManagedMosquitto
from edgeinfer.fleet.manager import FleetManager, FleetSettings
from edgeinfer.link.protocol import Topics


@pytest.fixture
def broker(tmp_path):
    """The broker as `fleet serve` runs it (Mosquitto's default 1000-message queue per client would drop a burst)."""
    with ManagedMosquitto(tmp_path / "broker", port=0, allow_anonymous=True) as b:
        yield b


def telemetry(device: str, boot: str, seq: int) -> bytes:
    return json.dumps({
        "v": 1, "type": "telemetry", "fleet": "f", "device": device, "ts": time.time(), "boot_id": boot,
        "seq": seq, "interval_s": 1.0,
        "pipelines": [{"name": "main", "status": "running", "frames": 30, "dropped": 0, "fps": 30.0,
                       "stages": {"latency": {"p50": 5.0, "p95": 9.0, "p99": 12.0}}}],
        "system": {"cpu_percent": 20.0, "rss_bytes": 1000}, "spool": {"pending": 0, "dropped": 0}}).encode()


def publish_burst(port: int, devices: list[str], per_device: int, boots: dict[str, str]) -> int:
    """Publish at QoS 1 as fast as the broker takes it (200 in flight); returns how many."""
    import paho.mqtt.client as paho

    publisher = paho.Client(paho.CallbackAPIVersion.VERSION2, client_id=f"burst-{uuid.uuid4().hex[:6]}")
    publisher.max_inflight_messages_set(200)
    publisher.connect("127.0.0.1", port)
    publisher.loop_start()
    try:
        infos = [publisher.publish(Topics("f", d).telemetry, telemetry(d, boots[d], seq), qos=1)
                 for seq in range(1, per_device + 1) for d in devices]
        for info in infos:
            info.wait_for_publish(30)
    finally:
        publisher.disconnect()
        publisher.loop_stop()
    return len(infos)


def stored_keys(manager: FleetManager, devices: list[str]) -> list[tuple[str, str, int]]:
    return [(d, m["boot_id"], m["seq"]) for d in devices for m in manager.db.device_telemetry(d, 100_000)]


def manager_on(broker_url: str, data_dir, **overrides) -> FleetManager:
    return FleetManager(FleetSettings(broker=broker_url, http="127.0.0.1:0", data_dir=data_dir, **overrides))


def test_a_burst_past_the_queue_bound_is_held_back_not_dropped(tmp_path, broker):
    devices = [f"cam-{i:02d}" for i in range(20)]
    boots = {d: uuid.uuid4().hex for d in devices}
    with manager_on(broker.url, tmp_path / "fleet", ingest_queue=20, ingest_batch=10) as manager:
        assert manager.wait_connected(10)
        time.sleep(0.5)  # subscribed
        published = publish_burst(broker.port, devices, 100, boots)
        assert wait(lambda: manager.ingest.stats.stored["telemetry"] >= published, 60)
        keys = stored_keys(manager, devices)
        assert len(keys) == len(set(keys)) == published == 2000
        stats = manager.ingest.stats
        assert stats.received["telemetry"] == stats.stored["telemetry"] + stats.duplicates
        assert stats.invalid == 0 and stats.write_errors == 0
        metrics = api_get(manager, "/metrics").decode()
        assert 'edgeinfer_fleet_messages_stored_total{kind="telemetry"} 2000.0' in metrics
        assert "edgeinfer_fleet_ingest_queue_capacity 20.0" in metrics
        assert "edgeinfer_fleet_messages_invalid_total 0.0" in metrics
        assert 'python_gc_collections_total{generation="0"}' in metrics and "process_resident_memory_bytes" in metrics


def test_the_serving_process_tunes_its_garbage_collector():
    """What ``fleet serve`` calls once started (in a child: the collector is the whole process's)."""
    code = ("import gc\nfrom edgeinfer.fleet.ingest import GC_YOUNG_THRESHOLD, tune_garbage_collector\n"
            "before = gc.get_threshold()\ntune_garbage_collector()\n"
            "print(gc.get_threshold() == (GC_YOUNG_THRESHOLD, *before[1:]), gc.get_freeze_count() > 1000)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.split() == ["True", "True"], done.stderr


def test_what_arrives_while_the_manager_is_down_is_stored_when_it_is_back(tmp_path, broker):
    """The manager's persistent session keeps its share at the broker; nothing is stored twice."""
    devices = ["cam-a", "cam-b"]
    boots = {d: uuid.uuid4().hex for d in devices}
    with manager_on(broker.url, tmp_path / "fleet") as manager:
        assert manager.wait_connected(10)
        time.sleep(0.5)
    publish_burst(broker.port, devices, 150, boots)  # the manager is away
    with manager_on(broker.url, tmp_path / "fleet") as manager:
        assert wait(lambda: len(stored_keys(manager, devices)) >= 300, 30)
        time.sleep(0.5)
        keys = stored_keys(manager, devices)
        assert len(keys) == len(set(keys)) == 300


def test_two_managers_share_the_stream_and_store_each_message_once(tmp_path, broker):
    devices = [f"cam-{i:02d}" for i in range(10)]
    boots = {d: uuid.uuid4().hex for d in devices}
    db = f"sqlite:///{tmp_path / 'shared.sqlite3'}"
    with manager_on(broker.url, tmp_path / "a", db_url=db, manager_id="fleet-a", shared_group="fleet") as a, \
            manager_on(broker.url, tmp_path / "b", db_url=db, manager_id="fleet-b", shared_group="fleet") as b:
        assert a.wait_connected(10) and b.wait_connected(10)
        time.sleep(0.5)
        published = publish_burst(broker.port, devices, 60, boots)
        assert wait(lambda: a.ingest.stats.stored["telemetry"] + b.ingest.stats.stored["telemetry"]
                    + a.ingest.stats.duplicates + b.ingest.stats.duplicates >= published, 30)
        keys = stored_keys(a, devices)
        assert len(keys) == len(set(keys)) == published
        shares = (a.ingest.stats.received["telemetry"], b.ingest.stats.received["telemetry"])
        assert sum(shares) == published and min(shares) > 0, f"shared subscription split {shares}"


def test_malformed_messages_are_counted_and_acknowledged(tmp_path, broker):
    with manager_on(broker.url, tmp_path / "fleet") as manager:
        assert manager.wait_connected(10)
        time.sleep(0.5)
        with Collector(broker.port, "nothing/#") as device:
            assert device.wait_subscribed()
            topics = Topics("f", "cam-x")
            for payload in (b"{", b"[]", json.dumps({"v": 1}).encode(), b"\xff\xfe", b"x" * 300_000):
                device.publish(topics.telemetry, payload)
            device.publish(topics.telemetry, telemetry("cam-x", uuid.uuid4().hex, 1))
        assert wait(lambda: manager.ingest.stats.invalid == 5 and manager.ingest.stats.stored["telemetry"] == 1, 10)
    # acknowledged: a new session does not get them again
    with manager_on(broker.url, tmp_path / "fleet") as manager:
        time.sleep(1.5)
        assert manager.ingest.stats.invalid == 0


def test_a_database_outage_holds_messages_unacknowledged_then_stores_them(tmp_path, broker):
    """PostgreSQL stopped under a running manager: batches fail and are retried, nothing is acknowledged
    or lost; when it is back, every message is stored exactly once."""
    from support.postgres import PostgresServer

    postgres = PostgresServer(tmp_path / "pg").start()
    try:
        db_url = postgres.create_database()
        devices = ["cam-a", "cam-b", "cam-c"]
        boots = {d: uuid.uuid4().hex for d in devices}
        with manager_on(broker.url, tmp_path / "fleet", db_url=db_url) as manager:
            assert manager.wait_connected(10)
            time.sleep(0.5)
            stats = manager.ingest.stats
            publish_burst(broker.port, devices, 50, {d: boots[d] for d in devices})
            assert wait(lambda: stats.stored["telemetry"] == 150, 20)
            postgres.stop("fast")
            second = {d: uuid.uuid4().hex for d in devices}  # a new boot of each device: 150 more
            publish_burst(broker.port, devices, 50, second)
            assert wait(lambda: stats.write_errors >= 2, 30)
            assert stats.stored["telemetry"] == 150
            postgres.start()
            assert wait(lambda: stats.stored["telemetry"] + stats.duplicates >= 300, 60)
            keys = stored_keys(manager, devices)
            assert len(keys) == len(set(keys)) == 300
            metrics = api_get(manager, "/metrics").decode()
            assert f"edgeinfer_fleet_ingest_write_errors_total {float(stats.write_errors)}" in metrics
    finally:
        postgres.stop("immediate")


_REFUSE_ONE = {
    "sqlite": ["CREATE TRIGGER refuse_one BEFORE INSERT ON telemetry WHEN NEW.device_id = 'cam-b' AND NEW.seq = 13 "
               "BEGIN SELECT RAISE(ABORT, 'refused by the test'); END"],
    "postgresql": ["CREATE FUNCTION refuse_one() RETURNS trigger AS $$ BEGIN IF NEW.device_id = 'cam-b' AND "
                   "NEW.seq = 13 THEN RAISE EXCEPTION 'refused by the test' USING ERRCODE = 'check_violation'; "
                   "END IF; RETURN NEW; END $$ LANGUAGE plpgsql",
                   "CREATE TRIGGER refuse_one BEFORE INSERT ON telemetry FOR EACH ROW EXECUTE FUNCTION refuse_one()"],
}


def test_a_message_the_database_refuses_is_set_aside_and_the_rest_stored(tmp_path, broker, db_url):
    """A row the database refuses (here a trigger; in the wild a value out of a column's range) must not
    hold up the fleet's ingest for ever: it is found, counted invalid and acknowledged; the rest is stored."""
    import sqlalchemy as sa

    devices = ["cam-a", "cam-b", "cam-c"]
    boots = {d: uuid.uuid4().hex for d in devices}
    with manager_on(broker.url, tmp_path / "fleet", db_url=db_url) as manager:
        with manager.db.engine.begin() as conn:
            for statement in _REFUSE_ONE[manager.db.engine.dialect.name]:
                conn.execute(sa.text(statement))
        assert manager.wait_connected(10)
        time.sleep(0.5)
        stats = manager.ingest.stats
        published = publish_burst(broker.port, devices, 30, boots)
        assert wait(lambda: stats.stored["telemetry"] + stats.invalid >= published, 20)
        assert (stats.stored["telemetry"], stats.invalid, stats.write_errors) == (published - 1, 1, 0)
        keys = set(stored_keys(manager, devices))
        assert ("cam-b", boots["cam-b"], 13) not in keys and ("cam-b", boots["cam-b"], 14) in keys
    with manager_on(broker.url, tmp_path / "fleet", db_url=db_url) as manager:  # acknowledged: not sent again
        assert manager.wait_connected(10)
        time.sleep(1.0)
        assert manager.ingest.stats.received["telemetry"] == 0


class Acks:
    """Deliveries' acknowledgements, in order (what the link would send as PUBACKs)."""

    def __init__(self) -> None:
        self.acked: list[str] = []

    def delivery(self, name: str):
        return type("Delivery", (), {"ack": lambda _self: self.acked.append(name)})()


def test_messages_within_the_linger_share_one_batch_and_a_devices_states_apply_in_order(tmp_path):
    """A transaction costs the writer the same however little it holds: what comes within ``linger_s`` of a batch's
    first message joins it. A device's birth and then its Last Will in one batch leave it offline with the birth's
    groups, as if written one after the other; each is acknowledged only once the batch is stored."""
    from support.fleet import state_message

    from edgeinfer.fleet.db import FleetDB
    from edgeinfer.fleet.ingest import Ingest

    db = FleetDB(f"sqlite:///{tmp_path / 'fleet.sqlite3'}")
    acks = Acks()
    ingest = Ingest(db, linger_s=3.0).start()
    try:
        birth = state_message("cam-1", "1" * 32, groups=("lobby",))
        ingest.deliver(Topics("f", "cam-1").state, json.dumps(birth).encode(), acks.delivery("birth"))
        time.sleep(0.3)
        assert acks.acked == [] and db.get_device("cam-1") is None  # held for company, not acknowledged
        will = {"v": 1, "type": "state", "fleet": "f", "device": "cam-1", "ts": time.time(), "online": False,
                "boot_id": "1" * 32, "reason": "connection lost"}
        ingest.deliver(Topics("f", "cam-1").state, json.dumps(will).encode(), acks.delivery("will"))
        ingest.deliver(Topics("f", "cam-2").state, json.dumps(state_message("cam-2", "2" * 32)).encode(),
                       acks.delivery("other"))
        assert wait(lambda: len(acks.acked) == 3, 10)
        assert ingest.stats.batches == 1 and ingest.stats.stored["state"] == 3
        device = db.get_device("cam-1")
        assert device["online"] is False and device["groups"] == ["lobby"] and device["state"]["online"] is False
        assert db.get_device("cam-2")["online"] is True
        # closing while a batch waits for company stores and acknowledges it, without waiting out the linger
        ingest.linger_s = 60.0
        ingest.deliver(Topics("f", "cam-3").state, json.dumps(state_message("cam-3", "3" * 32)).encode(),
                       acks.delivery("last"))
        time.sleep(0.3)
    finally:
        ingest.close(timeout=20)
    assert acks.acked[-1] == "last" and db.get_device("cam-3")["online"] is True
