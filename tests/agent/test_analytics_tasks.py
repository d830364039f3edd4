"""``set_analytics`` on every task with boxes, on a real agent (real Mosquitto, real models): a YOLO pose pipeline
(yolo11n-pose.onnx on the looping people clip, no line in its agent.yaml) is sent a line named "front door" and
counts people crossing it; a classifier's pipeline in the same agent is refused, the reason naming the tasks that
take lines and zones."""

from __future__ import annotations

from support import scenes
from support.agent import AgentProcess, fleet_key, signed_command, write_config
from support.assets import MODELS
from support.broker import Collector
from support.pipeline import MOBILENET_TINY

from edgeinfer._regions import BOX_TASKS

CMD = "edgeinfer/v1/test/cam-01/cmd"
YOLO_POSE = MODELS / "yolo11n-pose.onnx"


def answer(collector: Collector, command_id: str, timeout: float = 30) -> dict:
    def found(c: Collector) -> list[dict]:
        return [e for e in c.of_kind("events") if e["cmd_id"] == command_id and e["event"].startswith("cmd_")]

    assert collector.wait_until(lambda c: bool(found(c)), timeout), f"no answer to {command_id}"
    return found(collector)[0]


def send(collector: Collector, command_id: str, args: dict) -> dict:
    collector.publish(CMD, signed_command(command_id, "set_analytics", args))
    return answer(collector, command_id)


def crossings(collector: Collector, pipeline: str, line: str) -> dict[str, int]:
    """The line's in and out in the pipeline's latest telemetry window that counts it."""
    for message in reversed(collector.of_kind("telemetry")):
        for entry in message["pipelines"]:
            counted = {c["name"]: c for c in ((entry.get("analytics") or {}).get("lines") or [])}
            if entry["name"] == pipeline and line in counted:
                return {"in": counted[line]["in"], "out": counted[line]["out"]}
    return {"in": 0, "out": 0}


def started(collector: Collector, *pipelines: str) -> bool:
    begun = {e.get("pipeline") for e in collector.of_kind("events") if e["event"] == "pipeline_started"}
    return begun >= set(pipelines)


def test_a_pose_pipeline_takes_a_line_and_counts_people_and_a_classifier_is_told_which_tasks_do(tmp_path, broker):
    clip = scenes.make_people_clip(tmp_path / "people.avi")
    common = {"source": str(clip), "loop": True, "threads": 1}
    config = write_config(
        tmp_path / "agent.yaml", device_id="cam-01", fleet="test", broker=broker.url, username="cam-01",
        password="s3cret", data_dir=str(tmp_path / "data"), telemetry_interval_s=0.25, profile="none",
        update_public_key=fleet_key().public_key_b64(),
        pipelines=[{"name": "people", "model": str(YOLO_POSE), "max_fps": 10, "score_threshold": 0.4, **common},
                   {"name": "classes", "model": str(MOBILENET_TINY), "task": "classify", "max_fps": 2, **common}])
    line = {"front door": list(scenes.PEOPLE_LINE)}
    with Collector(broker.port) as collector, AgentProcess(config, tmp_path / "agent.log") as agent:
        assert collector.wait_subscribed() and collector.wait_until(lambda c: started(c, "people", "classes"), 120), \
            agent.output()
        applied = send(collector, "sa-pose", {"pipeline": "people", "revision": 1, "lines": line, "zones": {}})
        assert applied["event"] == "cmd_result" and applied["data"]["result"]["applied"] is True, applied
        [changed] = [e for e in collector.of_kind("events") if e["event"] == "analytics_changed"]
        assert changed["data"]["lines"] == line and changed["pipeline"] == "people"
        # the clip loops: a person walks in across the line, another walks out, again and again
        assert collector.wait_until(lambda c: min(crossings(c, "people", "front door").values()) >= 1, 120), \
            (crossings(collector, "people", "front door"), agent.output()[-3000:])

        refused = send(collector, "sa-classify", {"pipeline": "classes", "revision": 1, "lines": line, "zones": {}})
        assert refused["event"] == "cmd_rejected" and refused["data"]["reason"] == "task_without_boxes", refused
        assert f"need a task with boxes ({', '.join(BOX_TASKS)}), not 'classify'" in refused["data"]["error"]
        assert agent.alive()
