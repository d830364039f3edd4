"""The fleet manager against a real Mosquitto: ingest, malformed input, commands, rollout control.

The devices here are plain MQTT clients speaking the protocol; test_deploy.py runs real agents.
"""

from __future__ import annotations

import json
import time
import uuid

import pytest
from support.assets import MODELS
from support.broker import Collector
from support.fleet import admin_client, state_message, telemetry_message
from support.processes import wait_until as wait

from edgeinfer.fleet.api.schemas import DeploymentSpec
from edgeinfer.fleet.client import FleetClient
from edgeinfer.link.protocol import Topics


def event(device: str, boot: str, seq: int, name: str, cmd_id: str, data: dict) -> dict:
    return {"v": 1, "type": "event", "fleet": "f", "device": device, "ts": time.time(), "boot_id": boot,
            "seq": seq, "event": name, "level": "info", "message": name, "cmd_id": cmd_id, "data": data}


def test_ingest_deduplicates_and_ignores_malformed(manager, broker):
    boot = uuid.uuid4().hex
    topics = Topics("f", "cam-1")
    with Collector(broker.port) as device:
        assert device.wait_subscribed()
        device.publish(topics.state, json.dumps(state_message("cam-1", boot)))
        for seq in (1, 2, 2, 3):  # 2 arrives twice, as a QoS 1 redelivery would
            device.publish(topics.telemetry, json.dumps(telemetry_message("cam-1", boot, seq)))
        device.publish(topics.telemetry, b"{not json")
        device.publish(topics.telemetry, json.dumps({"v": 1, "type": "telemetry"}))
        device.publish("edgeinfer/v1/f/cam-1/bogus", b"{}")
        assert wait(lambda: len(manager.db.device_telemetry("cam-1")) == 3 and manager.rejected_messages >= 2)
    client = admin_client(manager)
    (listed,) = client.devices()
    assert listed["device_id"] == "cam-1" and listed["online"] and listed["model_version"] == 1
    assert [m["seq"] for m in manager.db.device_telemetry("cam-1")] == [1, 2, 3]
    assert manager.db.device_rollups("cam-1")[0]["samples"] == 3


def test_canary_failure_stops_the_rollout(manager, broker):
    """Simulated devices answer the deploy command; the canary fails, nobody else hears of it."""
    devices = [f"cam-{i:02d}" for i in range(10)]
    boots = {d: uuid.uuid4().hex for d in devices}
    with Collector(broker.port) as fleet_side:
        assert fleet_side.wait_subscribed()
        for d in devices:
            fleet_side.publish(Topics("f", d).state, json.dumps(state_message(d, boots[d])))
        assert wait(lambda: len(manager.db.list_devices()) == 10)
        sha, _ = manager.store.put(MODELS / "mobilenet_v2_1.0_224_inat_bird_quant.tflite")
        created = manager.deployments.create(DeploymentSpec(sha256=sha, model_name="birds.tflite", version=2,
                                                            all=True, canary_pct=10, wave_size=3,
                                                            abort_failure_rate=0, device_timeout_s=30))
        deployment_id = created["deployment_id"]
        canary = [t["device_id"] for t in created["devices"] if t["wave"] == 0]
        assert len(canary) == 1
        assert wait(lambda: len(fleet_side.of_kind("cmd")) == 1)
        (command,) = fleet_side.of_kind("cmd")
        assert command["cmd"] == "deploy" and command["args"]["manifest"]["version"] == 2
        fleet_side.publish(Topics("f", canary[0]).events, json.dumps(event(
            canary[0], boots[canary[0]], 1, "update", command["id"],
            {"deployment_id": deployment_id, "state": "failed", "reason": "validation_failed"})))
        assert wait(lambda: manager.deployments.get(deployment_id)["status"] == "aborted")
        time.sleep(0.5)
        assert len(fleet_side.of_kind("cmd")) == 1  # no other device was notified
    final = manager.deployments.get(deployment_id)
    assert final["counts"] == {"failed": 1, "pending": 9}
    assert "threshold" in final["detail"]


def test_deploy_api_errors(manager):
    client = admin_client(manager)
    with pytest.raises(Exception, match="no artifact"):
        client.create_deployment(DeploymentSpec(sha256="0" * 64, version=2, all=True))
    artifact = client.upload(MODELS / "mobilenet_v2_1.0_224_inat_bird_quant.tflite")
    with pytest.raises(Exception, match="no device"):
        client.create_deployment(DeploymentSpec(sha256=artifact["sha256"], version=2, all=True))
    with pytest.raises(Exception, match="unknown device"):
        client.create_deployment(DeploymentSpec(sha256=artifact["sha256"], version=2, devices=["ghost"]))
    with pytest.raises(Exception, match="cannot reach"):
        FleetClient("http://127.0.0.1:9").devices()
