"""``edgeinfer info`` shows what a model says about itself (its metadata), in text and in ``--json``."""

from __future__ import annotations

import json
import re

from support.assets import DOCS, MODELS
from support.metadata import YOLO_FALL, YOLO_POSE, onnx_variant
from support.optimize import run_cli

COCO = ["person", "bicycle", "car", "motorcycle", "airplane", "bus", "train", "truck", "boat", "traffic light"]


def _metadata_block(stdout: str) -> dict[str, str]:
    """The ``metadata (...)`` heading and its indented ``key value`` lines."""
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("metadata"))
    block = {"heading": lines[start]}
    for line in lines[start + 1:]:
        if not line.startswith("  "):
            break
        key, value = line.strip().split(None, 1)
        block[key] = value
    return block


def test_info_shows_the_metadata_of_a_pose_model():
    result = run_cli("info", YOLO_POSE)
    assert result.returncode == 0, result.stderr
    assert _metadata_block(result.stdout) == {
        "heading": "metadata (onnx metadata_props, ultralytics):",
        "task": "pose", "classes": "1: person", "imgsz": "640x640 (height x width)", "stride": "32",
        "kpt_shape": "17 keypoints x 3 values", "end2end": "no", "normalise": "(pixel - 0) / 255", "channels": "RGB",
        "letterbox": "yes, centre, padded with 114"}


def test_info_abbreviates_many_class_names(tmp_path):
    names = {i: COCO[i % len(COCO)] + ("" if i < len(COCO) else f" {i}") for i in range(80)}
    model = onnx_variant(tmp_path / "coco.onnx", props={"author": "Ultralytics", "task": "detect",
                                                        "names": repr(names), "imgsz": "[640, 640]"})
    result = run_cli("info", model)
    assert result.returncode == 0, result.stderr
    classes = _metadata_block(result.stdout)["classes"]
    assert classes.startswith("80: person, bicycle, car, motorcycle, airplane, bus, train, truck, …")
    assert re.search(r"\(\+72 more\)$", classes) and "traffic light" not in classes


def test_info_says_when_a_model_states_nothing():
    result = run_cli("info", MODELS / "mobilenet_v2_1.0_224_quant.onnx")
    assert result.returncode == 0, result.stderr
    assert "metadata: none" in result.stdout


def test_info_json_has_the_metadata_object():
    result = run_cli("info", YOLO_FALL, "--json")
    assert result.returncode == 0, result.stderr
    meta = json.loads(result.stdout)["metadata"]
    assert meta == {"source": "onnx metadata_props", "producer": "ultralytics", "task": "detect",
                    "names": {"0": "Normal", "1": "Fall"}, "imgsz": [640, 640], "stride": 32, "kpt_shape": None,
                    "end2end": None, "mean": [0.0, 0.0, 0.0], "std": [255.0, 255.0, 255.0], "letterbox": True,
                    "pad_value": 114, "channels": "rgb", "pad": "centre", "anchors": None, "notes": []}


def test_info_of_a_dynamic_input_with_no_size(tmp_path):
    model = onnx_variant(tmp_path / "dynamic.onnx", dynamic=True, drop=("imgsz",))
    result = run_cli("info", model)
    assert result.returncode == 0, result.stderr
    assert "images  float32[?x3x?x?]  NCHW" in result.stdout
    assert "imgsz" not in _metadata_block(result.stdout)
    assert re.search(r"^note: input 'images' has a dynamic image size .* loading it fails", result.stdout, re.M)


def test_docs_show_what_info_prints():
    """docs/models.md's example is the real output (the model's folder left out of its path)."""
    result = run_cli("info", YOLO_POSE)
    assert result.returncode == 0, result.stderr
    printed = result.stdout.replace(f"{YOLO_POSE.parent}/", "")
    assert f"$ edgeinfer info {YOLO_POSE.name}\n{printed}```" in (DOCS / "models.md").read_text()
