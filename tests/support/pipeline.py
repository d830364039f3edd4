"""Support for the capture / postprocess / pipeline tests: clips, a real MJPEG HTTP server, ports.

:class:`MjpegServer` runs ``mjpeg_server.py`` in a subprocess: ``multipart/x-mixed-replace`` JPEG
frames of an image on http://127.0.0.1:PORT/ — what IP cameras and ESP32-CAMs speak. Tests kill it
mid-stream and start it again.
"""

from __future__ import annotations

import gc
import subprocess
import sys
import tracemalloc
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .assets import (
    IMAGENET_LABELS,
    IMAGES,
    LABELS,
    MOBILENET_TINY,
    MOBILENET_V2,
    MOBILENET_V2_ONNX,
    MODELS,
    REFERENCE_TOP1,
)
from .ports import free_port

#: the server script a MjpegServer runs (stdlib + OpenCV only)
MJPEG_SERVER = Path(__file__).with_name("mjpeg_server.py")

ULTRAFACE = MODELS / "ultraface_rfb_320.onnx"
MOVENET = MODELS / "movenet_single_pose_lightning_ptq.tflite"
MOVENET_ONNX = MODELS / "movenet_single_pose_lightning_ptq.onnx"
DEEPLAB = MODELS / "deeplabv3_mnv2_dm05_pascal_quant.tflite"
PASCAL_LABELS = LABELS / "pascal_voc_segmentation_labels.txt"
MOVENET_REFERENCE = LABELS / "movenet_single_pose_lightning_ptq_reference.csv"
#: Ultraface's face in grace_hopper.bmp (../shared/assets/README.md)
GRACE_HOPPER_FACE = (167, 115, 356, 327)
#: the clip tests classify: each reference photo for FRAMES_PER_IMAGE frames
CLIP_IMAGES = list(REFERENCE_TOP1)
FRAMES_PER_IMAGE = 4
CLIP_FRAMES = len(CLIP_IMAGES) * FRAMES_PER_IMAGE
PASCAL_DOG = 12

__all__ = [
    "CLIP_FRAMES", "CLIP_IMAGES", "DEEPLAB", "FACES", "FACE_IDS", "FRAMES_PER_IMAGE", "GRACE_HOPPER_FACE",
    "IMAGENET_LABELS", "IMAGES", "LABELS", "MOBILENET_TINY", "MOBILENET_V2", "MOBILENET_V2_ONNX", "MODELS", "MOVENET",
    "MOVENET_ONNX", "MOVENET_REFERENCE", "PASCAL_DOG", "PASCAL_LABELS", "REFERENCE_TOP1", "ULTRAFACE", "Face",
    "MjpegServer", "allocations_per_frame", "free_port", "reference_clip",
]


@dataclass(frozen=True)
class Face:
    """One of the two faces over the one run engine: ``Pipeline`` (one unnamed stream) or ``MultiPipeline`` (the
    same source as several named streams, ``every`` frame of each). Tests of what both share (failover, hangs,
    model updates, motion gating) run once against each."""

    name: str
    streams: tuple[str, ...]

    def build(self, model: Any, source: Any, **options: Any) -> Any:
        import edgeinfer

        if self.name == "Pipeline":
            return edgeinfer.Pipeline(model, source, **options)
        return edgeinfer.MultiPipeline(model, dict.fromkeys(self.streams, source), **{"policy": "every", **options})

    def run(self, pipeline: Any) -> Any:
        """The MultiPipeline behind either face (a Pipeline is a run of one stream)."""
        return getattr(pipeline, "_run", pipeline)

    def windows(self, pipeline: Any) -> dict[str, Any]:
        """Each stream's window since the previous call."""
        return self.run(pipeline).take_window()

    def stats(self, pipeline: Any) -> dict[str, Any]:
        """Each stream's statistics since it started."""
        return self.run(pipeline).stats()

    def collect(self, pipeline: Any, on_result: Callable[[Any], None] | None = None) -> dict[str, list]:
        """Start ``pipeline`` with a callback keeping each stream's results (then calling ``on_result``)."""
        results: dict[str, list] = {name: [] for name in self.streams}

        def keep(result: Any) -> None:
            results[result.stream].append(result)
            if on_result is not None:
                on_result(result)

        pipeline.start(keep)
        return results


#: the faces, for ``pytest.mark.parametrize("face", FACES, ids=FACE_IDS)``
FACES = (Face("Pipeline", ("",)), Face("MultiPipeline", ("a", "b", "c")))
FACE_IDS = [face.name for face in FACES]


def reference_clip(folder: Path, size: tuple[int, int] = (640, 480)) -> Path:
    """An MJPEG clip of the reference photos (FRAMES_PER_IMAGE frames each), made once per folder."""
    from edgeinfer.capture import cached_test_clip

    return cached_test_clip([IMAGES / name for name in CLIP_IMAGES], size=size, fps=30,
                            frames_per_image=FRAMES_PER_IMAGE, cache_dir=folder)


#: the invoke watchdog's floor for a steady-state measurement: an invoke stalled a second by a loaded machine (seen on
#: CI, under tracemalloc) is not a hang to fail over from, and a failover's allocations are not the steady state's
STEADY_WATCHDOG_FLOOR_S = 60.0


def allocations_per_frame(results: Iterator, frames: int = 200) -> tuple[float, int]:
    """tracemalloc over the next ``frames`` items of ``results``: (bytes per frame — the peak above each
    frame's starting level, averaged —, growth of traced memory over the whole span)."""
    gc.collect()
    tracemalloc.start()
    try:
        level = start = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        total = count = 0
        for count, _ in enumerate(results, 1):
            current, peak = tracemalloc.get_traced_memory()
            total += peak - level
            level = current
            tracemalloc.reset_peak()
            if count == frames:
                break
    finally:
        tracemalloc.stop()
    assert count == frames, f"only {count} results"
    return total / frames, level - start



class MjpegServer:
    """A real HTTP MJPEG server in a subprocess; ``kill()`` it mid-stream, ``start()`` it again."""

    def __init__(self, image: Path, port: int | None = None, fps: float = 30.0) -> None:
        self.image = image
        self.port = port or free_port()
        self.fps = fps
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/stream.mjpg"

    def start(self, image: Path | None = None) -> MjpegServer:
        if image is not None:
            self.image = image
        self.process = subprocess.Popen(
            [sys.executable, str(MJPEG_SERVER), str(self.port), str(self.image), str(self.fps)],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        )
        assert self.process.stdout is not None
        line = self.process.stdout.readline()  # "listening" once the socket is bound
        assert line.strip() == b"listening", line
        return self

    def kill(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait(timeout=10)
            self.process.stdout.close()  # type: ignore[union-attr]
            self.process = None

    def __enter__(self) -> MjpegServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.kill()
