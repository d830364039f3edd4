"""MJPEG decoded at the size the model needs: 1/2, 1/4 or 1/8 scale in libjpeg-turbo's DCT domain.

Most of a JPEG decode is entropy decoding, but the inverse DCT, chroma upsampling and colour
conversion shrink with the output, and a reduced-scale decode is a proper low-pass (each output
pixel averages its block) where an ``INTER_LINEAR`` resize from full size aliases. A 1080p MJPEG
frame for a 128x128 or 224x224 model decodes in about 60 % of the full-size time.

PyAV demuxes the compressed packets (no decode), simplejpeg (libjpeg-turbo) decodes each one into
a buffer the caller owns. Both are optional (``pip install edgeinfer[mjpeg]``); without them MJPEG
files go through OpenCV at full size.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import threading
from typing import TYPE_CHECKING, Any

from ..errors import CaptureError
from . import (
    DEFAULT_BACKOFF,
    DEFAULT_OPEN_TIMEOUT_S,
    DEFAULT_READ_TIMEOUT_S,
    SOURCE_HELP,
    Backoff,
    StreamSource,
    VideoFileSource,
    _Pacer,
    reduction_for,
)

if TYPE_CHECKING:
    import numpy as np

log = logging.getLogger(__name__)

def available() -> bool:
    """PyAV and simplejpeg are importable (the reduced-scale MJPEG path can be used)."""
    return all(importlib.util.find_spec(name) is not None for name in ("av", "simplejpeg"))



class JpegDecoder:
    """JPEG bytes → BGR uint8 frame, into a reused buffer, reduced when :attr:`min_size` allows."""

    def __init__(self) -> None:
        import numpy as np
        import simplejpeg

        self._np = np
        self._simplejpeg = simplejpeg
        #: (width, height) the decoded frames must not go below; None decodes at full size
        self.min_size: tuple[int, int] | None = None
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


class NotMjpeg(CaptureError):
    """The container opened, but its video is not MJPEG (the caller can use an OpenCV source)."""


class _PyAVJpegFrames:
    """What the PyAV MJPEG sources share: packets from a demuxer, decoded by a :class:`JpegDecoder`.

    Mixed in before an :class:`~edgeinfer.capture.OpenCVSource` subclass, whose reconnect / loop
    logic then runs on these ``_grab`` / ``_release``.
    """

    defers_decode = True
    description: str
    corrupt_frames: int
    _cap: Any

    def _init_pyav(self) -> None:
        #: frames decoded (or tried): fewer than read when a pipeline drops frames still compressed
        self.frames_decoded = 0
        self._decoder = JpegDecoder()
        self._packets: Any = None
        self._damage = "treating it as the end of the file"

    def prefer_min_size(self, size: tuple[int, int] | None) -> bool:
        self._decoder.min_size = size
        return True

    @property
    def native_size(self) -> tuple[int, int] | None:
        return self._decoder.native_size

    @property
    def reduction(self) -> int:
        """How much the last frame was shrunk in decoding: 1 (full size), 2, 4 or 8."""
        return self._decoder.reduction

    def _open_container(self, target: str, failure: str, **options: Any) -> tuple[Any, Any]:
        """(container, its MJPEG video stream); CaptureError (NotMjpeg when the video is another codec)."""
        import av

        try:
            container = av.open(target, **options)
        except (av.FFmpegError, OSError, ValueError) as exc:
            raise CaptureError(f"{failure} ({exc})") from exc
        streams = container.streams.video
        if not streams or streams[0].codec_context.name != "mjpeg":
            codec = streams[0].codec_context.name if streams else "no video"
            container.close()
            raise NotMjpeg(f"{self.description} is not MJPEG ({codec})")
        self._packets = container.demux(streams[0])
        return container, streams[0]

    def read_encoded(self) -> Any | None:
        """The next JPEG packet (PyAV ``Packet``, bytes-like); at the end of the packets the source's
        own rule applies (a file ends or loops, a stream reconnects). None when it ended or stopped."""
        if not self._opened:
            self.open()
        if self._interrupted.is_set() or not self._ready_to_read():
            return None
        packet = self._next_packet()
        if packet is None:
            packet = self._packet_after_end()
        if packet is not None:
            self.frames_read += 1
        return packet

    def _ready_to_read(self) -> bool:
        """False when the source was interrupted while waiting to be due (pacing)."""
        return True

    def _packet_after_end(self) -> Any | None:
        return None

    def decode(self, encoded: Any, out: np.ndarray | None = None) -> np.ndarray | None:
        self.frames_decoded += 1
        try:
            return self._decoder.decode(encoded, out)
        except ValueError as exc:
            self.corrupt_frames += 1
            log.warning("%s: skipped a frame that does not decode (%s)", self.description, exc)
            return None

    def _grab(self, out: np.ndarray | None) -> np.ndarray | None:
        while (packet := self._next_packet()) is not None:
            frame = self.decode(packet, out)
            if frame is not None:
                return frame
        return None

    def _next_packet(self) -> Any | None:
        import av

        packets = self._packets
        if packets is None:
            return None
        try:
            for packet in packets:
                if packet.size:  # (an empty one is the demuxer's end-of-stream flush packet)
                    return packet
        except av.FFmpegError as exc:
            log.warning("%s: %s; %s", self.description, exc, self._damage)
        self._packets = None
        return None

    def _release(self) -> None:
        container, self._cap, self._packets = self._cap, None, None
        if container is not None:
            container.close()


class MjpegFileSource(_PyAVJpegFrames, VideoFileSource):
    """An MJPEG video file, demuxed by PyAV and decoded by libjpeg-turbo into the caller's buffer.

    With :meth:`prefer_min_size` the frames come at 1/2, 1/4 or 1/8 of the file's size, never
    smaller than asked; :attr:`native_size` keeps the file's own size so results can be mapped
    back to it. A damaged frame is skipped and counted in :attr:`corrupt_frames`; a damaged
    container ends the file early, with a warning.
    """

    def __init__(self, path: str | os.PathLike, *, loop: bool = False, pace: bool = False) -> None:
        super().__init__(path, loop=loop, pace=pace)
        self._init_pyav()
        self._frame_count: int | None = None

    @property
    def frame_count(self) -> int | None:
        return self._frame_count

    def _open_capture(self) -> Any:
        if not self.path.is_file():
            raise CaptureError(f"video file not found: {self.path} — {SOURCE_HELP}")
        container, stream = self._open_container(str(self.path), self._open_failure())
        rate = stream.average_rate or stream.guessed_rate
        self._fps = float(rate) if rate and 0 < rate < 1000 else None
        self._frame_count = stream.frames or None
        self.backend = "PyAV+libjpeg-turbo"
        if self.pace and self._fps:
            self._pacer = _Pacer(self._fps)
        return container

    def _ready_to_read(self) -> bool:
        return not self.pace or self._pacer.wait(self)

    def _packet_after_end(self) -> Any | None:
        if not (self.loop and self.frames_read and not self._interrupted.is_set()):
            return None
        self._reopen()
        return self._next_packet()

    def _restart(self, out: np.ndarray | None) -> np.ndarray | None:
        self._reopen()
        return self._grab(out)

    def _reopen(self) -> None:
        """Back to the first frame: open the file again."""
        self._release()
        self._cap = self._open_capture()


class MjpegStreamSource(_PyAVJpegFrames, StreamSource):
    """An HTTP MJPEG stream (``multipart/x-mixed-replace``: IP cameras, ESP32-CAM, motion, mjpg-streamer)
    demuxed by PyAV and decoded by libjpeg-turbo, reduced on request like :class:`MjpegFileSource`.

    Reconnects like any live source. Opening a stream that is not MJPEG raises :class:`NotMjpeg`;
    :func:`~edgeinfer.capture.open_source` then uses OpenCV's :class:`StreamSource` for it. Hands
    out frames still compressed, so a pipeline under ``latest`` decodes only the frames it keeps.
    """

    def __init__(self, url: str, *, open_timeout_s: float = DEFAULT_OPEN_TIMEOUT_S,
                 read_timeout_s: float = DEFAULT_READ_TIMEOUT_S, backoff: Backoff = DEFAULT_BACKOFF) -> None:
        super().__init__(url, open_timeout_s=open_timeout_s, read_timeout_s=read_timeout_s, backoff=backoff)
        self._init_pyav()
        self._damage = "the stream dropped"
        self._timeouts = (open_timeout_s, read_timeout_s)

    def _packet_after_end(self) -> Any | None:
        return self._reconnect(None, grab=lambda _: self._next_packet())

    def _open_capture(self) -> Any:
        container, stream = self._open_container(self.url, self._open_failure(), timeout=self._timeouts)
        rate = stream.average_rate or stream.guessed_rate
        self._fps = float(rate) if rate and 0 < rate < 1000 else None
        self.backend = "PyAV+libjpeg-turbo"
        return container
