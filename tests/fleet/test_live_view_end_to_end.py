"""The live view end to end, with no stand-in on either side: a real agent process (its enrolled credential, the
manager's own Mosquitto) runs the face detector on the generated scene with a counting line; a viewer opens the
device's live view on the manager; the manager asks the device, the device pushes annotated frames, the viewer
gets them; an operator saves a new line and the device applies it without restarting its pipeline."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import cv2
import numpy as np
from support import scenes
from support.agent import AgentProcess, write_config
from support.live_view import Watcher
from support.pipeline import ULTRAFACE
from support.ports import free_port
from support.processes import wait_until

from edgeinfer.fleet.client import FleetClient
from edgeinfer.fleet.manager import FleetManager, FleetSettings
from edgeinfer.pipeline.annotate import LINE_COLOUR

FLEET = "f"


def _call(url: str, method: str, path: str, token: str, body: dict | None = None) -> tuple[int, object]:
    data = None if body is None else json.dumps(body).encode()
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    request = urllib.request.Request(url + path, method=method, data=data, headers=headers)
    with urllib.request.urlopen(request, timeout=10) as response:
        return response.status, json.loads(response.read() or b"null")


def _state(url: str, token: str) -> dict | None:
    """The device's last state message as the manager holds it (None until it has one)."""
    try:
        return _call(url, "GET", "/api/devices/cam-live", token)[1].get("state")  # type: ignore[union-attr]
    except urllib.error.HTTPError:
        return None


def _crossings(url: str, token: str, line: str) -> int:
    """The most crossings of ``line`` (in + out) any telemetry window of the device reported."""
    found = [0]

    def walk(value: object) -> None:
        if isinstance(value, dict):  # telemetry's analytics: lines as [{"name", "in", "out"}, ...]
            if value.get("name") == line and {"in", "out"} <= value.keys():
                found.append(int(value["in"]) + int(value["out"]))
            for item in value.values():
                walk(item)
        elif isinstance(value, list):
            for item in value:
                walk(item)

    walk(_call(url, "GET", "/api/devices/cam-live/telemetry", token)[1])
    return max(found)


def test_a_viewer_sees_the_devices_annotated_frames_and_an_operators_line_reaches_the_running_pipeline(tmp_path):
    scene = scenes.make_scene_clip(tmp_path / "scene.avi")
    settings = FleetSettings(broker=None, broker_port=free_port(), http="127.0.0.1:0", data_dir=tmp_path / "fleet")
    with FleetManager(settings) as manager:
        assert manager.wait_connected(10)
        url = manager.http.url
        admin = FleetClient(url, token=manager.admin_token)
        [device] = admin.enroll_many(["cam-live"], FLEET)
        viewer, operator = (admin.create_token(f"live-{role}", role)["token"] for role in ("viewer", "operator"))
        config = write_config(
            tmp_path / "agent.yaml", device_id="cam-live", fleet=FLEET, broker=manager.broker_url,
            username=device["username"], password=device["password"], data_dir=str(tmp_path / "data"),
            telemetry_interval_s=0.5, manager_url=url, update_public_key=manager.key.public_key_b64(),
            pipelines=[{
                "name": "main", "model": str(ULTRAFACE), "source": str(scene), "loop": True, "max_fps": 10,
                "lines": ["door=" + ",".join(str(v) for v in scenes.LINE)]}])
        with AgentProcess(config, tmp_path / "agent.log") as agent:
            assert wait_until(lambda: _state(url, viewer) is not None, 60, 0.2), agent.output()
            with Watcher(url, "/api/devices/cam-live/live/main?fps=5&width=320", viewer) as watching:
                assert watching.status == 200
                assert wait_until(lambda: len(watching.parts) >= 3, 60, 0.2), agent.output()
                frame = cv2.imdecode(np.frombuffer(watching.parts[-1].jpeg, np.uint8), cv2.IMREAD_COLOR)
                assert frame.shape == (240, 320, 3)  # the device scaled it to the width asked for
                assert (frame == np.array(LINE_COLOUR, np.uint8)).all(axis=-1).any()  # the line, drawn
            x1, y1, x2, y2 = scenes.LINE  # the scene's line under a new name: its counts start at 0 and move
            line = {"lines": {"exit": [[x1, y1], [x2, y2]]}, "zones": {}}
            status, _ = _call(url, "PUT", "/api/devices/cam-live/pipelines/main/analytics", operator, line)
            assert status == 202

            def changed() -> list:
                return _call(url, "GET", "/api/events?device=cam-live&event=analytics_changed", viewer)[1]

            assert wait_until(changed, 30, 0.2), agent.output()
            assert changed()[0]["data"]["lines"] == {"exit": [x1, y1, x2, y2]}
            # the clip loops: faces cross the new line, and the device's telemetry counts them
            assert wait_until(lambda: _crossings(url, viewer, "exit") > 0, 60, 0.5), agent.output()
            (pipeline,) = _state(url, viewer)["pipelines"]
            assert pipeline["restarts"] == 0 and pipeline["status"] == "running"  # applied to the running pipeline
