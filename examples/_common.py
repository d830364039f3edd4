"""What the examples share: where the sample assets are, which source to read, when to report.

Your own program does not need this module: give edgeinfer.Pipeline your model, labels and source
(a camera index, /dev/videoN, a file, an rtsp:// URL, a GStreamer pipeline, "picamera2") directly.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from edgeinfer import PipelineStats

REPO = Path(__file__).resolve().parents[1]
CAMERA = "/dev/video0"
#: the examples print (and save annotated frames) at most this often, besides the first frame
REPORT_EVERY_S = 2.0

SOURCE_HELP = (
    "'auto' (default): the camera at /dev/video0 if there is one, else 'sample'; "
    "'sample': a video generated from the shared photos; or a video file, image, folder, camera index, "
    "/dev/videoN, rtsp:// URL, GStreamer pipeline, 'picamera2' (a Raspberry Pi camera module)"
)


def assets() -> Path:
    """The shared models, labels and photos: $EDGEINFER_ASSETS, else ../shared/assets beside the repository."""
    folder = Path(os.environ.get("EDGEINFER_ASSETS") or REPO.parent / "shared" / "assets")
    if not (folder / "models").is_dir():
        sys.exit(f"error: sample assets not found at {folder} — set EDGEINFER_ASSETS to the shared assets folder")
    return folder


def add_common_args(parser: argparse.ArgumentParser) -> None:
    """--source, --max-frames and --delegate, the same in every example."""
    parser.add_argument("--source", default="auto", help=SOURCE_HELP)
    parser.add_argument("--max-frames", type=positive_int, help="stop after this many frames (default: run to the "
                        "end of a file, for ever on a camera; Ctrl-C stops)")
    parser.add_argument("--delegate", help="run on this delegate, e.g. xnnpack, onnxruntime, openvino:CPU, coral "
                        "(default: the best available; see `edgeinfer doctor`)")


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, not {value}")
    return value


def pick_source(spec: str, photos: Sequence[str], *, same_size: bool = False, frames_per_image: int = 30) -> str:
    """``auto`` -> the camera, or ``sample`` without one; ``sample`` -> a clip of ``photos``; else ``spec``.

    ``same_size``: make the clip as large as the first photo, so that boxes and keypoints come out
    in that photo's own pixels (otherwise 640x480).
    """
    if spec == "auto":
        spec = CAMERA if Path(CAMERA).exists() else "sample"
    if spec != "sample":
        return spec
    import cv2

    from edgeinfer.capture import cached_test_clip

    images = [assets() / "images" / name for name in photos]
    size = (640, 480)
    if same_size:
        height, width = cv2.imread(str(images[0])).shape[:2]
        size = (width, height)
    # written once into $EDGEINFER_CACHE (default ~/.cache/edgeinfer) and reused
    clip = cached_test_clip(images, size=size, frames_per_image=frames_per_image)
    print(f"source: {clip} ({size[0]}x{size[1]} clip of {', '.join(photos)}, "
          f"{frames_per_image} frames each; no camera given)", file=sys.stderr)
    return str(clip)


class Every:
    """``due()`` is True on the first call, then at most once per ``seconds``."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._next = 0.0

    def due(self) -> bool:
        now = time.monotonic()
        if now < self._next:
            return False
        self._next = now + self.seconds
        return True


def summary(stats: PipelineStats) -> str:
    """One line about a finished run (PipelineStats)."""
    latency = stats.stages["latency"]
    return (f"{stats.frames} frames in {stats.elapsed_s:.1f} s: {stats.fps:.1f} fps, latency p50 "
            f"{latency['p50']:.1f} ms / p95 {latency['p95']:.1f} ms, dropped {stats.dropped}, on {stats.delegate}")
