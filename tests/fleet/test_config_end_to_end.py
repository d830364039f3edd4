"""A configuration from the fleet to real agents (docs/fleet.md, *Configuration*): a manager with its Mosquitto, three
agents in a group, each a real process running a real detector on a real clip. A group edit (a sampling rule and a
new line) reaches all three and each changes it live, without restarting its pipeline; a source change on one
reopens that stream only; a broken configuration is refused by the canary, the rollout stops and the other two never
get it; a configuration that fails once it runs is rolled back by the device on its own."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support import scenes
from support.agent import AgentProcess, write_config
from support.fleet import admin_client, running_fleet
from support.pipeline import ULTRAFACE
from support.processes import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

GROUP = "lobby"
DEVICES = ("cam-00", "cam-01", "cam-02")
LINE = "door=" + ",".join(str(v) for v in scenes.LINE)
#: how the pipeline runs on every device of the group (its source is each device's own)
BASE = {"name": "main", "model": str(ULTRAFACE), "task": "detect", "loop": True, "max_fps": 5, "threads": 1}
FAST = {"canary_pct": 10, "canary_analysis": False, "device_timeout_s": 120}


@pytest.fixture(scope="module")
def clips(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("clips")
    return {"scene": scenes.make_scene_clip(folder / "scene.avi"),
            "other": scenes.make_scene_clip(folder / "other.avi", quality=60),
            "short": scenes.make_scene_clip(folder / "short.avi", frames=2)}


def sources(device: str, clips: dict[str, Path]) -> dict:
    """Each device's own source: cam-02 runs two streams."""
    if device == "cam-02":
        return {"sources": [{"name": "left", "source": str(clips["scene"])},
                            {"name": "right", "source": str(clips["scene"])}]}
    return {"source": str(clips["scene"])}


@pytest.fixture
def lab(tmp_path, broker, clips):
    """The manager, and the three agents online and running their agent.yaml's pipeline."""
    with running_fleet(tmp_path / "fleet", broker.url) as manager:
        agents = []
        try:
            for device in DEVICES:
                config = write_config(tmp_path / f"{device}.yaml", device_id=device, fleet="lab", broker=broker.url,
                                      data_dir=str(tmp_path / device), telemetry_interval_s=0.5, profile="none",
                                      reconnect_min_s=0.1, reconnect_max_s=1.0, groups=[GROUP],
                                      update_public_key=manager.key.public_key_b64(),
                                      pipelines=[{**BASE, **sources(device, clips)}])
                agents.append(AgentProcess(config, tmp_path / f"{device}.log").start())

            def running() -> bool:
                rows = {d["device_id"]: d for d in manager.db.list_devices()}
                return all(device in rows and rows[device]["online"] and [p.get("status") for p in (
                    rows[device]["state"] or {}).get("pipelines") or []] == ["running"] for device in DEVICES)

            assert wait_until(running, 120, 0.2), [a.output()[-2000:] for a in agents]
            yield manager, agents
        finally:
            for agent in agents:
                agent.terminate()


def save(manager, scope: str, name: str, document: dict, **rollout) -> dict:
    client = admin_client(manager)
    revision = client.config_layer(scope, name)["revision"]
    return client.save_config(scope, name, document, revision=revision, rollout={**FAST, **rollout})


def finished(manager, deployment: dict, timeout: float = 180) -> dict:
    client = admin_client(manager)
    assert wait_until(lambda: client.deployment(deployment["deployment_id"])["status"] != "running", timeout, 0.3)
    return client.deployment(deployment["deployment_id"])


def applied_changes(manager, device: str, deployment_id: str) -> dict | None:
    """What the device said it changed for a deployment (its ``update`` event of step ``applying``)."""
    for event in manager.db.device_events(device, limit=500):
        data = event.get("data") or {}
        if event.get("event") == "update" and data.get("deployment_id") == deployment_id and data.get("step") == \
                "applying":
            return data.get("changes")
    return None


def restarts(manager, device: str) -> int:
    telemetry = manager.db.get_device(device)["last_telemetry"] or {}
    return sum(int(p.get("restarts") or 0) for p in telemetry.get("pipelines") or [])


def test_live_edits_one_stream_reopened_a_broken_one_stopped_at_the_canary_a_failing_one_rolled_back(lab, clips):
    manager, agents = lab
    client = admin_client(manager)
    for device in DEVICES:  # each device's own source in its layer; the group's layer says how the pipeline runs
        alone = client.save_config("device", device, {"pipelines": [{"name": "main", **sources(device, clips)}]},
                                   revision=0)
        assert alone["deployment"] is None  # no model yet: not a document a device takes
    first = save(manager, "group", GROUP, {"pipelines": [BASE]}, canary_pct=0)
    assert finished(manager, first["deployment"])["status"] == "succeeded"
    assert wait_until(lambda: client.config_devices(group=GROUP)["counts"]["in_step"] == 3, 30, 0.3)
    before = {device: restarts(manager, device) for device in DEVICES}

    # a sampling rule and a new line, for the whole group: live on every device, no pipeline restarted
    edit = save(manager, "group", GROUP, {"pipelines": [{**BASE, "lines": [LINE], "sample": ["random:0.01"]}]})
    done = finished(manager, edit["deployment"])
    assert done["status"] == "succeeded" and done["counts"] == {"active": 3}, done
    for device in DEVICES:
        changes = applied_changes(manager, device, done["deployment_id"])
        assert changes is not None and [c["change"] for c in changes["pipelines"]] == ["live"], changes
        assert set(changes["pipelines"][0]["keys"]) >= {"lines", "sample"}
        assert restarts(manager, device) == before[device]
    assert client.config_devices(group=GROUP)["out_of_step"] == 0

    # one stream's source changed on cam-02: that stream reopens, the other goes on
    layer = client.config_layer("device", "cam-02")
    moved = {"pipelines": [{"name": "main", "sources": [{"name": "left", "source": str(clips["scene"])},
                                                        {"name": "right", "source": str(clips["other"])}]}]}
    one = client.save_config("device", "cam-02", moved, revision=layer["revision"], rollout=FAST)
    done = finished(manager, one["deployment"])
    assert done["status"] == "succeeded" and [t["device_id"] for t in done["devices"]] == ["cam-02"]
    changes = applied_changes(manager, "cam-02", done["deployment_id"])
    assert changes["pipelines"] == [{"pipeline": "main", "change": "live", "keys": ["sources"],
                                     "streams": {"closed": ["right"], "opened": ["right"]}}], changes

    # a model that is not there: the canary refuses it, the rollout stops, the two others never get it
    good = client.config_layer("group", GROUP)
    broken = save(manager, "group", GROUP, {"pipelines": [{**BASE, "model": "/nowhere/model.onnx"}]})
    done = finished(manager, broken["deployment"])
    targets = {t["device_id"]: t for t in done["devices"]}
    assert done["status"] == "aborted" and targets["cam-00"]["state"] == "failed", done
    assert "model" in targets["cam-00"]["detail"]
    assert [targets[d]["state"] for d in ("cam-01", "cam-02")] == ["pending", "pending"]
    for device in ("cam-01", "cam-02"):
        assert applied_changes(manager, device, done["deployment_id"]) is None
        assert not any((e.get("data") or {}).get("deployment_id") == done["deployment_id"]
                       for e in manager.db.device_events(device, limit=500))
    statuses = {s["device_id"]: s for s in client.config_devices(group=GROUP)["devices"]}
    assert statuses["cam-00"]["status"] == "refused" and statuses["cam-00"]["refused"]["reason"]
    assert statuses["cam-01"]["status"] == statuses["cam-02"]["status"] == "halted"
    assert all(agent.alive() for agent in agents)
    back = client.rollback_config("group", GROUP, good["revision"], revision=good["revision"] + 1, rollout=FAST)
    assert back["deployment"] is None or finished(manager, back["deployment"])["status"] == "succeeded"
    assert wait_until(lambda: client.config_devices(group=GROUP)["out_of_step"] == 0, 60, 0.3)

    # a source that ends two frames in: it opens (the check passes), then the pipeline stops producing — rolled back
    layer = client.config_layer("device", "cam-01")
    running = client.device_config("cam-01")["applied"]
    short = {"pipelines": [{"name": "main", "source": str(clips["short"]), "loop": False}]}
    failing = client.save_config("device", "cam-01", short, revision=layer["revision"], rollout=FAST)
    done = finished(manager, failing["deployment"])
    assert done["devices"][0]["state"] == "rolled_back", done
    assert wait_until(lambda: client.device_config("cam-01")["applied"] == running, 60, 0.3)
    status = client.device_config("cam-01")
    assert status["status"] == "refused" and status["refused"]["state"] == "rolled_back"
    assert wait_until(lambda: [p.get("status") for p in (manager.db.get_device("cam-01")["state"] or {}).get(
        "pipelines") or []] == ["running"], 60, 0.3)
    assert json.dumps(status)  # its answer is JSON all the way
