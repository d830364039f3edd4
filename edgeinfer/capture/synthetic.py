"""Generated frames (moving colour bars or a still image) for tests, soak runs and demos without a camera."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from ..errors import CaptureError
from .base import FramePacer, FrameSource

if TYPE_CHECKING:
    import numpy as np


class SyntheticSource(FrameSource):
    """Generated frames: moving colour bars, or a still image; paced at ``fps`` like a camera.

    ``frames`` bounds the run (None: endless). Useful for tests, soak runs and demos without a camera.
    """

    def __init__(self, size: tuple[int, int] = (640, 480), *, fps: float | None = 30.0,
                 image: str | os.PathLike | None = None, frames: int | None = None) -> None:
        width, height = size
        if width <= 0 or height <= 0:
            raise ValueError(f"synthetic frame size must be positive, not {width}x{height}")
        if fps is not None and fps <= 0:
            raise ValueError(f"synthetic fps must be positive, not {fps}")
        what = f"image {image}" if image else "colour bars"
        super().__init__(f"synthetic {width}x{height}" + (f"@{fps:g}" if fps else "") + f" ({what})")
        self.live = fps is not None
        self.size = (width, height)
        self.image = image
        self.limit = frames
        self._fps = fps
        self._pacer = FramePacer(fps)
        self._base: Any = None

    @property
    def fps(self) -> float | None:
        return self._fps

    def _open(self) -> None:
        import cv2

        width, height = self.size
        if self.image is not None:
            from .images import read_image

            try:
                still = read_image(self.image)
            except Exception as exc:  # ImageError: say it is about the synthetic source
                raise CaptureError(f"cannot open {self.description}: {exc}") from exc
            self._base = cv2.resize(still, (width, height), interpolation=cv2.INTER_AREA)
            return
        self._base = _colour_bars(width, height)

    def _read(self, out: np.ndarray | None) -> np.ndarray | None:
        import numpy as np

        if self.limit is not None and self.frames_read >= self.limit:
            return None
        if not self._pacer.wait(self):
            return None
        width, height = self.size
        if out is None or out.shape != (height, width, 3) or out.dtype != np.uint8:
            out = np.empty((height, width, 3), np.uint8)
        base = self._base
        if base.shape[1] == width:
            np.copyto(out, base)
        else:
            offset = (self.frames_read * 4) % width
            np.copyto(out, base[:, offset:offset + width])
        return out


def _colour_bars(width: int, height: int) -> np.ndarray:
    """Bars twice as wide as the frame; each frame is a shifted window (a copy, no allocation)."""
    import cv2
    import numpy as np

    bar = max(1, width // 8)
    hsv = np.empty((height, 2 * width, 3), np.uint8)
    hsv[..., 0] = ((np.arange(2 * width) // bar) % 8 * 22).astype(np.uint8)
    hsv[..., 1] = 200
    hsv[..., 2] = np.linspace(80, 255, height, dtype=np.uint8)[:, None]
    return cv2.cvtColor(hsv, cv2.COLOR_HSV2BGR)
