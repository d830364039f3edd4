"""``edgeinfer run --iou / --max-detections``: non-maximum suppression set as Ultralytics users set it, on real YOLO
models and photos, through the CLI as a user runs it. The flags take ``PipelineOptions``' bounds: a value out of them
is a usage error naming the flag, in the words agent.yaml's check and the fleet's document use for the key."""

from __future__ import annotations

import json
import subprocess

import pytest
from support.assets import IMAGES, MODELS, REFERENCES
from support.processes import edgeinfer_cmd

YOLO_POSE = MODELS / "yolo11n-pose.onnx"
YOLO_FALL = MODELS / "yolo_fall_detection.onnx"
#: four people close together: boxes that overlap, and more candidates than NMS keeps
CROWD = IMAGES / "face.jpg"
#: what docs/pipeline.md tells a user to pass to get Ultralytics' predict() defaults (conf, iou, max_det)
ULTRALYTICS_FLAGS = ("--score-threshold", "0.25", "--iou", "0.7", "--max-detections", "300")


def _run(*args: object) -> subprocess.CompletedProcess:
    return subprocess.run(edgeinfer_cmd("run", *map(str, args)), capture_output=True, text=True, timeout=300)


def _results(model, source, *flags: str) -> list[list[dict]]:
    """Each frame's detections as ``edgeinfer run --json`` prints them."""
    done = _run(model, "--source", source, "--threads", "1", "--json", *flags)
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    assert lines[-1]["type"] == "summary"
    return [line["result"] for line in lines[:-1]]


def _iou(a: list[float], b: list[float]) -> float:
    width = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    height = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = width * height
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union > 0 else 0.0


def _largest_overlap(found: list[dict]) -> float:
    """The largest IoU of two kept boxes of one class (what NMS bounds)."""
    return max((_iou(a["box"], b["box"]) for i, a in enumerate(found) for b in found[i + 1:]
                if a["class_id"] == b["class_id"]), default=0.0)


def test_max_detections_keeps_the_best_boxes_only():
    [default] = _results(YOLO_POSE, CROWD)
    assert len(default) > 2, default  # the default (100) keeps every person found
    [one] = _results(YOLO_POSE, CROWD, "--max-detections", "1")
    [two] = _results(YOLO_POSE, CROWD, "--max-detections", "2")
    assert one == default[:1] and two == default[:2]  # the best first, boxes, scores and keypoints unchanged


def test_iou_is_the_overlap_nms_lets_two_boxes_of_a_class_keep():
    [tight] = _results(YOLO_POSE, CROWD, "--iou", "0.1")
    [loose] = _results(YOLO_POSE, CROWD, "--iou", "0.9")
    # each keeps no two boxes of a class overlapping more than it allows; the looser keeps overlapping boxes the
    # tighter dropped (the same person found twice, people standing close)
    assert _largest_overlap(tight) <= 0.1 < _largest_overlap(loose) <= 0.9
    assert len(tight) < len(loose)
    assert tight[0] == loose[0]  # the best box is never suppressed


def test_the_flags_docs_give_to_match_ultralytics_find_every_box_its_predict_found(tmp_path):
    """Ultralytics 8.4 ``predict(conf=0.25, iou=0.7)`` (the shared references): with docs/pipeline.md's flags the run
    finds each of its boxes, no more; at edgeinfer's default IoU (0.45) the same score threshold drops some."""
    for model in (YOLO_FALL, YOLO_POSE):
        reference = json.loads((REFERENCES / f"{model.stem}_ultralytics.json").read_text())["detections"]
        folder = tmp_path / model.stem
        folder.mkdir()
        for name in reference:  # the folder is read in name order
            (folder / name).symlink_to(IMAGES / name)
        names = sorted(reference)
        found = _results(model, folder, *ULTRALYTICS_FLAGS, "--full-decode")
        assert len(found) == len(names)
        for name, got in zip(names, found):
            expected = reference[name]
            assert len(got) == len(expected), (model.name, name, got)
            for want in expected:
                best = max((_iou(want["box_xyxy_px"], d["box"]) for d in got if d["label"] == want["label"]),
                           default=0.0)
                assert best > 0.99, (model.name, name, want)
        if model == YOLO_FALL:
            at_default_iou = _results(model, folder, "--score-threshold", "0.25", "--full-decode")
            assert sum(map(len, at_default_iou)) < sum(map(len, reference.values()))


@pytest.mark.parametrize(("flags", "message"), [
    (("--iou", "1.5"), "Invalid value for '--iou': iou_threshold must be <= 1, not 1.5"),
    (("--iou", "-0.1"), "Invalid value for '--iou': iou_threshold must be >= 0, not -0.1"),
    (("--iou", "nan"), "Invalid value for '--iou': iou_threshold must be >= 0, not nan"),
    (("--max-detections", "0"), "Invalid value for '--max-detections': max_detections must be >= 1, not 0"),
    (("--max-detections", "2.5"), "Invalid value for '--max-detections': '2.5' is not a valid integer"),
    (("--score-threshold", "nan"), "Invalid value for '--score-threshold': score_threshold must be >= 0, not nan"),
])
def test_a_bad_value_is_a_usage_error_naming_the_flag(flags, message):
    done = _run(YOLO_POSE, "--source", CROWD, *flags)
    assert done.returncode == 2 and message in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""
