"""Test clips: MJPEG ``.avi`` files made from real photos, for the tests, benchmarks and demo."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from pathlib import Path

from ..errors import CaptureError
from ..util.fs import atomic_path
from .images import read_image


def make_test_clip(
    path: str | os.PathLike,
    images: Sequence[str | os.PathLike],
    *,
    size: tuple[int, int] = (640, 480),
    fps: float = 30.0,
    frames_per_image: int = 30,
    quality: int = 90,
) -> Path:
    """Write an MJPEG ``.avi`` showing each image (stretched to ``size``) for ``frames_per_image`` frames.

    The clips of the tests, benchmarks and demo: real photos, a real codec, a known frame count.
    """
    import cv2

    if not images:
        raise ValueError("make_test_clip needs at least one image")
    if frames_per_image < 1 or fps <= 0 or not 1 <= quality <= 100:
        raise ValueError("frames_per_image >= 1, fps > 0 and 1 <= quality <= 100 are required")
    width, height = size
    target = Path(path)
    with atomic_path(target) as partial:  # readers never see a half-written clip
        # OpenCV picks the container by the suffix, which the temporary name keeps
        writer = cv2.VideoWriter(str(partial), cv2.CAP_OPENCV_MJPEG, cv2.VideoWriter_fourcc(*"MJPG"), float(fps),
                                 (width, height))
        if not writer.isOpened():
            raise CaptureError(f"cannot write an MJPEG clip to {target}")
        try:
            writer.set(cv2.VIDEOWRITER_PROP_QUALITY, quality)
            for image in images:
                frame = cv2.resize(read_image(image), (width, height), interpolation=cv2.INTER_AREA)
                for _ in range(frames_per_image):
                    writer.write(frame)
        finally:
            writer.release()
    return target


def cached_test_clip(
    images: Sequence[str | os.PathLike],
    *,
    size: tuple[int, int] = (640, 480),
    fps: float = 30.0,
    frames_per_image: int = 30,
    quality: int = 90,
    cache_dir: str | os.PathLike | None = None,
) -> Path:
    """:func:`make_test_clip` into a cache folder (``$EDGEINFER_CACHE`` or ``~/.cache/edgeinfer``), made once."""
    folder = Path(cache_dir or os.environ.get("EDGEINFER_CACHE") or Path.home() / ".cache" / "edgeinfer") / "clips"
    key = "|".join([*(f"{Path(p).name}:{Path(p).stat().st_size}" for p in images),
                    f"{size[0]}x{size[1]}", f"{fps:g}", str(frames_per_image), str(quality)])
    digest = hashlib.sha256(key.encode()).hexdigest()[:12]
    target = folder / f"clip-{size[0]}x{size[1]}-{digest}.avi"
    if target.is_file():
        return target
    return make_test_clip(target, images, size=size, fps=fps, frames_per_image=frames_per_image, quality=quality)
