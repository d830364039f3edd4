"""What a decoder gives beyond a box — a pose model's keypoints, an oriented box's angle, a mask's outline — is what a
run's JSON, its events' evidence and its samples carry, in one form (``forms/samples.py``).

Keypoints: the real YOLO11n-pose on the squat photo. Angles and masks: planted detections (no trained oriented-box
model can be had here, docs/models.md); the masks of a real model are tests/cli/test_decoder_plugins.py's."""

from __future__ import annotations

import json
import math
import subprocess

import numpy as np
from support.assets import IMAGES, MODELS
from support.processes import edgeinfer_cmd, env_with_repo

from edgeinfer.forms.samples import MAX_POLYGON_POINTS, MAX_POLYGONS
from edgeinfer.pipeline.events import StreamEvents, parse_rules
from edgeinfer.pipeline.postprocess import Detection, Detections, InstanceMask
from edgeinfer.pipeline.sampling import labelled_boxes

POSE = MODELS / "yolo11n-pose.onnx"


def test_a_pose_models_keypoints_are_in_its_events_evidence_and_its_samples(tmp_path):
    result = subprocess.run(edgeinfer_cmd(
        "run", str(POSE), "-s", str(IMAGES / "squat.bmp"), "--json", "--max-frames", "1", "--delegate", "onnxruntime",
        "--no-probe", "--event", "detection:0.5/person", "--evidence-dir", str(tmp_path / "evidence"),
        "--sample", "random:1", "--samples-dir", str(tmp_path / "samples")),
        capture_output=True, text=True, env=env_with_repo(), timeout=180)
    assert result.returncode == 0, result.stderr
    [frame] = [line for line in map(json.loads, result.stdout.splitlines()) if line["type"] == "result"]
    person = max(frame["result"], key=lambda d: d["score"])
    given = [[k["x"], k["y"], k["score"]] for k in person["keypoints"]]
    assert len(given) == 17
    [event] = [json.loads(p.read_text())["event"] for p in (tmp_path / "evidence").rglob("event.json")]
    assert event["box"] == person["box"]
    assert np.allclose(np.array(event["keypoints"]), np.array(given), atol=0.051)
    [sample] = [json.loads(p.read_text()) for p in (tmp_path / "samples").rglob("sample.json")]
    [kept] = [d for d in sample["detections"] if d["box"] == person["box"]]
    assert np.allclose(np.array(kept["keypoints"]), np.array(given), atol=0.051)


def _planted() -> Detections:
    ring = np.zeros((300, 400), bool)
    yy, xx = np.mgrid[0:300, 0:400]
    ring[(yy - 150) ** 2 + (xx - 200) ** 2 < 120 ** 2] = True  # a disc: its outline has hundreds of points
    rotated = (200.0, 150.0, 180.0, 60.0, math.pi / 6)
    return Detections((Detection((80.0, 30.0, 320.0, 270.0), 0.9, 0, "disc", mask=InstanceMask(0, 0, ring)),
                       Detection((110.0, 90.0, 290.0, 210.0), 0.8, 1, "ship", rotated=rotated)))


def test_an_oriented_box_and_a_mask_outline_go_into_samples_and_events_as_the_run_gives_them():
    found = _planted()
    given = [d.to_dict() for d in found]
    assert given[1]["rotated_box"] == [200.0, 150.0, 180.0, 60.0, round(math.pi / 6, 5)]
    outline = given[0]["polygons"]
    assert len(outline) <= MAX_POLYGONS and 8 <= sum(len(p) for p in outline) <= MAX_POLYGON_POINTS
    xs = [x for x, _ in outline[0]]
    assert min(xs) < 82 and max(xs) > 318  # still the disc, simplified to fit
    # the sample form
    disc, ship = labelled_boxes(found, 400, 300)
    assert disc["polygons"] == outline and "rotated_box" not in disc
    assert ship["rotated_box"] == given[1]["rotated_box"] and "polygons" not in ship
    # an event fired on each
    events = StreamEvents(parse_rules(("detection:0.5",)))  # no store: the listeners hear each event at once
    fired: list[dict] = []
    events.add_listener(fired.append)
    events.check(found, 1, 1000.0)
    assert [e["label"] for e in fired] == ["disc", "ship"]
    assert fired[0]["polygons"] == outline and fired[1]["rotated_box"] == given[1]["rotated_box"]
