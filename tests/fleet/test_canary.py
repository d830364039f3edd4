"""Canary analysis: the verdict on crafted telemetry (each metric can fail, a healthy canary passes, a rollout
with no control group compares the canary with its own telemetry from before); 200 simulated devices behind
a real manager and its managed Mosquitto (a 5x slower model and a drifting one aborted and rolled back, a
healthy one rolled out); real agents running real models (a much slower model aborted and rolled back; a
model that answers with other classes aborted)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import uuid
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest
from pydantic import ValidationError
from support.assets import IMAGES, MODELS
from support.canary import AgentThread, simulated_fleet, window
from support.fleet import admin_token_file
from support.processes import edgeinfer_cmd
from support.processes import wait_until as wait

from edgeinfer.fleet.api.schemas import DeploymentSpec, describe_error
from edgeinfer.fleet.canary import Thresholds, analyse, total_variation
from edgeinfer.fleet.db import FleetDB
from edgeinfer.fleet.rollout import step

HEALTHY_TOP = {"macaw": 20, "tabby": 8, "toucan": 2}
CANARY = [f"cam-{i}" for i in range(2)]
CONTROL = [f"cam-{i}" for i in range(2, 8)]
T = Thresholds()


def rows(devices, count=6, start=1000.0, **figures):
    return [window(d, start + i, **figures) for d in devices for i in range(count)]


def metric(verdict, name):
    return next(m for m in verdict.metrics if m.name == name)


# ------------------------------------------------------------------------------------------ the verdict
def test_a_healthy_canary_passes_on_every_metric():
    verdict = analyse(rows(CANARY, infer_p95=10.5, fps=29.0, top=HEALTHY_TOP),
                      rows(CONTROL, infer_p95=10.0, fps=30.0, top={"macaw": 19, "tabby": 9, "toucan": 2}), T)
    assert verdict.passed and verdict.baseline == "control", verdict.summary
    assert {m.name for m in verdict.metrics if m.judged} == {"latency", "fps", "error_rate", "output_drift"}
    assert (verdict.canary_windows, verdict.control_windows, verdict.canary_devices) == (12, 36, 2)
    assert metric(verdict, "latency").change == pytest.approx(5.0)
    assert metric(verdict, "output_drift").canary == pytest.approx(1 / 30)
    assert json.loads(json.dumps(verdict.to_dict()))["passed"] is True


def test_a_slower_canary_fails_on_latency_and_says_by_how_much():
    verdict = analyse(rows(CANARY, infer_p95=50.0, top=HEALTHY_TOP), rows(CONTROL, infer_p95=10.0, top=HEALTHY_TOP),
                      T)
    latency = metric(verdict, "latency")
    assert not verdict.passed and [m.name for m in verdict.failed] == ["latency"]
    assert (latency.canary, latency.control, latency.change, latency.threshold) == (50.0, 10.0, 400.0, 50.0)
    assert latency.message == ("p95 infer latency +400% (canary 50 ms, control 10 ms) > "
                               "--max-latency-regression 50%")
    assert latency.message in verdict.summary
    # the threshold is the operator's: a 300% regression passes a 500% limit
    assert analyse(rows(CANARY, infer_p95=40.0), rows(CONTROL, infer_p95=10.0),
                   dataclasses.replace(T, max_latency_regression=500)).passed


def test_an_fps_drop_fails():
    verdict = analyse(rows(CANARY, fps=12.0), rows(CONTROL, fps=30.0), T)
    assert [m.name for m in verdict.failed] == ["fps"]
    assert metric(verdict, "fps").change == pytest.approx(60.0)
    assert "fps dropped 60% (canary 12, control 30) > --max-fps-drop 25%" in verdict.summary


def test_a_pipeline_that_keeps_failing_fails_the_error_rate():
    canary = [window(d, 1000.0 + i, status="running" if i % 2 else "restarting", restarts=i // 2)
              for d in CANARY for i in range(10)]
    verdict = analyse(canary, rows(CONTROL), T)
    rate = metric(verdict, "error_rate")
    assert [m.name for m in verdict.failed] == ["error_rate"]
    assert rate.canary == pytest.approx(0.5) and rate.control == 0.0 and rate.change == pytest.approx(50.0)
    # a restart seen only as a higher count in the next window counts too
    restarted = [window("cam-0", 1000.0 + i, restarts=0 if i < 3 else 1) for i in range(6)]
    assert metric(analyse(restarted, rows(CONTROL), T), "error_rate").canary == pytest.approx(1 / 6)


def test_answers_in_another_class_order_fail_the_output_drift():
    permuted = {"tabby": 20, "toucan": 8, "macaw": 2}
    verdict = analyse(rows(CANARY, top=permuted), rows(CONTROL, top=HEALTHY_TOP), T)
    drift = metric(verdict, "output_drift")
    assert [m.name for m in verdict.failed] == ["output_drift"]
    assert drift.canary == pytest.approx(total_variation(Counter(permuted), Counter(HEALTHY_TOP)))
    assert drift.canary == pytest.approx(0.6)
    assert drift.message.startswith("output drift 0.60 (total variation")
    assert drift.message.endswith("> --max-output-drift 0.2")


def test_a_detector_is_judged_on_detections_per_frame_and_confidence():
    people = {"person": 60, "car": 30}
    healthy = rows(CONTROL, top=people, detections=90, score=0.7)
    fewer = analyse(rows(CANARY, top={"person": 20, "car": 10}, detections=30, score=0.7), healthy, T)
    assert [m.name for m in fewer.failed] == ["detections"]
    assert metric(fewer, "detections").canary == pytest.approx(1.0) and metric(fewer, "detections").control == 3.0
    unsure = analyse(rows(CANARY, top=people, detections=90, score=0.4), healthy, T)
    assert [m.name for m in unsure.failed] == ["confidence"]
    assert analyse(rows(CANARY, top=people, detections=88, score=0.69), healthy, T).passed


def test_a_metric_without_figures_is_not_judged_and_does_not_fail():
    verdict = analyse(rows(CANARY, infer_p95=None), rows(CONTROL, infer_p95=None), T)  # no stage timings, no outputs
    assert verdict.passed
    assert not metric(verdict, "latency").judged and not metric(verdict, "output_drift").judged
    assert metric(verdict, "latency").message == "p95 infer latency: no figures to compare"


def test_bad_thresholds_are_refused_with_the_reason():
    def spec(**given) -> DeploymentSpec:
        return DeploymentSpec.model_validate({"sha256": "0" * 64, "version": 1, "all": True, **given})

    assert spec().thresholds() == Thresholds()
    assert not spec(canary_analysis=False).thresholds().enabled
    assert spec(canary_window_s=30, max_output_drift=0.5).thresholds().window_s == 30.0
    assert spec(max_fps_drop=None).thresholds().max_fps_drop == Thresholds().max_fps_drop  # null: the default
    for given, words in (({"max_output_drift": 2}, "max_output_drift: Input should be less than or equal to 1"),
                         ({"max_fps_drop": "lots"}, "max_fps_drop: Input should be a valid number"),
                         ({"canary_window_s": 0}, "canary_window_s"),
                         ({"canary_min_windows": 2.5}, "canary_min_windows: Input should be a valid integer"),
                         ({"canary_analysis": "yes"}, "canary_analysis: Input should be a valid boolean")):
        with pytest.raises(ValidationError) as info:
            spec(**given)
        assert words in describe_error(info.value), describe_error(info.value)


# ------------------------------------------------------------------------------- the summary on the wire
def test_the_output_summary_travels_bounded_and_hostile_ones_are_refused():
    from edgeinfer.agent.telemetry import BootSequence, pipeline_entry, telemetry_message
    from edgeinfer.errors import ProtocolError
    from edgeinfer.link import schema_fast
    from edgeinfer.link.protocol import SCHEMAS, Topics, decode

    # what Pipeline.take_window() returns, as far as telemetry reads it
    stats = SimpleNamespace(frames=30, dropped=0, fps=29.5, delegate="xnnpack", stages={}, degraded=True,
                            delegate_wanted="coral",
                            outputs={"frames": 30, "top": {f"label-{i}": i + 1 for i in range(14)} | {"x" * 300: 99},
                                     "detections": 0, "score_mean": 0.75})
    entry = pipeline_entry("main", "running", stats)
    assert entry["degraded"] is True and entry["delegate_wanted"] == "coral"
    top = entry["outputs"]["top"]
    assert len(top) == 10 and top[0] == {"label": "x" * 128, "count": 99} and top[1]["count"] == 14
    message = telemetry_message(Topics("f", "cam-1"), BootSequence(), interval_s=1.0, pipelines=[entry],
                                system={"cpu_percent": 1.0, "rss_bytes": 1}, spool={"pending": 0, "dropped": 0})
    text = json.dumps(message)
    assert decode("telemetry", text) == message and schema_fast.accepts("telemetry", SCHEMAS["telemetry"], text)
    hostile = [{"frames": 1, "top": [{"label": str(i), "count": 1} for i in range(11)]},  # too many labels
               {"frames": 1, "top": [{"label": "y" * 129, "count": 1}]},  # a label too long
               {"frames": 1, "top": [{"label": "a", "count": -1}]}, {"frames": -1}, {"top": []},
               {"frames": 1, "top": {"a": 1}}, {"frames": 1, "score_mean": "high"}, "outputs"]
    for outputs in hostile:
        bad = json.loads(text)
        bad["pipelines"][0]["outputs"] = outputs
        with pytest.raises(ProtocolError, match="outputs"):
            decode("telemetry", json.dumps(bad))


# -------------------------------------------------------------------------- the rule, on a real database
def telemetry(device: str, seq: int, ts: float, infer_p95: float) -> dict:
    _d, _t, payload = window(device, ts, infer_p95=infer_p95, top=HEALTHY_TOP)
    return {**payload, "v": 1, "type": "telemetry", "fleet": "f", "device": device, "boot_id": "b" * 32,
            "seq": seq, "system": {"cpu_percent": 1.0, "rss_bytes": 1}, "spool": {"pending": 0, "dropped": 0}}


def test_with_no_control_group_the_canary_is_compared_with_itself_before_the_update(tmp_path):
    db = FleetDB(f"sqlite:///{tmp_path / 'fleet.sqlite3'}")
    try:
        manifest = {"deployment_id": uuid.uuid4().hex, "model_name": "m", "version": 2, "sha256": "a" * 64,
                    "size": 1, "target": "all"}
        options = {"canary_pct": 100.0, "canary_analysis": Thresholds(window_s=10.0, min_windows=3).to_options()}
        db.create_deployment(manifest, "sig", options, [["cam-0", "cam-1"]])  # one wave: nobody stays behind
        notified, active = 1000.0, 1005.0
        for device in ("cam-0", "cam-1"):
            for seq in range(1, 11):  # before: 10 ms; from the update on: 30 ms
                ts = notified - 10 + seq * 2 if seq <= 5 else active + (seq - 5) * 2
                db.record_telemetry("f", device, telemetry(device, seq, ts, 10.0 if seq <= 5 else 30.0))
            db.advance_target(manifest["deployment_id"], device, "notified", now=notified)
            db.advance_target(manifest["deployment_id"], device, "active", now=active)
        rolled_back: list[str] = []

        def run(now: float) -> str | None:
            (deployment,) = db.running_deployments() or [None]
            if deployment is None:
                return "ended"
            return step(db, deployment, lambda device: None, now=now, rollback=rolled_back.append)

        assert run(active + 5) is None  # the window is not over: no verdict yet
        assert db.get_deployment(manifest["deployment_id"])["analysis"] is None
        assert run(active + 11) == "aborted"
        found = db.get_deployment(manifest["deployment_id"])
        analysis = found["analysis"]
        assert analysis["baseline"] == "before" and not analysis["passed"]
        latency = next(m for m in analysis["metrics"] if m["name"] == "latency")
        assert (latency["canary"], latency["control"], latency["change"]) == (30.0, 10.0, 200.0)
        assert "p95 infer latency +200% (canary 30 ms, before 10 ms)" in found["detail"]
        assert sorted(rolled_back) == ["cam-0", "cam-1"] and found["counts"] == {"rolled_back": 2}
    finally:
        db.close()


# ---------------------------------------------------------------------- 200 simulated devices, a real manager
SIM_DEVICES = 200
BEHAVIOURS = {"slower.tflite": "slow:5", "drifting.tflite": "drift", "better.tflite": "healthy"}


@pytest.fixture(scope="module")
def sim(tmp_path_factory):
    with simulated_fleet(tmp_path_factory.mktemp("canary-fleet"), devices=SIM_DEVICES,
                         behaviours=BEHAVIOURS) as fleet:
        yield fleet


#: how long a simulated device may take to answer before it counts as failed: a bound, not a speed (at 30 s, 85 of the
#: 200 did not answer on a machine loaded to 20 runnable processes a core, and the healthy rollout was aborted)
DEVICE_TIMEOUT_S = 120


def sim_deploy(sim, name: str, version: int, tmp_path: Path) -> dict:
    model = tmp_path / name
    model.write_bytes(name.encode() * 64)  # the simulator runs whatever it is told a model does
    sha = sim.admin.upload(model)["sha256"]
    created = sim.admin.create_deployment(DeploymentSpec(
        sha256=sha, model_name=name, version=version, all=True, canary_pct=10, device_timeout_s=DEVICE_TIMEOUT_S,
        canary_window_s=4, canary_min_windows=20))
    deployment_id = created["deployment_id"]
    assert wait(lambda: sim.admin.deployment(deployment_id)["status"] != "running", 3 * DEVICE_TIMEOUT_S, 0.2), \
        sim.admin.deployment(deployment_id)["counts"]
    return sim.admin.deployment(deployment_id)


def canary_of(final: dict) -> list[str]:
    return [t["device_id"] for t in final["devices"] if t["wave"] == 0]


def assert_aborted_and_rolled_back(sim, final: dict, version: int) -> None:
    canary = canary_of(final)
    assert final["status"] == "aborted" and len(canary) == SIM_DEVICES // 10
    assert final["counts"] == {"rolled_back": 20, "pending": 180}
    devices = {d.device_id: d for d in sim.simulation.devices}
    # the canary got the signed rollback and runs its previous model again; nobody else was ever notified
    assert wait(lambda: all(devices[d].version < version and not devices[d].behaviour.drift
                            and devices[d].behaviour.slow == 1.0 for d in canary), 20)
    later = [d for d in devices if d not in canary]
    assert not any(final["deployment_id"] in devices[d].deployments for d in later)


def test_200_devices_a_5x_slower_model_is_aborted_on_latency(sim, tmp_path):
    final = sim_deploy(sim, "slower.tflite", 2, tmp_path)
    analysis = final["analysis"]
    assert "p95 infer latency" in final["detail"] and "--max-latency-regression 50%" in final["detail"], final
    latency = next(m for m in analysis["metrics"] if m["name"] == "latency")
    assert not latency["passed"] and latency["change"] > 300  # 5x: +400%, give or take the random spread
    assert analysis["baseline"] == "control" and analysis["canary_devices"] == 20
    assert analysis["control_devices"] == 100  # 180 later-wave devices, sampled
    assert next(m for m in analysis["metrics"] if m["name"] == "output_drift")["passed"]  # same answers
    print("slower:", latency["message"])
    assert_aborted_and_rolled_back(sim, final, 2)


def test_200_devices_a_drifting_model_is_aborted_on_output_drift(sim, tmp_path):
    final = sim_deploy(sim, "drifting.tflite", 3, tmp_path)
    drift = next(m for m in final["analysis"]["metrics"] if m["name"] == "output_drift")
    assert "output drift" in final["detail"] and "--max-output-drift 0.2" in final["detail"], final
    assert not drift["passed"] and drift["canary"] > 0.5
    assert next(m for m in final["analysis"]["metrics"] if m["name"] == "latency")["passed"]
    print("drifting:", drift["message"])
    assert_aborted_and_rolled_back(sim, final, 3)


def test_200_devices_a_healthy_model_passes_and_rolls_out_everywhere(sim, tmp_path):
    final = sim_deploy(sim, "better.tflite", 4, tmp_path)
    assert final["status"] == "succeeded", final.get("detail")
    assert final["counts"] == {"active": SIM_DEVICES}
    assert final["analysis"]["passed"] and not [m for m in final["analysis"]["metrics"] if not m["passed"]]
    print("healthy:", final["analysis"]["summary"])
    listed = subprocess.run(edgeinfer_cmd("fleet", "deployments", "--fleet-url", sim.manager.http.url,
                                          "--token-file", admin_token_file(sim.manager)),
                            capture_output=True, text=True, timeout=60)
    assert listed.returncode == 0, listed.stderr
    assert "failed: latency" in listed.stdout and "failed: output_drift" in listed.stdout
    assert "passed" in listed.stdout
    shown = subprocess.run(edgeinfer_cmd("fleet", "deployment", final["deployment_id"], "--fleet-url",
                                         sim.manager.http.url, "--token-file", admin_token_file(sim.manager)),
                           capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0 and "canary analysis passed" in shown.stdout, shown.stderr


# ------------------------------------------------------------------------------------------ real agents
V1_SMALL = MODELS / "mobilenet_v1_0.25_128_quant.tflite"
V2_LARGE = MODELS / "mobilenet_v2_1.0_224_quant.tflite"  # the same ImageNet classes, many times the work
BIRDS = MODELS / "mobilenet_v2_1.0_224_inat_bird_quant.tflite"  # as heavy as V2_LARGE, other classes


@pytest.fixture(scope="module")
def clip(tmp_path_factory) -> Path:
    from edgeinfer.capture import make_test_clip

    return make_test_clip(tmp_path_factory.mktemp("clip") / "clip.avi", [IMAGES / "parrot.jpg", IMAGES / "cat.bmp"],
                          size=(160, 120), fps=10, frames_per_image=5)


def start_agents(tmp_path, broker, manager, clip, model: Path, count: int, streams: int = 0) -> list[AgentThread]:
    """``count`` agents running ``model`` on the clip: as ``source``, or as that many named ``sources`` (streams)."""
    key = manager.key.public_key_b64()
    agents = []
    source = {"sources": [{"name": f"cam{s}", "source": str(clip)} for s in range(streams)]} if streams else \
        {"source": str(clip)}
    for i in range(count):
        device = f"cam-{i:02d}"
        agents.append(AgentThread({
            "device_id": device, "fleet": "lab", "broker": broker.url, "data_dir": str(tmp_path / device),
            "telemetry_interval_s": 0.5, "reconnect_min_s": 0.1, "reconnect_max_s": 1.0, "profile": "none",
            "groups": ["lab"], "update_public_key": key, "update_health_frames": 3,
            # the on-device health gate judges a model against the one before over a few frames; this test
            # is about the fleet's judgement over a window, so the device's own gate lets the model through
            "update_max_latency_factor": 1000.0,
            "pipelines": [{"name": "main", "model": str(model), **source, "task": "classify",
                           "loop": True, "max_fps": 8, "threads": 1, "version": "1"}]}))
    for agent in agents:
        agent.thread.start()
    assert wait(lambda: sum(d["online"] for d in manager.db.list_devices()) == count, 60)
    assert wait(lambda: all(a.agent.runners and a.agent.runners[0].status == "running" for a in agents), 60)
    # every agent has sent telemetry with stage timings: the control group has figures from the start
    assert wait(lambda: all(((manager.db.get_device(a.device_id) or {}).get("last_telemetry") or {})
                            .get("pipelines", [{}])[0].get("stages", {}).get("infer") for a in agents), 30)
    return agents


def deploy_cli(manager, model: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(edgeinfer_cmd("deploy", str(model), "--fleet-url", manager.http.url,
                                        "--token-file", admin_token_file(manager), *args),
                          capture_output=True, text=True, timeout=300)


def test_real_agents_a_much_slower_model_is_aborted_and_the_canary_rolled_back(tmp_path, broker, manager, clip):
    agents = start_agents(tmp_path, broker, manager, clip, V1_SMALL, 4)
    try:
        result = deploy_cli(manager, V2_LARGE, "--version", "2", "--all", "--canary", "25", "--canary-window", "4s",
                            "--device-timeout", "60")
        assert result.returncode == 1, result.stdout + result.stderr
        assert "aborted" in result.stdout and "p95 infer latency" in result.stdout, result.stdout + result.stderr
        assert "FAIL p95 infer latency" in result.stderr  # the verdict, metric by metric
        (deployment,) = manager.db.list_deployments()
        assert deployment["counts"] == {"rolled_back": 1, "pending": 3}
        latency = next(m for m in deployment["analysis"]["metrics"] if m["name"] == "latency")
        # the large model is several times slower alone; with the machine's load the ratio shrinks (4.5x seen under four
        # test workers): what is asserted is the verdict, and that the canary was clearly the slower
        assert not latency["passed"] and latency["canary"] > 2 * latency["control"], latency
        print("real agents, slower model:", latency["message"])
        canary = next(t["device_id"] for t in manager.deployments.get(deployment["deployment_id"])["devices"]
                      if t["wave"] == 0)
        by_id = {a.device_id: a for a in agents}
        assert wait(lambda: by_id[canary].version() == "1", 30)  # the signed rollback ran on the device
        assert all(a.version() == "1" for a in agents)
        assert all(not [e for e in manager.db.device_events(a.device_id) if e["event"] == "update"]
                   for a in agents if a.device_id != canary)  # nobody else was notified
    finally:
        for agent in agents:
            agent.stop()


@pytest.mark.parametrize("streams", [0, 2], ids=["one-source", "two-sources"])
def test_real_agents_a_model_that_answers_other_classes_is_aborted_on_drift(tmp_path, broker, manager, clip, streams):
    """Judged on the window's output summary: a pipeline's own, or the aggregate of its streams' (``sources``). The
    fleet runs the small ImageNet classifier (four agents of V2_LARGE at 8 fps were most of this module's CPU); the
    bird model, many times slower, is let through on latency so that the drift alone stops it."""
    agents = start_agents(tmp_path, broker, manager, clip, V1_SMALL, 4, streams)
    try:
        assert wait(lambda: all(((manager.db.get_device(a.device_id) or {}).get("last_telemetry") or {})
                                .get("pipelines", [{}])[0].get("outputs") for a in agents), 30)
        result = deploy_cli(manager, BIRDS, "--version", "2", "--all", "--canary", "25", "--canary-window", "4s",
                            "--device-timeout", "60", "--max-latency-regression", "100000")
        assert result.returncode == 1, result.stdout + result.stderr
        assert "output drift" in result.stdout, result.stdout + result.stderr
        (deployment,) = manager.db.list_deployments()
        drift = next(m for m in deployment["analysis"]["metrics"] if m["name"] == "output_drift")
        assert not drift["passed"] and drift["canary"] > 0.5, drift
        print("real agents, bird model:", drift["message"])
        canary = next(t["device_id"] for t in manager.deployments.get(deployment["deployment_id"])["devices"]
                      if t["wave"] == 0)
        assert wait(lambda: next(a for a in agents if a.device_id == canary).version() == "1", 30)
    finally:
        for agent in agents:
            agent.stop()


def test_deploy_refuses_bad_thresholds_before_it_asks_the_manager():
    for args, words in ((["--canary-window", "soon"], "not a duration"),
                        (["--max-output-drift", "3"], "--max-output-drift"),
                        (["--max-fps-drop", "-1"], "--max-fps-drop")):
        done = subprocess.run(edgeinfer_cmd("deploy", str(V1_SMALL), "--version", "2", "--all", "--fleet-url",
                                            "http://127.0.0.1:9", *args), capture_output=True, text=True, timeout=60)
        assert done.returncode == 2 and words in done.stderr, done.stderr
