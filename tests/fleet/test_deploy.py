"""Signed rollouts end to end: a real Mosquitto, the fleet manager, real agents running real pipelines.

Agents run as threads of this process (20 of them) or as subprocesses (the crash test); every
model is a real shared model, validated in a real subprocess and swapped into a live pipeline.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import threading
import time
from pathlib import Path

import pytest
from support.agent import AgentProcess, write_config
from support.assets import IMAGES, MOBILENET_TINY, MODELS
from support.fleet import CuttingProxy, admin_token_file, running_fleet
from support.processes import edgeinfer_cmd
from support.processes import wait_until as wait

from edgeinfer.agent.config import parse_config
from edgeinfer.agent.daemon import Agent
from edgeinfer.capture import make_test_clip
from edgeinfer.fleet.api.schemas import DeploymentSpec
from edgeinfer.fleet.auth import issue_grant
from edgeinfer.fleet.client import wait_for_deployment
from edgeinfer.fleet.manager import FleetManager, FleetSettings
from edgeinfer.link.vocabulary import Command
from edgeinfer.runtime.model import inspect_model
from edgeinfer.updates.signing import SigningKey, new_manifest
from edgeinfer.updates.slots import ModelSlots

V1 = MODELS / "mobilenet_v2_1.0_224_quant.tflite"  # as heavy as the bird model: the latency gate passes
BIRDS = MODELS / "mobilenet_v2_1.0_224_inat_bird_quant.tflite"
BROKEN = MODELS / "model_invoking_error.tflite"


@pytest.fixture(scope="module")
def clip(tmp_path_factory) -> Path:
    return make_test_clip(tmp_path_factory.mktemp("clip") / "clip.avi", [IMAGES / "parrot.jpg", IMAGES / "cat.bmp"],
                          size=(160, 120), fps=10, frames_per_image=5)


def agent_settings(tmp_path: Path, broker_url: str, device: str, key: str, clip: Path, *, model: Path = V1,
                   max_fps: float = 3, **extra) -> dict:
    settings = {
        "device_id": device, "fleet": "lab", "broker": broker_url, "data_dir": str(tmp_path / device),
        "telemetry_interval_s": 0.5, "reconnect_min_s": 0.1, "reconnect_max_s": 1.0, "profile": "none",
        "groups": ["lab"], "update_public_key": key, "update_health_frames": 3,
        "pipelines": [{"name": "main", "model": str(model), "source": str(clip), "task": "classify", "loop": True,
                       "max_fps": max_fps, "threads": 1, "version": "1"}],
    }
    settings.update(extra)
    return settings


class AgentThread:
    """An in-process Agent on its own thread (twenty of these are cheaper than twenty interpreters)."""

    def __init__(self, settings: dict) -> None:
        self.agent = Agent(parse_config(settings, file=f"{settings['device_id']}.yaml"))
        self.thread = threading.Thread(target=self.agent.run, name=f"agent-{settings['device_id']}", daemon=True)

    def version(self) -> str | None:
        return self.agent.runners[0].model.get("version")

    def stop(self) -> None:
        self.agent.stop()
        self.thread.join(30)


@pytest.fixture
def fleet(tmp_path, broker):
    with running_fleet(tmp_path / "fleet", broker.url) as manager:
        yield manager


def start_agents(tmp_path, broker, fleet, clip, count: int, **settings) -> list[AgentThread]:
    key = fleet.key.public_key_b64()
    agents = [AgentThread(agent_settings(tmp_path, broker.url, f"cam-{i:02d}", key, clip, **settings))
              for i in range(count)]
    for agent in agents:
        agent.thread.start()
    assert wait(lambda: sum(d["online"] for d in fleet.db.list_devices()) == count, 60), fleet.db.list_devices()
    assert wait(lambda: all(a.agent.runners and a.agent.runners[0].status == "running" for a in agents), 60)
    return agents


def deploy_cli(fleet: FleetManager, model: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(edgeinfer_cmd("deploy", str(model), "--fleet-url", fleet.http.url,
                                        "--token-file", admin_token_file(fleet), *args),
                          capture_output=True, text=True, timeout=300)


def test_rollout_to_twenty_agents_in_waves(tmp_path, broker, fleet, clip):
    # this test is about waves, not the health gate's latency check: v1 is the smallest classifier (1-2 ms an
    # invoke, the bird model ~200 on two loaded cores: within the largest factor allowed), at 1 frame a second —
    # twenty MobileNet v2 at 3 fps kept 1.2 of CI's 2 cores busy for 4 minutes
    agents = start_agents(tmp_path, broker, fleet, clip, 20, model=MOBILENET_TINY, max_fps=1,
                          update_max_latency_factor=1000.0)
    try:
        # the bird model answers with other classes than v1: the canary analysis would stop it (test_canary.py)
        result = deploy_cli(fleet, BIRDS, "--version", "2", "--all", "--canary", "10", "--wave-size", "6",
                            "--no-canary-analysis", "--json")
        assert result.returncode == 0, result.stderr + result.stdout
        final = json.loads(result.stdout)
        assert final["status"] == "succeeded" and final["counts"] == {"active": 20}
        assert [sum(t["wave"] == w for t in final["devices"]) for w in range(4)] == [2, 6, 6, 6]
        assert all(a.version() == "2" for a in agents)
        assert wait(lambda: all(d["model_version"] == 2 for d in fleet.db.list_devices()), 20)
        listed = subprocess.run(edgeinfer_cmd("fleet", "devices", "--fleet-url", fleet.http.url,
                                              "--token-file", admin_token_file(fleet)),
                                capture_output=True, text=True, timeout=60)
        assert listed.stdout.count("mobilenet_v2_1.0_224_inat_bird_quant.tflite") == 20
        for agent in agents[:3]:  # the bird model really runs: its outputs have 965 classes
            assert agent.agent.runners[0].pipeline.engine.outputs[0].shape == (1, 965)
    finally:
        for agent in agents:
            agent.stop()


def test_failing_canary_aborts_and_nobody_else_is_notified(tmp_path, broker, fleet, clip):
    agents = start_agents(tmp_path, broker, fleet, clip, 6)
    try:
        result = deploy_cli(fleet, BROKEN, "--version", "2", "--all", "--canary", "20", "--wave-size", "2")
        assert result.returncode == 1
        assert "aborted" in result.stdout and "validation_failed" in result.stderr
        (deployment,) = fleet.db.list_deployments()
        assert deployment["counts"] == {"failed": 2, "pending": 4}
        canary = {t["device_id"] for t in fleet.deployments.get(deployment["deployment_id"])["devices"]
                  if t["wave"] == 0}
        for agent in agents:
            update_events = [e for e in fleet.db.device_events(agent.agent.config.device_id) if e["event"] == "update"]
            assert bool(update_events) == (agent.agent.config.device_id in canary)
            assert agent.version() == "1"  # the canary runs v1 again, the rest never left it
    finally:
        for agent in agents:
            agent.stop()


def signed_command(fleet: FleetManager, model: Path, version: int, *, key: SigningKey | None = None,
                   deployment_id: str | None = None, sha256: str | None = None) -> dict:
    digest, size = fleet.store.put(model)
    manifest = new_manifest(model_name=model.name, version=version, sha256=sha256 or digest, size=size,
                            url=f"{fleet.public_url}/artifacts/{digest}", target="device:cam-00",
                            deployment_id=deployment_id)
    # a download grant for the file the URL names (what the manager's rollouts add to every deploy command)
    grant = issue_grant(fleet.key, digest, "cam-00", time.time() + 600)
    return {"manifest": manifest.to_dict(), "signature": (key or fleet.key).sign(manifest), "grant": grant}


def outcome(fleet: FleetManager, command_id: str, timeout: float = 60) -> dict:
    """The cmd_rejected or final update event for ``command_id``."""
    def find():
        for event in fleet.db.device_events("cam-00", limit=500):
            if event.get("cmd_id") != command_id:
                continue
            if event["event"] == "cmd_rejected" or (event["event"] == "update" and event["data"]["state"] in (
                    "active", "failed", "rolled_back")):
                return event
        return None
    assert wait(lambda: find() is not None, timeout), fleet.db.device_events("cam-00")
    return find()


def test_bad_updates_are_rejected_each_with_its_reason(tmp_path, broker, fleet, clip):
    (agent,) = start_agents(tmp_path, broker, fleet, clip, 1)
    try:
        wrong_key = fleet.commands.send("cam-00", Command.DEPLOY,
                                        signed_command(fleet, BIRDS, 2, key=SigningKey.generate()))
        assert outcome(fleet, wrong_key)["data"]["reason"] == "bad_signature"
        # the artifact the server holds is not the one the manifest names
        tampered = fleet.commands.send("cam-00", Command.DEPLOY, signed_command(fleet, BIRDS, 2, sha256="ab" * 32))
        event = outcome(fleet, tampered)
        assert (event["event"], event["data"]["state"], event["data"]["reason"]) == ("update", "failed",
                                                                                     "sha256_mismatch")
        good = signed_command(fleet, BIRDS, 2)
        installed = fleet.commands.send("cam-00", Command.DEPLOY, good)
        assert outcome(fleet, installed)["data"]["state"] == "active"
        assert agent.version() == "2"
        replayed = fleet.commands.send("cam-00", Command.DEPLOY, good)  # the same signed manifest, a new command id
        assert outcome(fleet, replayed)["data"]["reason"] == "replay"
        downgrade = fleet.commands.send("cam-00", Command.DEPLOY, signed_command(fleet, V1, 1))
        assert outcome(fleet, downgrade)["data"]["reason"] == "downgrade"
        again = fleet.commands.send("cam-00", Command.DEPLOY, good, command_id=installed)  # a duplicate command
        time.sleep(1.0)
        downloads = [e for e in fleet.db.device_events("cam-00", 500) if e.get("cmd_id") == again
                     and e["event"] == "update" and e["data"]["state"] == "downloading"]
        assert len(downloads) == 1  # installed once, the duplicate answered from the command log
        assert agent.version() == "2"
    finally:
        agent.stop()


def test_a_rollback_during_an_update_s_trial_ends_the_trial_and_keeps_the_committed_model(tmp_path, broker, fleet,
                                                                                          clip):
    """The fleet may judge a canary before the device's own health gate has: its rollback, queued behind the deploy,
    ends the trial at once (not after the gate's 60 s) and answers with the model kept. It used to wait for the trial
    and then find no previous model to go back to, leaving the device on the new one."""
    (agent,) = start_agents(tmp_path, broker, fleet, clip, 1, update_health_frames=100_000)  # a gate that never decides
    try:
        update = fleet.commands.send("cam-00", Command.DEPLOY, signed_command(fleet, BIRDS, 2))
        assert wait(lambda: agent.version() == "2", 60)  # swapped in: the trial is running
        rollback = fleet.commands.send("cam-00", Command.ROLLBACK, {})
        ended = outcome(fleet, update, timeout=20)
        assert (ended["data"]["state"], ended["data"]["reason"]) == ("rolled_back", "rollback_requested"), ended
        answered = outcome_of(fleet, rollback)
        assert answered["event"] == "cmd_result", answered
        assert answered["data"]["result"] == {"state": "active", "version": 1}, answered
        assert agent.version() == "1"
        assert ModelSlots(tmp_path / "cam-00").active.version == 1
    finally:
        agent.stop()


def outcome_of(fleet: FleetManager, command_id: str, timeout: float = 20) -> dict:
    """The cmd_result or cmd_rejected event answering ``command_id``."""
    def find():
        return next((e for e in fleet.db.device_events("cam-00", limit=500) if e.get("cmd_id") == command_id
                     and e["event"] in ("cmd_result", "cmd_rejected")), None)
    assert wait(lambda: find() is not None, timeout), fleet.db.device_events("cam-00")
    return find()


def test_an_update_to_a_pipeline_of_several_sources_swaps_its_engine_and_every_stream_goes_on(
        tmp_path, broker, fleet, clip):
    """A MultiPipeline takes the new model between two batches: the update passes the health gate and is
    committed, and both streams run the new model."""
    pipelines = [{"name": "main", "model": str(V1), "sources": [str(clip), {"name": "b", "source": str(clip)}],
                  "task": "classify", "loop": True, "max_fps": 3, "threads": 1, "version": "1"}]
    (agent,) = start_agents(tmp_path, broker, fleet, clip, 1, pipelines=pipelines)
    try:
        command = fleet.commands.send("cam-00", Command.DEPLOY, signed_command(fleet, BIRDS, 2))
        event = outcome(fleet, command)
        assert event["data"]["state"] == "active", event
        runner = agent.agent.runners[0]
        assert agent.version() == "2" and runner.status == "running"
        state = json.loads((tmp_path / "cam-00" / "models" / "slots.json").read_text())
        assert state.get("trial") is None and state["active"]["version"] == 2  # committed, no trial left open
        pipeline = runner.pipeline  # the same MultiPipeline as before the update, now on the bird model
        assert pipeline.engine.model.sha256 == inspect_model(BIRDS).sha256
        frames = runner.stats().frames  # both streams' frames
        assert wait(lambda: runner.stats().frames >= frames + 6, 20)  # both streams go on (3 fps each)
        assert set(runner.stats().streams) == {"stream0", "b"}
    finally:
        agent.stop()


def test_download_cut_several_times_still_installs(tmp_path, broker, clip):
    settings = FleetSettings(broker=broker.url, http="127.0.0.1:0", data_dir=tmp_path / "fleet")
    with FleetManager(settings) as fleet:
        proxy = CuttingProxy(fleet.http.port, cut_after=900_000, cuts=3)
        fleet.settings = FleetSettings(**{**settings.__dict__, "public_url": f"http://127.0.0.1:{proxy.port}"})
        try:
            assert fleet.wait_connected(10)
            (agent,) = start_agents(tmp_path, broker, fleet, clip, 1)
            try:
                command = fleet.commands.send("cam-00", Command.DEPLOY, signed_command(fleet, BIRDS, 2))
                assert outcome(fleet, command)["data"]["state"] == "active"
                assert proxy.connections >= 4 and agent.version() == "2"
            finally:
                agent.stop()
        finally:
            proxy.close()


@pytest.mark.parametrize("kill_after", ["downloading", "validating"])
def test_agent_killed_mid_update_comes_back_on_one_version(tmp_path, broker, fleet, clip, kill_after):
    key = fleet.key.public_key_b64()
    config = write_config(tmp_path / "agent.yaml", **agent_settings(tmp_path, broker.url, "cam-00", key, clip))
    with AgentProcess(config, tmp_path / "agent.log") as process:
        assert wait(lambda: any(d["online"] for d in fleet.db.list_devices()), 60), process.output()
        command = fleet.commands.send("cam-00", Command.DEPLOY, signed_command(fleet, BIRDS, 2))
        assert wait(lambda: any(e.get("cmd_id") == command and e["data"].get("state") == kill_after
                                for e in fleet.db.device_events("cam-00", 500)), 60), process.output()
        process.kill()
    slots = ModelSlots(tmp_path / "cam-00")  # opening discards an unfinished trial, as the agent does
    assert slots.active.version in (1, 2) and slots.trial is None
    boot_ids = {d["state"]["boot_id"] for d in fleet.db.list_devices()}
    with AgentProcess(config, tmp_path / "agent2.log") as process:
        assert wait(lambda: (d := fleet.db.get_device("cam-00"))["online"] and d["state"]["boot_id"] not in boot_ids
                    and d["model_version"] in (1, 2) and d["model_sha256"], 60), process.output()
        reported = fleet.db.get_device("cam-00")["model_version"]
        assert reported == ModelSlots(tmp_path / "cam-00").active.version
        sha = fleet.db.get_device("cam-00")["model_sha256"]
        expected = {1: V1, 2: BIRDS}[reported]
        assert sha == hashlib.sha256(expected.read_bytes()).hexdigest()


def test_tls_end_to_end_an_enrolled_agent_takes_a_rollout_over_mqtts_and_https(tmp_path, clip):
    """`fleet serve --tls`: a real agent, enrolled (its own account), verifies the managed broker (mqtts only)
    and the API (https only) against the fleet's CA, takes a signed deploy and downloads the model with its
    credential over https — TLS end to end, as docs/security.md describes."""
    from support.ports import free_port

    from edgeinfer.fleet.client import FleetClient

    settings = FleetSettings(broker=None, broker_port=free_port(), http="127.0.0.1:0", data_dir=tmp_path / "fleet",
                             tls=True)
    with FleetManager(settings) as fleet:
        assert fleet.wait_connected(10)
        admin = FleetClient(fleet.http.url, token=fleet.admin_token, ca=fleet.access.ca.ca_file)
        enrolled = admin.enroll("cam-tls", "lab")
        config = agent_settings(tmp_path, "unused", "cam-tls", "unused", clip) | enrolled
        agent = AgentThread(config)
        agent.thread.start()
        try:
            assert wait(lambda: (d := fleet.db.get_device("cam-tls")) is not None and d["online"], 60)
            sha = admin.upload(BIRDS)["sha256"]
            created = admin.create_deployment(DeploymentSpec(sha256=sha, model_name=BIRDS.name, version=2,
                                                             devices=["cam-tls"], canary_analysis=False))
            assert created["devices"][0]["device_id"] == "cam-tls"
            final = wait_for_deployment(admin.deployment, created["deployment_id"], timeout_s=120)
            assert final["status"] == "succeeded", final
            assert agent.version() == "2" and fleet.public_url.startswith("https://")
            # the agent's state says what runs and what a rollback would go back to (the dashboard shows it)
            def slots() -> dict:
                return (fleet.devices.get("cam-tls") or {}).get("slots") or {}

            assert wait(lambda: (slots().get("active") or {}).get("version") == 2, 30), \
                json.dumps(fleet.devices.get("cam-tls")["state"])[:3000]
            slots = slots()
            assert (slots["pipeline"], slots["previous"]["version"], slots["previous"]["sha256"]) == (
                "main", 1, hashlib.sha256(V1.read_bytes()).hexdigest())
        finally:
            agent.stop()
