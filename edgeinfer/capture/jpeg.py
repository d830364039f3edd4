"""JPEG decoded at the size the model needs: 1/2, 1/4 or 1/8 scale in libjpeg-turbo's DCT domain.

Most of a JPEG decode is entropy decoding, but the inverse DCT, chroma upsampling and colour
conversion shrink with the output, and a reduced-scale decode is a proper low-pass (each output
pixel averages its block) where an ``INTER_LINEAR`` resize from full size aliases. A 1080p MJPEG
frame for a 128x128 or 224x224 model decodes in about 60 % of the full-size time.

simplejpeg (libjpeg-turbo) reads headers and decodes into a buffer the caller owns; it is
optional (``pip install edgeinfer[mjpeg]``) and imported only when a decoder or reader is made.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    import numpy as np

#: the DCT-domain reductions libjpeg-turbo does fastest, largest first
REDUCTIONS = (8, 4, 2)

#: cv2.imread flags for decoding a JPEG at 1/factor scale
IMREAD_REDUCED_FLAGS = {2: 17, 4: 33, 8: 65}  # IMREAD_REDUCED_COLOR_2/4/8 (no cv2 import at module load)

#: bytes read from the start of a JPEG file to find its size in the header
HEADER_BYTES = 256 * 1024


class DecodeFloor(NamedTuple):
    """How small a source may decode its frames: ``width`` x ``height`` at least — both sides (a model input that
    is stretched or cropped to), or with ``either``, one of them (a letterbox scales the frame by its smaller ratio,
    so only the side that limits it must keep the input's size: 1280x720 into 640x640 decodes at 640x360)."""

    width: int
    height: int
    either: bool = False


def reduction_for(native: tuple[int, int], minimum: tuple[int, int] | DecodeFloor | None) -> int:
    """The largest of 8, 4, 2 that keeps ``native`` (w, h) at or above ``minimum`` (both sides, or either side of a
    :class:`DecodeFloor` that says so); else 1."""
    if minimum is None:
        return 1
    width, height = native
    floor = minimum if isinstance(minimum, DecodeFloor) else DecodeFloor(*minimum)
    for factor in REDUCTIONS:
        wide, tall = -(-width // factor) >= floor.width, -(-height // factor) >= floor.height
        if (wide or tall) if floor.either else (wide and tall):
            return factor
    return 1


class JpegHeaderReader:
    """(width, height) of JPEG files from their headers, read into one reused buffer.

    Making one imports simplejpeg (ImportError when it is not installed).
    """

    def __init__(self) -> None:
        import simplejpeg

        self._simplejpeg = simplejpeg
        self._buffer: bytearray | None = None  # allocated on first use

    def size(self, path: Path) -> tuple[int, int] | None:
        """(width, height) of a ``.jpg`` / ``.jpeg`` file, or None (another format, unreadable)."""
        if path.suffix.lower() not in (".jpg", ".jpeg"):
            return None
        if self._buffer is None:
            self._buffer = bytearray(HEADER_BYTES)
        try:
            with path.open("rb") as handle:
                count = handle.readinto(self._buffer)
            height, width, _, _ = self._simplejpeg.decode_jpeg_header(memoryview(self._buffer)[:count])
        except (OSError, ValueError):
            return None
        return width, height


class JpegDecoder:
    """JPEG bytes → BGR uint8 frame, into a reused buffer, reduced when :attr:`min_size` allows."""

    def __init__(self) -> None:
        import numpy as np
        import simplejpeg

        self._np = np
        self._simplejpeg = simplejpeg
        #: (width, height) the decoded frames must not go below; None decodes at full size
        self.min_size: tuple[int, int] | DecodeFloor | None = None
        # Two threads may decode at once: a decoding thread sees the size and reduction of its own
        # last frame (the pipeline records them per frame), any other thread those of the last
        # frame decoded anywhere.
        self._last = threading.local()
        self._any_native: tuple[int, int] | None = None
        self._any_reduction = 1

    @property
    def native_size(self) -> tuple[int, int] | None:
        """(width, height) of the last JPEG (this thread's, if it decodes) before reduction."""
        return getattr(self._last, "native", self._any_native)

    @property
    def reduction(self) -> int:
        """The reduction of the last frame (this thread's, if it decodes); 1 = full size."""
        return getattr(self._last, "reduction", self._any_reduction)

    def decode(self, data: Any, out: np.ndarray | None = None) -> np.ndarray:
        """Decode ``data`` (bytes-like) into ``out`` when its shape fits, else into a new array.

        ValueError when ``data`` is not a complete, valid JPEG.
        """
        simplejpeg = self._simplejpeg
        height, width, _, _ = simplejpeg.decode_jpeg_header(data)
        last = self._last
        native = getattr(last, "native", None)
        if native is None or native[0] != width or native[1] != height:
            last.native = native = (width, height)  # a new tuple only when the size changes
        factor = reduction_for(native, self.min_size)
        last.reduction = factor
        self._any_native, self._any_reduction = native, factor
        shape = (-(-height // factor), -(-width // factor), 3)
        if out is None or out.shape != shape or out.dtype != self._np.uint8 or not out.flags.c_contiguous:
            out = self._np.empty(shape, self._np.uint8)
        # min_width/min_height select the scale: the smallest libjpeg-turbo offers at or above them
        decoded = simplejpeg.decode_jpeg(data, colorspace="BGR", min_width=shape[1], min_height=shape[0],
                                         buffer=out)
        if decoded.shape != shape:  # cannot happen with libjpeg-turbo's M/8 scales; never hand out a torn frame
            raise ValueError(f"decoded {decoded.shape}, expected {shape}")
        return out
