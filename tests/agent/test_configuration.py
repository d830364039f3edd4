"""Configuration revisions on a real agent process: a real fleet manager (its artifact store serves the document, its
fleet key signs the ``deploy`` command of kind ``config``, its database records the device's events and state) and a
real Mosquitto; real models, real clips. Only what a revision changes changes: a rule, a line or a sampling rule without
a restart, a source by reopening its stream, a pipeline added or removed beside the others; a revision the device cannot
run is refused with its reason, one that fails once running is rolled back, and a device killed in the middle of one
comes up on one whole revision."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
from support import scenes
from support.agent import AgentProcess, write_config
from support.assets import IMAGES, MOBILENET_TINY, MODELS, REPO
from support.broker import Collector
from support.flaky_delegate import CONTROL_ENV, install_entry_point
from support.fleet import running_fleet
from support.pipeline import ULTRAFACE
from support.processes import edgeinfer_cmd
from support.processes import wait_until as wait

from edgeinfer.fleet.auth import issue_grant
from edgeinfer.link.config_document import encode_document
from edgeinfer.link.vocabulary import Command, DeploymentKind
from edgeinfer.updates.signing import new_manifest

DEVICE = "cam-01"
LINE = "door=" + ",".join(str(v) for v in scenes.LINE)


@pytest.fixture(scope="module")
def clip(tmp_path_factory) -> Path:
    return scenes.make_scene_clip(tmp_path_factory.mktemp("scene") / "scene.avi")


def faces(name: str, clip: Path, **options) -> dict:
    """A detector on the scene clip (faces crossing the line), looping, paced."""
    return {"name": name, "model": str(ULTRAFACE), "source": str(clip), "task": "detect", "loop": True,
            "max_fps": 8, "threads": 1, **options}


def classifier(name: str, **options) -> dict:
    """The tiny classifier on a photo, looping, paced."""
    return {"name": name, "model": str(MOBILENET_TINY), "source": str(IMAGES / "parrot.jpg"), "loop": True,
            "max_fps": 5, "threads": 1, **options}


class Site:
    """A fleet manager (artifacts, the fleet key, the command spool) and a collector of what the device publishes."""

    def __init__(self, fleet, collector: Collector, tmp_path: Path) -> None:
        self.fleet, self.collector, self.tmp_path = fleet, collector, tmp_path

    def start_agent(self, pipelines: list[dict], log: str = "agent.log", env: dict | None = None) -> AgentProcess:
        fleet = self.fleet
        config = write_config(self.tmp_path / "agent.yaml", device_id=DEVICE, fleet="lab",
                              broker=fleet.settings.broker, data_dir=str(self.tmp_path / "data"),
                              telemetry_interval_s=0.25, reconnect_min_s=0.1, reconnect_max_s=1.0, profile="none",
                              update_public_key=fleet.key.public_key_b64(), pipelines=pipelines)
        agent = AgentProcess(config, self.tmp_path / log, env=env).start()
        return agent

    def state(self) -> dict:
        states = self.collector.of_kind("state")
        return states[-1] if states else {}

    def running(self) -> set[str]:
        return {p["name"] for p in self.state().get("pipelines", []) if p["status"] == "running"}

    def events(self, kind: str, pipeline: str | None = None, boot: str | None = None) -> list[dict]:
        return [e for e in self.collector.of_kind("events") if e["event"] == kind
                and (pipeline is None or e.get("pipeline") == pipeline) and (boot is None or e["boot_id"] == boot)]

    def telemetry(self, pipeline: str) -> list[dict]:
        """Every window of ``pipeline``, in order."""
        return [p for t in self.collector.of_kind("telemetry") for p in t["pipelines"] if p["name"] == pipeline]

    def send(self, document: dict | bytes, revision: int) -> str:
        """Store the document as an artifact, sign a manifest of kind config for it, send the deploy command."""
        fleet = self.fleet
        payload = document if isinstance(document, bytes) else encode_document(document)
        path = self.tmp_path / f"revision-{revision}.json"
        path.write_bytes(payload)
        digest, size = fleet.store.put(path)
        manifest = new_manifest(model_name=path.name, version=revision, sha256=digest, size=size,
                                url=f"{fleet.public_url}/artifacts/{digest}", target=f"device:{DEVICE}",
                                kind=DeploymentKind.CONFIG.value)
        args = {"manifest": manifest.to_dict(), "signature": fleet.key.sign(manifest),
                "grant": issue_grant(fleet.key, digest, DEVICE, time.time() + 600)}
        return fleet.commands.send(DEVICE, Command.DEPLOY, args)

    def updates(self, command_id: str) -> list[dict]:
        return [e for e in self.events("update") if e.get("cmd_id") == command_id]

    def outcome(self, command_id: str, timeout: float = 120) -> dict:
        """The revision's final ``update`` event (active, failed, rolled_back) or its cmd_rejected."""
        def find():
            for event in self.collector.of_kind("events"):
                if event.get("cmd_id") == command_id and (event["event"] == "cmd_rejected" or (
                        event["event"] == "update" and event["data"]["state"] in ("active", "failed", "rolled_back"))):
                    return event
            return None

        assert wait(lambda: find() is not None, timeout), self.collector.of_kind("events")[-20:]
        return find()


@pytest.fixture
def site(tmp_path, broker):
    with running_fleet(tmp_path / "fleet", broker.url) as fleet, Collector(broker.port) as collector:
        assert collector.wait_subscribed()
        yield Site(fleet, collector, tmp_path)


# ------------------------------------------------------------------------------------------ live changes

def test_a_capture_rule_and_a_new_line_reach_a_running_pipeline_without_a_restart(tmp_path, site, clip):
    agent = site.start_agent([faces("door", clip)])
    try:
        assert wait(lambda: site.running() == {"door"} and frames(site, "door") >= 20, 90), agent.output()
        read_before = frames(site, "door")  # each result is a frame read: the frame ids had passed this
        samples = tmp_path / "data" / "samples" / "door"
        document = {"pipelines": [faces("door", clip, lines=[LINE], sample=["random:1"], samples_per_minute=30)]}
        result = site.outcome(site.send(document, 1))
        assert result["data"]["state"] == "active", result
        assert result["data"]["changes"]["pipelines"] == [
            {"pipeline": "door", "change": "live", "keys": ["lines", "sample", "samples_dir", "samples_per_minute"]}]
        assert wait(lambda: list(samples.glob("*/sample.json")), 30), agent.output()
        first = min(json.loads(p.read_text())["frame_id"] for p in samples.glob("*/sample.json"))
        assert first >= read_before  # the run went on: its frame ids did not start again
        assert len(site.events("pipeline_started", "door")) == 1  # never restarted
        assert wait(lambda: (site.state().get("config") or {}).get("revision") == 1, 10)
        config = site.state()["config"]
        assert (config["source"], config["keys"]) == ("fleet", ["pipelines"])
        assert config["sha256"] == result["data"]["sha256"]
        assert wait(lambda: any("door" in {line["name"] for line in (w.get("analytics") or {}).get("lines", [])}
                                for w in site.telemetry("door")), 30)
    finally:
        agent.terminate()


def test_a_source_change_reopens_that_stream_only(tmp_path, site, clip):
    """Two streams capture every frame they can (with their frame ids): after b's source changes, a's ids go on
    where they were, b's start again from the new source's first frame; the pipeline never restarts."""
    people = scenes.make_people_clip(tmp_path / "people.avi")
    capture = {"sample": ["random:1"], "samples_per_minute": 240}
    lobby = {**faces("lobby", clip, **capture), "source": None,
             "sources": [{"name": "a", "source": str(clip)}, {"name": "b", "source": str(clip)}]}
    del lobby["source"]
    agent = site.start_agent([lobby])
    samples = tmp_path / "data" / "samples" / "lobby"
    try:
        assert wait(lambda: len(ids(samples / "a")) > 4 and len(ids(samples / "b")) > 4, 90), agent.output()
        changed = {**lobby, "sources": [{"name": "a", "source": str(clip)}, {"name": "b", "source": str(people)}]}
        sent = time.time()
        result = site.outcome(site.send({"pipelines": [changed]}, 1))
        assert result["data"]["state"] == "active", result
        assert result["data"]["changes"]["pipelines"] == [{"pipeline": "lobby", "change": "live", "keys": ["sources"],
                                                           "streams": {"closed": ["b"], "opened": ["b"]}}]
        a_before = max(i for t, i in ids(samples / "a") if t < sent)
        b_before = max(i for t, i in ids(samples / "b") if t < sent)
        assert wait(lambda: len([i for t, i in ids(samples / "a") if t > sent]) > 4
                    and len([i for t, i in ids(samples / "b") if t > sent]) > 4, 60)
        assert min(i for t, i in ids(samples / "a") if t > sent) > a_before  # a: the same capture going on
        assert min(i for t, i in ids(samples / "b") if t > sent) < b_before  # b: a new source, read from its start
        assert len(site.events("pipeline_started", "lobby")) == 1
        assert [s["source"] for s in site.state()["pipelines"][0]["streams"]] == [str(clip), str(people)]
    finally:
        agent.terminate()


def frames(site: Site, pipeline: str) -> int:
    """The pipeline's results so far, over every telemetry window."""
    return sum(w["frames"] for w in site.telemetry(pipeline))


def ids(folder: Path) -> list[tuple[float, int]]:
    """(captured_at, frame_id) of every sample in a stream's samples folder."""
    out = []
    for meta in folder.glob("*/sample.json"):
        try:
            sample = json.loads(meta.read_text())
        except (OSError, ValueError):  # being replaced by the store's bound
            continue
        out.append((sample["captured_at"], sample["frame_id"]))
    return sorted(out)


def test_a_pipeline_added_and_one_removed_leave_a_third_untouched(site):
    agent = site.start_agent([classifier("keep"), classifier("gone")])
    try:
        assert wait(lambda: site.running() == {"keep", "gone"}, 90), agent.output()
        keep_frames = len(site.telemetry("keep"))
        document = {"pipelines": [classifier("keep"), classifier("new")], "telemetry_interval_s": 0.5}
        result = site.outcome(site.send(document, 1))
        assert result["data"]["state"] == "active", result
        changes = {c["pipeline"]: c["change"] for c in result["data"]["changes"]["pipelines"]}
        assert changes == {"gone": "removed", "new": "added"}  # keep: not a word about it
        assert result["data"]["changes"]["agent"] == {"telemetry_interval_s": 0.5}
        sent = len(site.collector.of_kind("telemetry"))
        assert wait(lambda: len(site.collector.of_kind("telemetry")) > sent + 4, 30)
        assert 0.4 < site.collector.of_kind("telemetry")[-1]["interval_s"] < 0.8  # the agent's key, applied too
        assert wait(lambda: site.running() == {"keep", "new"}, 30)
        assert len(site.events("pipeline_started", "keep")) == 1 and not site.events("pipeline_restarting", "keep")
        assert len(site.events("pipeline_started", "new")) == 1
        assert wait(lambda: sum(w["frames"] for w in site.telemetry("keep")[keep_frames:]) > 10, 30)
        assert [p["name"] for p in site.state()["pipelines"]] == ["keep", "new"]
    finally:
        agent.terminate()


# ------------------------------------------------------------------------------------------ refused, rolled back

def test_a_revision_the_device_cannot_run_is_refused_with_its_reason_and_nothing_changes(tmp_path, site):
    from edgeinfer.link.config_document import document_problems

    agent = site.start_agent([classifier("main")])
    try:
        assert wait(lambda: site.running() == {"main"}, 90), agent.output()
        unknown_decoder = {"pipelines": [classifier("main", decoder="yolo 9000")]}  # not a decoder's name at all
        cases = [  # (document, reason, the detail's start)
            ({"pipelines": [classifier("main", model=str(tmp_path / "missing.tflite"))]}, "model_failed",
             "pipelines[0].model: "),
            (unknown_decoder, "invalid_document", document_problems(unknown_decoder)[0]),
            ({"pipelines": [classifier("main", decoder="yolo")]}, "model_failed", "pipelines[0].model: "),
            ({"pipelines": [classifier("main", source=str(tmp_path / "nowhere.avi"))]}, "source_failed",
             f"pipelines[0].source: {tmp_path / 'nowhere.avi'} did not open: "),
            ({"broker": "mqtt://elsewhere", "pipelines": []}, "invalid_document",
             "broker: set only in the device's agent.yaml"),
            (b'{"pipelines": [' + b'{"model": "m", "source": 0}, ' * 6000 + b"{}]}", "too_large", "(top level): "),
        ]
        for revision, (document, reason, words) in enumerate(cases, start=1):
            result = site.outcome(site.send(document, revision))
            assert (result["data"]["state"], result["data"]["reason"]) == ("failed", reason), result
            assert result["data"]["detail"].startswith(words), result
            assert wait(lambda r=revision: ((site.state().get("config") or {}).get("refused") or {}).get(
                "revision") == r, 10)
            config = site.state()["config"]
            assert (config["revision"], config["source"], config["refused"]["reason"]) == (None, "agent.yaml", reason)
        assert len(site.events("pipeline_started", "main")) == 1  # nothing changed, nothing restarted
        assert site.state()["pipelines"][0]["model"]["path"] == str(MOBILENET_TINY)
    finally:
        agent.terminate()


def test_a_revision_that_makes_a_pipeline_fail_is_rolled_back_on_its_own(tmp_path, site, monkeypatch):
    """Revision 2 moves the pipeline onto an accelerator that loads (every check passes) and fails its first invoke
    (tests/support/flaky_delegate.py, with no other delegate to go on with): the gate sees the pipeline fail and the
    agent puts revision 1 back, on its own."""
    plugin = install_entry_point(tmp_path / "site")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(REPO / "tests"), str(plugin)]))
    control = tmp_path / "device"
    control.write_text("fail")
    agent = site.start_agent([classifier("main")], env={CONTROL_ENV: str(control)})
    try:
        assert wait(lambda: site.running() == {"main"}, 90), agent.output()
        good = site.outcome(site.send({"pipelines": [classifier("main", top_k=3)]}, 1))
        assert good["data"]["state"] == "active", good
        broken = site.outcome(site.send({"pipelines": [classifier("main", top_k=3, delegate="flaky")]}, 2))
        assert (broken["data"]["state"], broken["data"]["reason"]) == ("rolled_back", "pipeline_failed"), broken
        assert "pipeline main" in broken["data"]["detail"]
        assert broken["data"]["changes"]["pipelines"] == [{"pipeline": "main", "change": "restart",
                                                           "keys": ["delegate"]}]
        assert wait(lambda: site.running() == {"main"}, 60)
        assert wait(lambda: (site.state().get("config") or {}).get("refused"), 10)
        config = site.state()["config"]
        assert config["revision"] == 1 and config["refused"]["state"] == "rolled_back"
        assert site.state()["pipelines"][0]["delegate"] != "flaky"
        frames = len(site.telemetry("main"))
        assert wait(lambda: sum(w["frames"] for w in site.telemetry("main")[frames:]) > 5, 30)  # and it runs
    finally:
        agent.terminate()


def test_an_agent_killed_while_applying_comes_up_on_one_whole_revision(tmp_path, site):
    """Revision 1 (one pipeline, top_k 3) is applied; revision 2 (another model, a second pipeline) is killed
    (SIGKILL) while it is on trial: the agent comes back on revision 1 whole — its one pipeline, its settings —
    never on part of revision 2, and says revision 2 was rolled back because it was interrupted."""
    agent = site.start_agent([classifier("main")])
    try:
        assert wait(lambda: site.running() == {"main"}, 90), agent.output()
        assert site.outcome(site.send({"pipelines": [classifier("main", top_k=3)]}, 1))["data"]["state"] == "active"
        second = {"pipelines": [classifier("main", top_k=3, model=str(MODELS / "mobilenet_v2_1.0_224_quant.tflite")),
                                classifier("extra", max_fps=1)]}
        command = site.send(second, 2)
        assert wait(lambda: any(e["data"].get("step") == "health_gate" for e in site.updates(command)), 90)
        agent.kill()
    finally:
        agent.kill()
    saved = json.loads((tmp_path / "data" / "configuration" / "state.json").read_text())
    assert saved["trial"]["revision"] == 2 and saved["applied"]["revision"] == 1  # killed on trial
    boots = {s["boot_id"] for s in site.collector.of_kind("state")}
    agent = site.start_agent([classifier("main")], log="agent2.log")
    try:
        def restarted() -> dict:
            state = site.state()
            return state if state.get("boot_id") not in boots and state.get("online") else {}

        assert wait(lambda: {p["name"] for p in restarted().get("pipelines", [])} == {"main"}
                    and site.running() == {"main"}, 90), agent.output()
        state = restarted()
        assert (state["config"]["revision"], state["config"]["trial"]) == (1, None)
        assert state["config"]["refused"]["revision"] == 2 and state["config"]["refused"]["reason"] == "interrupted"
        assert state["pipelines"][0]["model"]["path"] == str(MOBILENET_TINY)  # revision 1's model, not 2's
        assert wait(lambda: any(e["data"].get("reason") == "interrupted" and e["data"]["version"] == 2
                                for e in site.events("update", boot=state["boot_id"])), 30)
        saved = json.loads((tmp_path / "data" / "configuration" / "state.json").read_text())
        assert saved["trial"] is None and saved["applied"]["revision"] == 1
    finally:
        agent.terminate()
    # agent --check shows what runs and where each key comes from: revision 1 over agent.yaml
    checked = subprocess.run(edgeinfer_cmd("agent", "--config", str(tmp_path / "agent.yaml"), "--check"),
                             capture_output=True, text=True, timeout=120)
    assert checked.returncode == 0, checked.stderr
    shown = json.loads(checked.stdout)
    precedence = shown["configuration"]
    assert (precedence["source"], precedence["revision"], precedence["keys"]) == ("fleet", 1, ["pipelines"])
    assert {"device_id", "broker", "data_dir", "update_public_key"} <= set(precedence["agent_yaml_keys"])
    assert "pipelines" not in precedence["agent_yaml_keys"]
    assert shown["pipelines"] == ["main"] and shown["models"][0]["sha256"]
