"""Helpers for the optimize and bench tests."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from .assets import (
    IMAGENET_LABELS,
    IMAGES,
    MOBILENET_TINY,
    MOBILENET_TINY_ONNX,
    MOBILENET_V2,
    MOBILENET_V2_FLOAT_ONNX,
    MOBILENET_V2_ONNX,
    MODELS,
)
from .processes import edgeinfer_cmd

#: MobileNet v2 (TF) normalisation: (pixel - 128) / 128, see ../shared/assets/README.md
MOBILENET_NORM = ("--mean", "128", "--std", "128")

#: the Ultralytics YOLO detectors (AGPL: test data, read in place, never copied into the repository)
YOLO_FALL = MODELS / "yolo_fall_detection.onnx"
YOLO_POSE = MODELS / "yolo11n-pose.onnx"
#: a detector's calibration photos, and the held-back ones it is judged on (people in both)
DETECTOR_CALIBRATION = ("squat.bmp", "pets.jpg", "cat.bmp", "face.jpg")
DETECTOR_VALIDATION = ("grace_hopper.bmp", "kite_and_cold.jpg", "cat_720p.jpg", "dog_segmentation.bmp",
                       "parrot.jpg")


def run_cli(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    """The CLI in a subprocess, as a user runs it."""
    return subprocess.run(edgeinfer_cmd(*map(str, args)), capture_output=True, text=True, timeout=timeout)


def json_out(result: subprocess.CompletedProcess) -> dict:
    """The JSON document a ``--json`` command printed on stdout."""
    return json.loads(result.stdout)


def error_line(result: subprocess.CompletedProcess) -> str:
    """The single ``edgeinfer: error:`` line of a failed command (asserts there is exactly one line)."""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("edgeinfer: error:"), lines[0]
    assert "Traceback" not in result.stderr
    return lines[0]


def image_folder(folder: Path, names: tuple[str, ...]) -> Path:
    """``folder`` made to hold the named photos (links to the shared assets, not copies)."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        (folder / name).symlink_to(IMAGES / name)
    return folder


def leftovers(folder: Path) -> list[str]:
    """Temporary files an interrupted or refused write would leave behind."""
    return sorted(p.name for p in folder.iterdir() if ".tmp" in p.name or p.name.endswith(".probe"))


__all__ = [
    "DETECTOR_CALIBRATION",
    "DETECTOR_VALIDATION",
    "IMAGENET_LABELS",
    "IMAGES",
    "MOBILENET_NORM",
    "MOBILENET_TINY",
    "MOBILENET_TINY_ONNX",
    "MOBILENET_V2",
    "MOBILENET_V2_FLOAT_ONNX",
    "MOBILENET_V2_ONNX",
    "YOLO_FALL",
    "YOLO_POSE",
    "error_line",
    "image_folder",
    "json_out",
    "leftovers",
    "run_cli",
]
