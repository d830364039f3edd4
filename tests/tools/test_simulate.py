"""`edgeinfer fleet simulate` against a real Mosquitto: every message valid, seqs without gaps, deploy answers
with the agent's events, Last Wills on a kill, reconnects spread after a broker crash, the CLI; against a real
fleet manager and its managed Mosquitto: devices enrolled with `fleet enroll` and simulated with the credentials
it printed are listed, and publishes the broker's ACL refuses are counted as refused, not acked."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest
from support.broker import Collector
from support.fleet import admin_token_file
from support.ports import free_port
from support.processes import edgeinfer_cmd, env_with_repo
from support.processes import wait_until as wait

from edgeinfer.fleet.broker import ManagedMosquitto
from edgeinfer.fleet.manager import FleetManager, FleetSettings
from edgeinfer.link.protocol import Topics, decode, make_command
from edgeinfer.tools.simulate import Simulation, SimulationSettings, peak_per_second


@pytest.fixture
def broker(tmp_path):
    with ManagedMosquitto(tmp_path / "broker", port=0, allow_anonymous=True) as b:
        yield b


def test_every_message_is_valid_and_telemetry_has_no_gaps(broker):
    with Collector(broker.port, "edgeinfer/#") as fleet_side:
        assert fleet_side.wait_subscribed()
        sim = Simulation(SimulationSettings(broker=broker.url, devices=50, interval_s=0.2, duration_s=3, ramp_s=0.5,
                                            groups=("lobby",)))
        report = sim.run()
        assert fleet_side.wait_until(lambda c: len(c.of_kind("telemetry")) >= report.acked, 10)
    assert report.published == report.acked > 50 * 5 and report.dropped == 0
    for topic, body, _retained in fleet_side.messages:
        kind = topic.rsplit("/", 1)[1]
        decode(kind, json.dumps(body))  # ProtocolError if the simulator spoke anything but the protocol
    births = [m for m in fleet_side.of_kind("state") if m["online"]]
    assert len({m["device"] for m in births}) == 50 and births[0]["groups"] == ["lobby"]
    for device, info in report.per_device.items():
        seqs = sorted(m["seq"] for m in fleet_side.of_kind("telemetry") if m["device"] == device)
        assert seqs == list(range(1, info["seq_last"] + 1)), device


def test_deploy_commands_get_the_agents_update_events(broker):
    with Collector(broker.port, "edgeinfer/v1/+/+/events") as fleet_side:
        assert fleet_side.wait_subscribed()
        sim = Simulation(SimulationSettings(broker=broker.url, devices=20, fail_rate=0.25, seed=1, ramp_s=0.2,
                                            update_delay_s=(0.01, 0.05))).start()
        assert wait(lambda: sim.online == 20, 10)
        failing = set(sim.failing_devices())
        assert 0 < len(failing) < 20
        manifest = {"deployment_id": "dep-1", "version": 2, "sha256": "a" * 64, "url": "http://x/a"}
        for device in sim.device_ids():
            command = make_command("deploy-dep-1", "deploy", {"manifest": manifest, "signature": "sig"})
            fleet_side.publish(Topics("default", device).cmd, json.dumps(command))
            fleet_side.publish(Topics("default", device).cmd, json.dumps(command))  # a re-sent command runs once
        assert fleet_side.wait_until(lambda c: len(c.of_kind("events")) >= 60, 15)
        time.sleep(0.3)
        sim.stop()
    by_device: dict[str, list[str]] = {}
    for event in fleet_side.of_kind("events"):
        assert event["event"] == "update" and event["cmd_id"] == "deploy-dep-1"
        by_device.setdefault(event["device"], []).append(event["data"]["state"])
    for device in sim.device_ids():
        final = "failed" if device in failing else "active"
        assert by_device[device] == ["downloading", "validating", final], device
    assert sim.report().updates_active == 20 - len(failing)
    assert all(d.version == (1 if d.failing else 2) for d in sim.devices)


def test_kill_fires_every_last_will(broker):
    sim = Simulation(SimulationSettings(broker=broker.url, devices=10, ramp_s=0.1)).start()
    assert wait(lambda: sim.online == 10, 10)
    with Collector(broker.port, "edgeinfer/v1/+/+/state") as fleet_side:
        assert fleet_side.wait_subscribed()
        sim.kill()
        assert fleet_side.wait_until(lambda c: sum(not m["online"] for m in c.of_kind("state")) == 10, 15)


def test_after_a_broker_crash_devices_reconnect_spread_out(broker):
    sim = Simulation(SimulationSettings(broker=broker.url, devices=100, interval_s=0.5, ramp_s=0.5)).start()
    try:
        assert wait(lambda: sim.online == 100, 15)
        os.kill(broker.pid, signal.SIGKILL)
        assert wait(lambda: sim.online < 100, 10, 0.01)
        assert wait(lambda: sim.online == 100 and broker.restarts == 1, 60)
        time.sleep(1.5)
    finally:
        sim.stop()
    report = sim.report()
    assert report.connects >= 200
    reconnects = sorted(report.connect_times)[100:]
    assert max(reconnects) - min(reconnects) > 0.1, "reconnects must be spread by jitter, not all at once"
    assert report.acked == report.published and report.dropped == 0  # what was in flight at the crash was resent
    assert peak_per_second([0.0, 0.1, 0.5, 1.2, 1.3, 1.4, 1.5]) == 4


def test_the_cli_prints_a_json_summary_and_refuses_bad_arguments(broker):
    done = subprocess.run(edgeinfer_cmd("fleet", "simulate", "--devices", "5", "--duration", "2", "--interval",
                                        "0.5", "--broker", broker.url, "--json"),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["devices"] == 5 and summary["published"] == summary["acked"] > 0 and summary["refused"] == 0
    assert sorted(summary["per_device"]) == [f"sim-{i:05d}" for i in range(5)]
    assert {info["fleet"] for info in summary["per_device"].values()} == {"default"}  # as `fleet enroll`'s
    assert all(info["seq_first"] == 1 and info["boot_id"] for info in summary["per_device"].values())
    for args, message in ((["--devices", "0"], "devices"), (["--fail-rate", "2"], "fail-rate"),
                          (["--broker", "http://x"], "mqtt://")):
        base = {"--devices": "1", "--broker": broker.url}
        base.update(dict(zip(args[::2], args[1::2])))
        bad = subprocess.run(edgeinfer_cmd("fleet", "simulate", *[x for kv in base.items() for x in kv]),
                             capture_output=True, text=True, timeout=60)
        assert bad.returncode != 0 and message in bad.stderr, bad.stderr


# ------------------------------------------------------------------------- with a fleet manager and its accounts
@pytest.fixture
def managed(tmp_path):
    """A fleet manager with its managed Mosquitto (accounts and ACLs: enrolled devices only, own topics only)."""
    settings = FleetSettings(broker=None, broker_port=free_port(), http="127.0.0.1:0", data_dir=tmp_path / "fleet")
    with FleetManager(settings) as manager:
        assert manager.wait_connected(10), "the fleet manager did not connect to its Mosquitto"
        yield manager


def cli(manager: FleetManager, *args: str, timeout: float = 90) -> subprocess.CompletedProcess:
    return subprocess.run(edgeinfer_cmd(*args), capture_output=True, text=True, timeout=timeout,
                          env=env_with_repo(EDGEINFER_FLEET_URL=manager.http.url,
                                            EDGEINFER_FLEET_TOKEN_FILE=admin_token_file(manager)))


def enroll(manager: FleetManager, ids: list[str], path) -> list[dict]:
    """`fleet enroll ID... --json` as a new user runs it (no --fleet); its output saved to ``path``."""
    done = cli(manager, "fleet", "enroll", *ids, "--json")
    assert done.returncode == 0, done.stderr
    path.write_text(done.stdout)
    return json.loads(done.stdout)


def test_devices_enrolled_with_fleet_enroll_are_listed_when_simulated_with_its_credentials(managed, tmp_path):
    """The issue's new user: enrol 12 devices, pass the printed credentials to the simulator, no --fleet."""
    ids = [f"sim-{i:05d}" for i in range(12)]
    issued = enroll(managed, ids, tmp_path / "credentials.json")
    assert {e["fleet"] for e in issued} == {"default"}
    done = cli(managed, "fleet", "simulate", "--devices", "12", "--broker", managed.broker_url, "--credentials",
               str(tmp_path / "credentials.json"), "--duration", "3", "--interval", "0.5", "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    summary = json.loads(done.stdout)
    assert summary["refused"] == 0 and summary["published"] == summary["acked"] > 12, summary
    assert {info["fleet"] for info in summary["per_device"].values()} == {"default"}
    listed = cli(managed, "fleet", "devices", "--json")
    assert listed.returncode == 0, listed.stderr
    devices = {d["device_id"]: d for d in json.loads(listed.stdout)}
    assert sorted(devices) == ids, sorted(devices)
    assert all(devices[i]["fleet"] == "default" and devices[i]["last_telemetry"] for i in ids)

    # a --fleet the credentials contradict is refused before anything connects; the same one is accepted
    other = cli(managed, "fleet", "simulate", "--devices", "12", "--broker", managed.broker_url, "--credentials",
                str(tmp_path / "credentials.json"), "--fleet", "sim", "--duration", "0")
    assert other.returncode == 2 and "contradicts the credentials" in other.stderr, other.stderr
    assert "sim-00000 is enrolled in fleet 'default'" in other.stderr, other.stderr
    with pytest.raises(ValueError, match="contradicts"):
        SimulationSettings(broker=managed.broker_url, devices=1, fleet="sim",
                           credentials={"sim-00000": ("u", "p", "default")})
    same = SimulationSettings(broker=managed.broker_url, devices=1, fleet="default",
                              credentials={"sim-00000": ("u", "p", "default")})
    assert same.fleet_of("sim-00000") == "default"


def test_publishes_the_brokers_acl_refuses_are_counted_as_refused_not_acked(managed, tmp_path):
    """Credentials of fleet `default` used with the topics of fleet `other` (the credentials file's fleet edited):
    the broker's ACL refuses every message (MQTT 5 PUBACK 0x87 Not authorized); the simulator counts, shows and
    fails on it, and the manager lists no device."""
    ids = [f"sim-{i:05d}" for i in range(3)]
    issued = enroll(managed, ids, tmp_path / "credentials.json")
    (tmp_path / "credentials.json").write_text(json.dumps([{**e, "fleet": "other"} for e in issued]))
    done = cli(managed, "fleet", "simulate", "--devices", "3", "--broker", managed.broker_url, "--credentials",
               str(tmp_path / "credentials.json"), "--duration", "2", "--interval", "0.25", "--json")
    summary = json.loads(done.stdout)
    assert summary["connects"] == 3 and summary["published"] > 3, summary  # connected, publishing
    assert summary["acked"] == 0 and summary["refused"] == summary["published"], summary
    assert all(info["refused"] > 0 and info["acked"] == 0 for info in summary["per_device"].values())
    assert done.returncode == 1, done.stderr
    assert f"the broker refused {summary['refused']} of {summary['published']}" in done.stderr, done.stderr
    assert "Not authorized" in done.stderr and "0x87" in done.stderr, done.stderr
    assert managed.db.list_devices() == []

    # the progress line and the summary say it too
    done = cli(managed, "fleet", "simulate", "--devices", "1", "--broker", managed.broker_url, "--credentials",
               str(tmp_path / "credentials.json"), "--duration", "5.5", "--interval", "0.25")
    assert done.returncode == 1, done.stderr
    progress = [line for line in done.stderr.splitlines() if "msg/s" in line]
    assert progress and "acked 0  refused " in progress[-1] and "refused 0 " not in progress[-1], done.stderr
    assert ", acked 0, refused " in done.stdout, done.stdout
