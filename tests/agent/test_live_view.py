"""The fleet's live view on a real agent (real Mosquitto, the UltraFace detector on the scene clip): ``live_view``
POSTs annotated JPEGs to a real HTTP endpoint, bounded and stopping by itself; ``set_analytics`` replaces the
running pipeline's lines and zones, counts carrying on, and the change survives an agent restart."""

from __future__ import annotations

import base64
import time

import cv2
import numpy as np
from support import scenes
from support.agent import AgentProcess, fleet_key, signed_command, write_config
from support.broker import Collector
from support.frame_sink import FrameSink
from support.pipeline import ULTRAFACE

from edgeinfer.pipeline.annotate import LINE_COLOUR

CMD = "edgeinfer/v1/test/cam-01/cmd"
LINE = "door=" + ",".join(str(v) for v in scenes.LINE)


def config(tmp_path, broker, **pipeline):
    entry = {"name": "main", "model": str(ULTRAFACE), "source": str(tmp_path / "scene.avi"), "task": "detect",
             "loop": True, "max_fps": 10, "threads": 1, "lines": [LINE], "line_band": scenes.BAND, **pipeline}
    scenes.make_scene_clip(tmp_path / "scene.avi")
    return write_config(tmp_path / "agent.yaml", device_id="cam-01", fleet="test", broker=broker.url,
                        username="cam-01", password="s3cret", data_dir=str(tmp_path / "data"),
                        telemetry_interval_s=0.25, profile="none", update_public_key=fleet_key().public_key_b64(),
                        pipelines=[entry])


def answer(collector: Collector, command_id: str, timeout: float = 20) -> dict:
    def found(c: Collector) -> list[dict]:
        return [e for e in c.of_kind("events") if e["cmd_id"] == command_id and e["event"].startswith("cmd_")]

    assert collector.wait_until(lambda c: bool(found(c)), timeout), f"no answer to {command_id}"
    return found(collector)[0]


def send(collector: Collector, command_id: str, cmd: str, args: dict) -> dict:
    collector.publish(CMD, signed_command(command_id, cmd, args))
    return answer(collector, command_id)


def running(collector: Collector) -> bool:
    return any(e["event"] == "pipeline_started" for e in collector.of_kind("events"))


def test_live_view_pushes_annotated_bounded_frames_until_told_to_stop(tmp_path, broker):
    with FrameSink() as sink, Collector(broker.port) as collector, \
            AgentProcess(config(tmp_path, broker), tmp_path / "agent.log") as agent:
        assert collector.wait_subscribed() and collector.wait_until(running, 60), agent.output()
        view = {"pipeline": "main", "fps": 4, "width": 320, "url": sink.url}
        until = time.time() + 5
        result = send(collector, "lv-1", "live_view", {**view, "until": until})
        assert result["event"] == "cmd_result" and result["data"]["result"]["updated"] is False
        assert sink.wait_for(1, 20), agent.output()  # how many come before until is this machine's speed
        time.sleep(max(0.0, until + 1.5 - time.time()))  # past until, and a frame already taken delivered
        sent = len(sink.posts)
        time.sleep(1.5)
        assert len(sink.posts) == sent, "the push goes on after until"
        posts = sink.posts
        span = posts[-1].at - posts[0].at
        assert len(posts) <= 4 * span + 2  # at most fps frames a second
        for post in posts:
            assert post.headers["Content-Type"] == "image/jpeg"
            assert post.headers["Authorization"] == "Basic " + base64.b64encode(b"cam-01:s3cret").decode()
            assert float(post.headers["X-Frame-Time"]) > 1e9 and int(post.headers["X-Frame-Id"]) >= 0
        image = cv2.imdecode(np.frombuffer(posts[-1].body, np.uint8), cv2.IMREAD_COLOR)
        assert image.shape[1] == 320 and image.shape[0] == 240
        line_x = round(scenes.LINE[0] * 320 / 640)  # the counting line is drawn, in its colour
        strip = image[40:200, line_x - 2:line_x + 3].reshape(-1, 3).astype(int)
        assert (np.abs(strip - np.array(LINE_COLOUR)).sum(axis=1) < 90).sum() > 50

        # a repeat updates the running push; 410 stops it at once
        send(collector, "lv-2", "live_view", {**view, "until": time.time() + 30})
        assert sink.wait_for(sent + 2, 20)
        assert send(collector, "lv-3", "live_view", {**view, "until": time.time() + 30})["data"]["result"]["updated"]
        sink.answer = 410
        time.sleep(1.0)
        stopped = len(sink.posts)
        time.sleep(1.5)
        assert len(sink.posts) == stopped

        # 401: stops, reported once
        sink.answer = 401
        send(collector, "lv-4", "live_view", {**view, "until": time.time() + 30})
        assert collector.wait_until(lambda c: any(e["event"] == "error" for e in c.of_kind("events")), 20)
        time.sleep(1.0)
        refused = [e for e in collector.of_kind("events") if e["event"] == "error"]
        assert len(refused) == 1 and refused[0]["data"] == {"reason": "live_view_refused", "status": 401,
                                                           "stream": ""}

        # malformed: rejected with a reason, nothing pushed
        before = len(sink.posts)
        bad = [({**view, "fps": 100, "until": time.time() + 30}, "invalid_args"),
               ({**view, "url": "ftp://x/y", "until": time.time() + 30}, "invalid_args"),
               ({**view, "width": 10, "until": time.time() + 30}, "invalid_args"),
               ({**view, "until": time.time() - 5}, "until_passed"),
               ({**view, "stream": "nope", "until": time.time() + 30}, "unknown_stream"),
               ({**view, "pipeline": "nope", "until": time.time() + 30}, "failed")]
        for index, (args, reason) in enumerate(bad):
            rejected = send(collector, f"bad-{index}", "live_view", args)
            assert rejected["event"] == "cmd_rejected" and rejected["data"]["reason"] == reason, rejected
        assert agent.alive() and len(sink.posts) == before


def lines_of(collector: Collector) -> dict[str, dict]:
    entries = [p for m in collector.of_kind("telemetry") for p in m["pipelines"] if p.get("analytics")]
    return {line["name"]: line for line in entries[-1]["analytics"]["lines"]} if entries else {}


def counted(collector: Collector) -> int:
    door = lines_of(collector).get("door", {})
    return door.get("in", 0) + door.get("out", 0)


def zones_of(collector: Collector) -> list[str]:
    entries = [p for m in collector.of_kind("telemetry") for p in m["pipelines"] if p.get("analytics")]
    return [zone["name"] for zone in entries[-1]["analytics"]["zones"]] if entries else []


def test_set_analytics_changes_a_running_pipeline_and_survives_a_restart(tmp_path, broker):
    path = config(tmp_path, broker)
    new = {"pipeline": "main", "revision": 3, "lines": {"door": list(scenes.LINE), "exit": [10, 10, 10, 400]},
           "zones": {"shop": [list(p) for p in scenes.ZONE]}}
    with Collector(broker.port) as collector, AgentProcess(path, tmp_path / "agent.log") as agent:
        assert collector.wait_subscribed() and collector.wait_until(running, 60), agent.output()
        assert collector.wait_until(lambda c: counted(c) >= 1, 60), agent.output()
        before = counted(collector)
        result = send(collector, "sa-1", "set_analytics", new)
        assert result["event"] == "cmd_result" and result["data"]["result"]["applied"] is True
        [changed] = [e for e in collector.of_kind("events") if e["event"] == "analytics_changed"]
        assert changed["data"]["revision"] == 3 and set(changed["data"]["lines"]) == {"door", "exit"}
        assert collector.wait_until(lambda c: set(lines_of(c)) == {"door", "exit"} and zones_of(c) == ["shop"], 10)
        assert counted(collector) >= before  # door's counts carried on
        bad = [{"lines": {"a": [5, 5, 5, 5]}, "zones": {}},  # no length
               {"lines": {}, "zones": {"z": [[1, 1], [1, 1], [5, 5]]}},  # 2 distinct points
               {"lines": {"a": [1, 1, 5000, 5]}, "zones": {}},  # outside the 640x480 frame
               {"lines": {"a": [1, 1, 50, 5]}, "zones": {"a": [[1, 1], [50, 1], [50, 50]]}},  # one name twice
               {"lines": {"a/b": [1, 1, 50, 5]}, "zones": {}}]  # not a name (a space would be: "front door")
        reasons = []
        for index, shapes in enumerate(bad):
            rejected = send(collector, f"bad-{index}", "set_analytics", {"pipeline": "main", "revision": 4, **shapes})
            reasons.append((rejected["event"], rejected["data"]["reason"]))
        assert reasons == [("cmd_rejected", "invalid_geometry")] * 2 + [("cmd_rejected", "outside_frame")] + \
            [("cmd_rejected", "invalid_geometry")] * 2
        assert send(collector, "bad-x", "set_analytics", {"pipeline": "main", "lines": []})["data"]["reason"] == \
            "invalid_args"
        assert agent.alive()
    with Collector(broker.port) as collector, AgentProcess(path, tmp_path / "agent2.log") as agent:
        assert collector.wait_subscribed() and collector.wait_until(running, 60), agent.output()
        assert collector.wait_until(lambda c: set(lines_of(c)) == {"door", "exit"} and zones_of(c) == ["shop"], 30), \
            agent.output()
