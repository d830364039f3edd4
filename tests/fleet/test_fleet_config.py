"""The configuration the fleet holds (docs/fleet.md, *Configuration*), against a real manager, its managed Mosquitto and
simulated devices that answer configuration deployments: a layer the schema refuses is 409 in `agent --check`'s words
(the OpenAPI document cannot state it: GET /api/config/schema does), a stale revision 409, a huge document 413, a
viewer 403 on every write; secrets are stored and never shown back (answers, history, diffs, the audit log, the
artifact to anyone but its device); history and roll back; a group edit reaches every device of the group and a
device's layer wins; a device offline gets its desired document when it comes back; a layer saved without applying
reaches nobody until applied; layers that merge into an invalid document are not sent; the CLI."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.error
import urllib.request

import pytest
import yaml
from support.fleet import admin_token_file, simulated_fleet
from support.fleet import api_call as call
from support.processes import edgeinfer_cmd, env_with_repo, wait_until

from edgeinfer.fleet.client import FleetClient
from edgeinfer.link.config_document import MAX_DOCUMENT_BYTES, document_problems
from edgeinfer.tools.simulate import Simulation, SimulationSettings

GROUP = "lobby"
FAST = {"canary_pct": 25, "canary_analysis": False, "device_timeout_s": 60}
SECRET = "s3cr3t-Pa55"
PIPELINE = {"name": "main", "model": "/models/detector.tflite", "source": "rtsp://cam.local/1", "max_fps": 10}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    with simulated_fleet(tmp_path_factory.mktemp("config-fleet"), devices=4, groups=(GROUP,), fleet="yard") as sim:
        yield sim



def layer(fleet, scope: str, name: str) -> dict:
    return call(fleet, "GET", f"/api/config/layers/{scope}/{name}")[1]


def save(fleet, scope: str, name: str, document: dict, *, message: str = "", **extra) -> dict:
    """Save on the layer's newest revision; the answer (asserted 200)."""
    body = {"document": document, "revision": layer(fleet, scope, name)["revision"], "message": message,
            "rollout": FAST, **extra}
    status, answer = call(fleet, "PUT", f"/api/config/layers/{scope}/{name}", body)
    assert status == 200, answer
    return answer


def done(fleet, deployment: dict) -> dict:
    """The deployment once it has ended."""
    deployment_id = deployment["deployment_id"]
    assert wait_until(lambda: fleet.admin.deployment(deployment_id)["status"] != "running", 60, 0.2)
    return fleet.admin.deployment(deployment_id)


def document_of(fleet, device: str, sha256: str) -> dict:
    """A device's configuration document as the device downloads it (with its own credential)."""
    username, password = fleet.credentials[device]
    request = urllib.request.Request(f"{fleet.manager.http.url}/artifacts/{sha256}")
    request.add_header("Authorization", "Basic " + __import__("base64").b64encode(
        f"{username}:{password}".encode()).decode())
    with urllib.request.urlopen(request, timeout=10) as answer:
        return json.loads(answer.read())


def in_step(fleet, *devices: str) -> bool:
    found = {d["device_id"]: d["status"] for d in call(fleet, "GET", "/api/config/devices")[1]["devices"]}
    return all(found.get(device) == "in_step" for device in devices)


@pytest.mark.parametrize(("pipeline", "key"), [
    ({"max_fps": -1}, "max_fps"),
    ({"score_threshold": 2}, "score_threshold"),
    ({"decoder": "yolo v99"}, "decoder"),
    ({"mdel": "/m/x.tflite"}, "mdel"),
])
def test_a_layer_the_schema_refuses_is_409_naming_the_key_in_the_words_of_agent_check(fleet, tmp_path, pipeline, key):
    before = layer(fleet, "group", GROUP)
    status, answer = call(fleet, "PUT", f"/api/config/layers/group/{GROUP}",
                          {"document": {"pipelines": [{**PIPELINE, **pipeline}]}, "revision": before["revision"]})
    assert status == 409 and answer["error"].startswith(f"pipelines[0].{key}: "), answer
    # the device's own check of a whole document says it so, and so does `agent --check` of an agent.yaml
    assert answer["error"] in document_problems({"pipelines": [{**PIPELINE, **pipeline}]})
    config = tmp_path / "agent.yaml"
    config.write_text(yaml.safe_dump({"device_id": "cam-1", "broker": "mqtt://127.0.0.1:1",
                                      "pipelines": [{**PIPELINE, **pipeline}]}))
    checked = subprocess.run(edgeinfer_cmd("agent", "--config", str(config), "--check"), capture_output=True,
                             text=True, env=env_with_repo(), timeout=60)
    assert checked.returncode == 78 and f"agent.yaml: {answer['error']}" in checked.stderr, checked.stderr
    assert layer(fleet, "group", GROUP) == before  # nothing saved


def test_a_key_only_agent_yaml_sets_is_refused(fleet):
    status, answer = call(fleet, "PUT", "/api/config/layers/device/sim-00000",
                          {"document": {"broker": "mqtt://evil:1883"}, "revision": 0})
    assert status == 409 and answer["error"].startswith("broker: set only in the device's agent.yaml"), answer


def test_two_operators_saving_the_same_revision_the_second_gets_409(fleet):
    read = layer(fleet, "device", "sim-00002")["revision"]
    body = {"document": {"telemetry_interval_s": 2}, "revision": read, "apply": False}
    first = call(fleet, "PUT", "/api/config/layers/device/sim-00002", body)
    second = call(fleet, "PUT", "/api/config/layers/device/sim-00002",
                  {**body, "document": {"telemetry_interval_s": 3}})
    assert first[0] == 200 and first[1]["layer"]["revision"] == read + 1
    assert second[0] == 409 and f"at revision {read + 1}, not {read}" in second[1]["error"], second
    assert layer(fleet, "device", "sim-00002")["document"] == {"telemetry_interval_s": 2}


def test_a_huge_document_is_413(fleet):
    huge = {"pipelines": [{**PIPELINE, "labels": "x" * 4000, "name": f"p{i}"} for i in range(32)]}
    assert len(json.dumps(huge)) > MAX_DOCUMENT_BYTES
    status, answer = call(fleet, "PUT", "/api/config/layers/group/big", {"document": huge, "revision": 0})
    assert status == 413 and str(MAX_DOCUMENT_BYTES) in answer["error"], answer
    status, answer = call(fleet, "PUT", "/api/config/layers/group/big", raw=b"{" + b" " * (1 << 20) + b"}")
    assert status == 413
    assert layer(fleet, "group", "big")["revision"] == 0


def test_a_viewer_reads_and_may_not_write(fleet):
    viewer = fleet.admin.create_token("config-viewer", "viewer")["token"]
    assert call(fleet, "GET", f"/api/config/layers/group/{GROUP}", token=viewer)[0] == 200
    assert call(fleet, "GET", "/api/config/devices", token=viewer)[0] == 200
    assert call(fleet, "GET", "/api/config/schema", token=viewer)[0] == 200
    body = {"document": {}, "revision": 0}
    assert call(fleet, "PUT", "/api/config/layers/group/viewers", body, token=viewer)[0] == 403
    assert call(fleet, "POST", "/api/config/layers/group/viewers/rollback", {"to_revision": 1, "revision": 0},
                token=viewer)[0] == 403
    assert call(fleet, "POST", "/api/config/layers/group/viewers/apply", {}, token=viewer)[0] == 403
    assert layer(fleet, "group", "viewers")["revision"] == 0


def test_secrets_are_stored_and_never_shown_back(fleet, caplog):
    device = "sim-00003"
    secret_source = f"rtsp://admin:{SECRET}@cam-3.local:554/Streaming/101"
    saved = save(fleet, "device", device, {"pipelines": [{**PIPELINE, "source": secret_source}]}, message="cam-3")
    assert done(fleet, saved["deployment"])["status"] == "succeeded"
    status = call(fleet, "GET", f"/api/config/devices/{device}")[1]
    # stored: the device gets its document with the password in it
    assert document_of(fleet, device, status["desired"]["sha256"])["pipelines"][0]["source"] == secret_source
    # never shown back: every answer, the history, the diff, the audit log, the deployment, the manager's log
    shown = [saved, layer(fleet, "device", device), status, call(fleet, "GET", "/api/config/layers")[1],
             call(fleet, "GET", f"/api/config/layers/device/{device}/history")[1],
             fleet.admin.deployment(saved["deployment"]["deployment_id"]), fleet.admin.audit(1000),
             call(fleet, "GET", "/api/config/devices")[1]]
    assert SECRET not in json.dumps(shown) and SECRET not in caplog.text
    assert status["document"]["pipelines"][0]["source"] == "rtsp://admin:***@cam-3.local:554/Streaming/101"
    # the artifact opens to its own device only: not to a token of any role, not to another device
    for token in (fleet.manager.admin_token, fleet.admin.create_token("secret-viewer", "viewer")["token"]):
        assert call(fleet, "GET", f"/artifacts/{status['desired']['sha256']}", token=token)[0] == 403
    with pytest.raises(urllib.error.HTTPError) as refused:
        document_of(fleet, "sim-00000", status["desired"]["sha256"])
    assert refused.value.code == 403
    # sent back as it was shown, the secret is kept (nothing changes, nothing is sent); a new one replaces it
    read = layer(fleet, "device", device)
    again = save(fleet, "device", device, read["document"], message="unchanged")
    assert again["layer"]["sha256"] == read["sha256"] and again["layer"]["diff"] == [] and again["deployment"] is None
    changed = save(fleet, "device", device, {"pipelines": [{**PIPELINE, "source": secret_source.replace(
        SECRET, "n3w-Pa55")}]})
    assert changed["layer"]["diff"] == [{"path": "pipelines[main].source", "op": "change", "secret": True,
                                         "before": read["document"]["pipelines"][0]["source"],
                                         "after": read["document"]["pipelines"][0]["source"]}]
    assert "n3w-Pa55" not in json.dumps(changed)
    done(fleet, changed["deployment"])
    # a masked text that masks nothing stored (another host): 409, give the secret itself
    status, answer = call(fleet, "PUT", f"/api/config/layers/device/{device}", {
        "document": {"pipelines": [{**PIPELINE, "source": "rtsp://admin:***@cam-9.local/1"}]},
        "revision": changed["layer"]["revision"]})
    assert status == 409 and answer["error"].startswith("pipelines[0].source: holds a masked secret"), answer


def test_history_and_roll_back_to_any_revision(fleet):
    device = "sim-00001"
    revisions = [save(fleet, "device", device, {"pipelines": [{**PIPELINE, "max_fps": fps}]}, message=f"fps {fps}")
                 for fps in (4, 6, 8)]
    for saved in revisions:
        done(fleet, saved["deployment"])
    first = revisions[0]["layer"]["revision"]
    history = call(fleet, "GET", f"/api/config/layers/device/{device}/history")[1]
    assert [h["revision"] for h in history[:3]] == [first + 2, first + 1, first]
    assert [h["message"] for h in history[:3]] == ["fps 8", "fps 6", "fps 4"]
    assert history[0]["diff"] == [{"path": "pipelines[main].max_fps", "op": "change", "before": 6, "after": 8,
                                   "secret": False}]
    assert all(h["author"] == "admin" and h["applied_at"] for h in history[:3])
    back = call(fleet, "POST", f"/api/config/layers/device/{device}/rollback",
                {"to_revision": first, "revision": first + 2, "rollout": FAST})
    assert back[0] == 200, back
    rolled = back[1]["layer"]
    assert rolled["revision"] == first + 3 and rolled["restored_from"] == first
    assert rolled["sha256"] == revisions[0]["layer"]["sha256"] and rolled["document"]["pipelines"][0]["max_fps"] == 4
    assert done(fleet, back[1]["deployment"])["status"] == "succeeded"
    assert call(fleet, "GET", f"/api/config/layers/device/{device}/revisions/{first + 1}")[1]["diff"][0]["after"] == 6
    assert call(fleet, "GET", f"/api/config/layers/device/{device}/revisions/999")[0] == 404
    stale = call(fleet, "POST", f"/api/config/layers/device/{device}/rollback", {"to_revision": first,
                                                                                  "revision": first})
    assert stale[0] == 409
    assert in_step(fleet, device)
    actions = [(e["action"], e["target"]) for e in fleet.admin.audit(1000)]
    assert ("config.rollback", f"device:{device}") in actions and ("config.save", f"device:{device}") in actions


def test_a_group_edit_reaches_every_device_of_the_group_and_a_device_layer_wins(fleet):
    alone = save(fleet, "device", "sim-00002", {"pipelines": [{"name": "main", "max_fps": 2}]})
    assert alone["deployment"] is None  # no model, no source: not a document a device takes, so not sent
    assert alone["skipped"] == [{"device_id": "sim-00002", "reason": "its layers merge into a document that is not "
                                 "valid: pipelines[0]: missing required key 'model'"}]
    saved = save(fleet, "group", GROUP, {"pipelines": [{**PIPELINE, "score_threshold": 0.6, "max_fps": 12}]})
    deployment = done(fleet, saved["deployment"])
    assert deployment["kind"] == "config" and deployment["status"] == "succeeded"
    assert {t["device_id"] for t in deployment["devices"]} >= {"sim-00000", "sim-00002"}
    assert wait_until(lambda: in_step(fleet, *fleet.ids), 30, 0.2)
    for device in fleet.ids:
        found = call(fleet, "GET", f"/api/config/devices/{device}")[1]
        pipeline = document_of(fleet, device, found["desired"]["sha256"])["pipelines"][0]
        assert pipeline["score_threshold"] == 0.6 and found["layers"][:2] == ["fleet:yard", f"group:{GROUP}"]
        assert found["origins"]["pipelines[main].score_threshold"] == f"group:{GROUP}"
        assert found["applied"]["sha256"] == found["desired"]["sha256"]  # as the device reports it
    # the device's own layer wins where it sets a key: sim-00002's 2 fps (its revision was applied with the group's)
    two = call(fleet, "GET", "/api/config/devices/sim-00002")[1]
    assert two["document"]["pipelines"][0]["max_fps"] == 2 and two["origins"]["pipelines[main].max_fps"] == \
        "device:sim-00002"
    zero = call(fleet, "GET", "/api/config/devices/sim-00000")[1]
    assert zero["document"]["pipelines"][0]["max_fps"] == 12 and zero["origins"]["pipelines[main].max_fps"] == \
        f"group:{GROUP}"
    overview = call(fleet, "GET", "/api/overview")[1]["config"]
    assert overview["out_of_step"] == 0 and overview["counts"]["in_step"] >= 4


def test_a_device_offline_gets_its_desired_document_when_it_comes_back(fleet, tmp_path):
    device = "late-00000"
    issued = fleet.admin.enroll_many([device], "yard")[0]
    settings = SimulationSettings(broker=fleet.manager.broker_url, devices=1, prefix="late", groups=(GROUP,),
                                  credentials={device: (issued["username"], issued["password"], "yard")},
                                  ramp_s=0.0, update_delay_s=(0.01, 0.05), interval_s=1.0)
    first = Simulation(settings).start()
    assert wait_until(lambda: (fleet.manager.db.get_device(device) or {}).get("online"), 30, 0.1)
    assert wait_until(lambda: in_step(fleet, device), 30, 0.2)  # it joined the group: caught up
    first.kill()  # gone: its Last Will says so
    assert wait_until(lambda: not fleet.manager.db.get_device(device)["online"], 30, 0.1)
    current = layer(fleet, "group", GROUP)["document"]
    saved = save(fleet, "group", GROUP, {"pipelines": [{**current["pipelines"][0], "max_fps": 7}]})
    assert {"device_id": device, "reason": "offline: it gets its desired document when it comes back"} in \
        saved["skipped"]
    assert device not in {t["device_id"] for t in saved["deployment"]["devices"]}
    status = call(fleet, "GET", f"/api/config/devices/{device}")[1]
    assert status["status"] == "out_of_step" and not status["online"]
    again = Simulation(settings).start()  # it comes back (a new boot)
    try:
        assert wait_until(lambda: in_step(fleet, device), 60, 0.2)
        caught = call(fleet, "GET", f"/api/config/devices/{device}")[1]
        assert caught["deployment"]["deployment_id"] != saved["deployment"]["deployment_id"]
        assert "config.catch_up" in [e["action"] for e in fleet.admin.audit(1000)]
    finally:
        again.kill()  # offline again (its Last Will): later rollouts leave it out


def test_a_layer_saved_without_applying_reaches_nobody_until_applied(fleet):
    device = "sim-00000"
    before = call(fleet, "GET", f"/api/config/devices/{device}")[1]
    saved = save(fleet, "device", device, {"pipelines": [{"name": "main", "max_fps": 3}]}, apply=False)
    assert saved["deployment"] is None and saved["layer"]["applied_at"] is None
    draft = call(fleet, "GET", f"/api/config/devices/{device}")[1]
    assert draft["drafts"] == [f"device:{device}"] and draft["desired"] == before["desired"]
    assert draft["status"] == "in_step"
    status, applied = call(fleet, "POST", f"/api/config/layers/device/{device}/apply", {"rollout": FAST})
    assert status == 200 and applied["layer"]["applied_by"] == "admin"
    assert done(fleet, applied["deployment"])["status"] == "succeeded"
    after = call(fleet, "GET", f"/api/config/devices/{device}")[1]
    assert after["document"]["pipelines"][0]["max_fps"] == 3 and after["drafts"] == [] and after["status"] == \
        "in_step"


def test_layers_that_merge_into_an_invalid_document_are_not_sent(fleet):
    group = layer(fleet, "group", GROUP)["document"]
    streams = {**{k: v for k, v in group["pipelines"][0].items() if k != "source"}, "sources": ["rtsp://a/1", "0"]}
    try:
        saved = save(fleet, "group", GROUP, {"pipelines": [streams]})
        # sim-00001's own layer gives `source`: with the group's `sources`, its document would have both
        skipped = {s["device_id"]: s["reason"] for s in saved["skipped"]}
        problem = "pipelines[0].sources: give either source (one stream) or sources (several), not both"
        assert skipped["sim-00001"] == f"its layers merge into a document that is not valid: {problem}"
        assert "sim-00002" in {t["device_id"] for t in saved["deployment"]["devices"]}  # it sets no source: valid
        found = call(fleet, "GET", "/api/config/devices/sim-00001")[1]
        assert found["status"] == "invalid" and found["desired"] == {"sha256": None, "problem": problem,
                                                                    "layers": found["desired"]["layers"]}
        assert call(fleet, "GET", "/api/overview")[1]["config"]["counts"]["invalid"] >= 1
        done(fleet, saved["deployment"])
    finally:
        restored = save(fleet, "group", GROUP, group)
        if restored["deployment"] is not None:
            done(fleet, restored["deployment"])


def test_the_cli_gets_sets_shows_history_rolls_back_and_says_status(fleet, tmp_path):
    env = {**env_with_repo(), "EDGEINFER_FLEET_URL": fleet.manager.http.url,
           "EDGEINFER_FLEET_TOKEN_FILE": admin_token_file(fleet.manager)}

    def cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
        return subprocess.run(edgeinfer_cmd("fleet", "config", *args), capture_output=True, text=True, env=env,
                              input=stdin, timeout=120)

    layer_file = tmp_path / "cam.yaml"
    layer_file.write_text(yaml.safe_dump({"pipelines": [{**PIPELINE, "source": f"rtsp://u:{SECRET}@c/1"}]}))
    fast = ("--canary", "0", "--no-canary-analysis", "--device-timeout", "60")
    done_set = cli("set", str(layer_file), "--device", "sim-00003", "-m", "from the CLI", *fast)
    assert done_set.returncode == 0, done_set.stderr
    assert "→ 'rtsp://u:***@c/1'" in done_set.stderr and SECRET not in done_set.stderr
    assert "deployment" in done_set.stdout and "succeeded" in done_set.stdout
    got = cli("get", "--device", "sim-00003")
    assert got.returncode == 0 and yaml.safe_load(got.stdout)["pipelines"][0]["source"] == "rtsp://u:***@c/1"
    as_json = json.loads(cli("get", "--device", "sim-00003", "--json").stdout)
    # what `get` printed, set back, keeps the secret: no change, nothing sent
    (tmp_path / "back.yaml").write_text(got.stdout)
    unchanged = cli("set", str(tmp_path / "back.yaml"), "--device", "sim-00003", "--json", *fast)
    assert unchanged.returncode == 0 and json.loads(unchanged.stdout)["layer"]["sha256"] == as_json["sha256"]
    stale = cli("set", str(layer_file), "--device", "sim-00003", "--revision", str(as_json["revision"] - 1), *fast)
    assert stale.returncode == 3 and "409" in stale.stderr
    history = json.loads(cli("history", "--device", "sim-00003", "--json").stdout)
    assert history[0]["revision"] == as_json["revision"] + 1 and history[1]["message"] == "from the CLI"
    rolled = cli("rollback", str(history[-1]["revision"]), "--device", "sim-00003", *fast, "--json")
    assert rolled.returncode == 0, rolled.stderr
    assert json.loads(rolled.stdout)["status"] == "succeeded"
    assert wait_until(lambda: cli("status", "--device", "sim-00003").returncode == 0, 30, 0.5)
    status = cli("status", "--group", GROUP, "--json")
    assert json.loads(status.stdout)["counts"]["in_step"] >= 1
    assert cli("get").returncode == 2 and cli("get", "--group", "a", "--device", "b").returncode == 2
    bad = tmp_path / "bad.yaml"
    bad.write_text("pipelines:\n  - name: main\n    max_fps: -1\n")
    refused = cli("set", str(bad), "--device", "sim-00003")
    assert refused.returncode == 1 and "pipelines[0].max_fps: must be a number > 0, got -1" in refused.stderr
    assert SECRET not in json.dumps([history, as_json]) + status.stdout + rolled.stdout + rolled.stderr
    assert sys.executable  # the CLI ran with this interpreter (edgeinfer_cmd)


def test_a_client_reads_what_the_cli_does(fleet):
    client = FleetClient(fleet.manager.http.url, token=fleet.manager.admin_token)
    assert client.config_layer("group", GROUP)["layer"] == f"group:{GROUP}"
    assert client.device_config("nobody") is None
