"""What a device did with a command travels back, with no stand-in on either side: a real agent process (its enrolled
credential, the manager's own Mosquitto, the manager's pinned key) answers the commands an operator sends through
the API; the manager records each command and gives it the device's verdict as ingest stores the answer —
applied, or refused with the device's reason code and words —, reads it back at ``GET /api/commands/{id}`` and
``GET /api/devices/{id}/commands``, and tells the live stream (``commands``). The same answer twice changes
nothing, nor does a late contradicting one; a command nobody answers reads expired; a deployment's refused device
shows the device's words."""

from __future__ import annotations

import json
import subprocess
import threading
import time
import urllib.error
import urllib.request

import pytest
from support.agent import AgentProcess, write_config
from support.assets import IMAGES, MODELS
from support.ports import free_port
from support.processes import edgeinfer_cmd, env_with_repo, wait_until

from edgeinfer.capture import make_test_clip
from edgeinfer.fleet.api.schemas import DeploymentSpec
from edgeinfer.fleet.client import FleetClient
from edgeinfer.fleet.manager import FleetManager, FleetSettings
from edgeinfer.link.protocol import Topics, encode
from edgeinfer.link.vocabulary import Command

FLEET, DEVICE, OFFLINE = "v", "cam-v", "cam-away"
MODEL = MODELS / "mobilenet_v1_0.25_128_quant.tflite"  # a classifier a few milliseconds a frame: cheap to run


def _call(url: str, path: str, token: str, body: dict | None = None, method: str | None = None) -> tuple[int, object]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url + path, data=data, method=method or ("GET" if body is None else "POST"),
                                     headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


class Stream:
    """``GET /api/changes`` read on a thread: the frames of one event name, as they come."""

    def __init__(self, url: str, token: str, event: str) -> None:
        self.frames: list = []
        request = urllib.request.Request(url + "/api/changes", headers={"Authorization": f"Bearer {token}"})
        self._response = urllib.request.urlopen(request, timeout=60)
        self._event = event
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        name = None
        try:
            for raw in self._response:
                line = raw.decode().rstrip("\n")
                if line.startswith("event: "):
                    name = line[7:]
                elif line.startswith("data: ") and name == self._event:
                    self.frames.append(json.loads(line[6:]))
        except (OSError, ValueError, AttributeError):  # closed under it (http.client's fp is gone then)
            return

    def records(self, command_id: str) -> list[dict]:
        return [r for frame in list(self.frames) for r in frame if r["command_id"] == command_id]

    def close(self) -> None:
        self._response.close()


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    folder = tmp_path_factory.mktemp("verdicts")
    clip = make_test_clip(folder / "clip.avi", [IMAGES / "parrot.jpg", IMAGES / "cat.bmp"], size=(160, 120), fps=10,
                          frames_per_image=5)
    settings = FleetSettings(broker=None, broker_port=free_port(), http="127.0.0.1:0", data_dir=folder / "fleet")
    with FleetManager(settings) as manager:
        assert manager.wait_connected(10)
        url = manager.http.url
        admin = FleetClient(url, token=manager.admin_token)
        [device] = admin.enroll_many([DEVICE], FLEET)
        operator = admin.create_token("verdict-operator", "operator")["token"]
        viewer = admin.create_token("verdict-viewer", "viewer")["token"]
        config = write_config(
            folder / "agent.yaml", device_id=DEVICE, fleet=FLEET, broker=manager.broker_url,
            username=device["username"], password=device["password"], data_dir=str(folder / "data"),
            telemetry_interval_s=0.5, manager_url=url, update_public_key=manager.key.public_key_b64(),
            profile="none", pipelines=[{"name": "main", "model": str(MODEL), "source": str(clip), "task": "classify",
                                        "loop": True, "max_fps": 5, "threads": 1, "version": "1"}])
        with AgentProcess(config, folder / "agent.log") as agent:
            def running() -> bool:
                state = (manager.db.get_device(DEVICE) or {}).get("state") or {}
                return [p.get("status") for p in state.get("pipelines", [])] == ["running"]

            assert wait_until(running, 60, 0.2), agent.output()
            yield manager, agent, {"operator": operator, "viewer": viewer}


def _settled(url: str, token: str, command_id: str, timeout: float = 30) -> dict:
    """The command's record once it has its verdict."""
    assert wait_until(lambda: _call(url, f"/api/commands/{command_id}", token)[1]["state"] != "sent", timeout, 0.2)
    return _call(url, f"/api/commands/{command_id}", token)[1]


def test_a_command_the_device_runs_reads_applied_and_one_it_refuses_reads_refused_in_its_words(fleet):
    manager, _agent, tokens = fleet
    url, operator, viewer = manager.http.url, tokens["operator"], tokens["viewer"]
    stream = Stream(url, viewer, "commands")
    try:
        status, sent = _call(url, f"/api/devices/{DEVICE}/restart", operator, {"pipeline": "main"})
        assert status == 200
        applied = _settled(url, viewer, sent["command_id"])
        assert (applied["state"], applied["cmd"], applied["device_id"], applied["pipeline"]) == (
            "applied", "restart_pipeline", DEVICE, "main")
        assert applied["sent_by"] == "verdict-operator" and applied["summary"] == {"pipeline": "main"}
        assert applied["result"] == {"pipeline": "main"} and applied["reason"] is None
        assert (applied["text"], applied["settled"], applied["samples"]) == ("applied", True, None)
        assert applied["sent_at"] <= applied["answered_at"] <= applied["updated_at"] < applied["expires_at"]
        # the page's live updates carry the verdict: the stream says so without being asked
        assert wait_until(lambda: "applied" in [r["state"] for r in stream.records(sent["command_id"])], 15, 0.1)

        status, refused = _call(url, f"/api/devices/{DEVICE}/restart", operator, {"pipeline": "nope"})
        assert status == 200
        found = _settled(url, viewer, refused["command_id"])
        assert (found["state"], found["reason"]) == ("refused", "failed"), found
        assert found["message"] == "no pipeline named 'nope' (have: main)"  # the device's words, without its prefix
        assert found["text"] == "refused by the device: failed — no pipeline named 'nope' (have: main)"
        assert found["result"] is None and found["settled"]
        status, capture = _call(url, f"/api/devices/{DEVICE}/sample", operator, {"pipeline": "main", "frames": 2})
        found = _settled(url, viewer, capture["command_id"])
        assert (found["state"], found["reason"]) == ("refused", "no_sampling"), found
        assert "does not sample" in found["message"] and found["samples"] == {"requested": 2, "stored": 0,
                                                                              "duplicates": 0}
        assert wait_until(lambda: "refused" in [r["state"] for r in stream.records(capture["command_id"])], 15, 0.1)
        # the route's old name, a deprecated alias, sends the same signed command under its name
        old_route = f"/api/devices/{DEVICE}/capture"  # sample's old name
        status, old = _call(url, old_route, operator, {"pipeline": "main", "frames": 1})
        assert status == 200 and old["cmd"] == "sample", old
        found = _settled(url, viewer, old["command_id"])
        assert (found["state"], found["reason"], found["samples"]["requested"]) == ("refused", "no_sampling", 1)
    finally:
        stream.close()
    status, listed = _call(url, f"/api/devices/{DEVICE}/commands?cmd=restart_pipeline", viewer)
    assert status == 200 and [c["command_id"] for c in listed] == [refused["command_id"], sent["command_id"]]
    assert [c["state"] for c in listed] == ["refused", "applied"]
    status, mine = _call(url, f"/api/devices/{DEVICE}/commands?pipeline=nope", viewer)
    assert [c["command_id"] for c in mine] == [refused["command_id"]]
    assert _call(url, "/api/commands/no-such-command", viewer)[0] == 404
    assert _call(url, "/api/commands/bad%20id!", viewer)[0] == 400
    assert _call(url, "/api/devices/nobody/commands", viewer)[0] == 404
    assert _call(url, f"/api/commands/{sent['command_id']}", "not-a-token")[0] == 401


def test_the_same_answer_twice_and_a_late_contradicting_one_change_nothing(fleet):
    manager, agent, tokens = fleet
    url, operator, viewer = manager.http.url, tokens["operator"], tokens["viewer"]
    command_id = _call(url, f"/api/devices/{DEVICE}/restart", operator, {"pipeline": "main"})[1]["command_id"]
    first = _settled(url, viewer, command_id)
    [answer] = [e for e in manager.db.device_events(DEVICE, 500) if e.get("cmd_id") == command_id]
    contradiction = {**answer, "seq": answer["seq"] + 10_000, "event": "cmd_rejected", "level": "error",
                     "data": {"cmd": "restart_pipeline", "reason": "bad_signature"}}
    topic = Topics(FLEET, DEVICE).events
    acked = []

    class Delivery:  # what the MQTT link hands ingest for a message: acknowledged once stored
        def ack(self) -> None:
            acked.append(True)

    for message in (answer, answer, contradiction):  # a QoS 1 redelivery, twice, then another answer
        manager.ingest.deliver(topic, encode(message), Delivery())
    assert wait_until(lambda: len(acked) == 3, 15, 0.05)
    # the manager sends the same command again (a rollout taken over does): the device answers from its log
    manager.commands.send(DEVICE, Command.RESTART_PIPELINE, {"pipeline": "main"}, command_id=command_id)
    assert wait_until(lambda: any(e.get("cmd_id") == command_id and (e.get("data") or {}).get("duplicate")
                                  for e in manager.db.device_events(DEVICE, 500)), 30, 0.2), agent.output()
    time.sleep(1.0)  # a batch after it, had anything been left to store
    assert _call(url, f"/api/commands/{command_id}", viewer)[1] == first


def test_a_command_nobody_answers_reads_expired(fleet):
    manager, _agent, tokens = fleet
    url, viewer = manager.http.url, tokens["viewer"]
    manager.db.record_state(FLEET, OFFLINE, {"online": False, "groups": []})
    command_id = manager.commands.send(OFFLINE, Command.PING, {}, ttl_s=1.5, sent_by="a test")
    found = _call(url, f"/api/commands/{command_id}", viewer)[1]
    assert (found["state"], found["text"], found["settled"]) == ("sent", "waiting for the device", False)
    assert wait_until(lambda: _call(url, f"/api/commands/{command_id}", viewer)[1]["state"] == "expired", 10, 0.2)
    [listed] = _call(url, f"/api/devices/{OFFLINE}/commands", viewer)[1]
    assert (listed["command_id"], listed["state"], listed["settled"], listed["sent_by"]) == (
        command_id, "expired", True, "a test")
    assert listed["text"] == "expired: the device did not answer before the command expired"


def test_a_deployment_the_device_refuses_shows_its_reason_in_its_words(fleet):
    manager, agent, tokens = fleet
    url, viewer = manager.http.url, tokens["viewer"]
    sha256, _size = manager.store.put(MODEL)
    # the device runs version 1: version 1 again is no update, and the device says why
    deployment = manager.deployments.create(DeploymentSpec(sha256=sha256, version=1, devices=[DEVICE], canary_pct=100,
                                                           canary_analysis=False))

    def target() -> dict:
        return _call(url, f"/api/deployments/{deployment['deployment_id']}", viewer)[1]["devices"][0]

    assert wait_until(lambda: target()["state"] == "rejected", 60, 0.2), agent.output()
    words = "version 1 is not newer than the running 1 (send a rollback to go back)"
    assert target()["detail"] == f"downgrade — {words}"
    [command] = _call(url, f"/api/devices/{DEVICE}/commands?cmd=deploy", viewer)[1]
    assert (command["state"], command["reason"], command["message"]) == ("refused", "downgrade", words)
    assert "grant" not in command["summary"] and "signature" not in command["summary"]  # never a secret
    assert command["summary"]["manifest"] == {"deployment_id": deployment["deployment_id"],
                                              "model_name": sha256, "version": 1}


def _cli(manager, token: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(edgeinfer_cmd("fleet", *args, "--fleet-url", manager.http.url), capture_output=True,
                          text=True, timeout=120, env=env_with_repo(EDGEINFER_FLEET_TOKEN=token))


def test_fleet_restart_and_rollback_say_what_the_device_did_not_only_that_they_were_sent(fleet):
    manager, _agent, tokens = fleet
    applied = _cli(manager, tokens["operator"], "restart", DEVICE, "--pipeline", "main")
    assert (applied.returncode, applied.stdout.strip()) == (0, "applied"), applied.stderr
    assert "waiting for the device" in applied.stderr
    refused = _cli(manager, tokens["operator"], "restart", DEVICE, "--pipeline", "nope", "--json")
    record = json.loads(refused.stdout)
    assert refused.returncode == 1 and (record["state"], record["reason"]) == ("refused", "failed"), refused.stderr
    assert record["message"] == "no pipeline named 'nope' (have: main)"
    # a rollback with nothing to roll back to: the device's refusal in its words, exit 1
    rollback = _cli(manager, tokens["operator"], "rollback", DEVICE)
    assert rollback.returncode == 1 and rollback.stdout.startswith("refused by the device: "), rollback
    # a device that does not answer: said within the bound, the command left queued for it
    manager.db.record_state(FLEET, OFFLINE, {"online": False, "groups": []})
    silent = _cli(manager, tokens["operator"], "restart", OFFLINE, "--pipeline", "main", "--timeout", "1")
    assert silent.returncode == 1 and silent.stdout.strip() == "waiting for the device", silent
    assert f"no answer from {OFFLINE} within 1 s" in silent.stderr
    sent = _cli(manager, tokens["operator"], "restart", DEVICE, "--pipeline", "main", "--no-wait")
    assert sent.returncode == 0 and sent.stdout.startswith(f"restart of main sent to {DEVICE} (command "), sent
