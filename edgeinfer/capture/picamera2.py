"""A Raspberry Pi camera through picamera2 (libcamera), imported when the source is opened."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from ..errors import CaptureError
from ..util.backoff import Backoff
from .base import FrameSource
from .reconnect import DEFAULT_BACKOFF, reconnect

if TYPE_CHECKING:
    import numpy as np

log = logging.getLogger(__name__)


class PiCamera2Source(FrameSource):
    """A Raspberry Pi camera through picamera2 (libcamera); frames are copied out of its DMA buffers."""

    live = True

    def __init__(self, camera: int = 0, *, size: tuple[int, int] | None = None, fps: float | None = None,
                 backoff: Backoff = DEFAULT_BACKOFF) -> None:
        super().__init__(f"picamera2 camera {camera}")
        self.camera = camera
        self.requested_size = size
        self.requested_fps = fps
        self.backoff = backoff
        self._picam: Any = None

    @property
    def fps(self) -> float | None:
        return self.requested_fps

    def _open(self) -> None:
        try:
            from picamera2 import Picamera2
        except ImportError as exc:
            raise CaptureError(
                f"cannot open {self.description}: picamera2 is not installed ({exc}) — on Raspberry Pi OS "
                "`sudo apt install python3-picamera2` (and create the venv with --system-site-packages)"
            ) from exc
        try:
            picam = Picamera2(self.camera)
            main: dict[str, Any] = {"format": "RGB888"}  # libcamera's RGB888 is B,G,R in memory: OpenCV order
            if self.requested_size:
                main["size"] = tuple(self.requested_size)
            controls = {"FrameRate": float(self.requested_fps)} if self.requested_fps else {}
            picam.configure(picam.create_video_configuration(main=main, controls=controls, buffer_count=4))
            picam.start()
        except Exception as exc:  # picamera2 raises RuntimeError/IndexError/OSError from libcamera
            raise CaptureError(f"cannot open {self.description}: {exc} — is the camera enabled and connected?") from exc
        self._picam = picam

    def _read(self, out: np.ndarray | None) -> np.ndarray | None:
        frame = self._capture(out)
        if frame is not None:
            return frame
        return reconnect(self, self.backoff, release=self._release, reopen=self._open,
                         fetch=lambda: self._capture(out))

    def _capture(self, out: np.ndarray | None) -> np.ndarray | None:
        """The next frame copied into ``out`` (a new array when it does not fit); None when the camera failed."""
        import numpy as np

        if self._picam is None:
            return None
        try:
            from picamera2 import MappedArray

            request = self._picam.capture_request()
            try:  # borrow the DMA buffer only for the copy, then hand it back to libcamera
                with MappedArray(request, "main") as mapped:
                    view = mapped.array[..., :3]
                    if out is None or out.shape != view.shape:
                        out = np.empty(view.shape, np.uint8)
                    np.copyto(out, view)
            finally:
                request.release()
        except Exception as exc:  # the camera went away: the caller reconnects
            log.warning("%s failed: %s", self.description, exc)
            return None
        return out

    def _release(self) -> None:
        picam, self._picam = self._picam, None
        if picam is not None:
            try:
                picam.stop()
            finally:
                picam.close()
