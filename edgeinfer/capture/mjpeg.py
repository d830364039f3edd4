"""MJPEG files and HTTP MJPEG streams, demuxed by PyAV and decoded at the size the model needs.

PyAV demuxes the compressed packets (no decode), :class:`~edgeinfer.capture.jpeg.JpegDecoder`
(simplejpeg, libjpeg-turbo) decodes each one into a buffer the caller owns, at 1/2, 1/4 or 1/8
scale when that is still large enough. Both are optional (``pip install edgeinfer[mjpeg]``);
without them MJPEG files go through OpenCV at full size. Neither is imported at module load.
"""

from __future__ import annotations

import importlib.util
import logging
import os
from abc import abstractmethod
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import CaptureError, NotMjpeg
from ..util.backoff import Backoff
from .base import FramePacer, FrameSource
from .jpeg import DecodeFloor, JpegDecoder
from .media import (
    DEFAULT_OPEN_TIMEOUT_S,
    DEFAULT_READ_TIMEOUT_S,
    check_video_file,
    stream_description,
    stream_open_failure,
    video_file_failure,
)
from .reconnect import DEFAULT_BACKOFF, reconnect

if TYPE_CHECKING:
    import numpy as np

log = logging.getLogger(__name__)

BACKEND = "PyAV+libjpeg-turbo"


def available() -> bool:
    """PyAV and simplejpeg are importable (the reduced-scale MJPEG path can be used)."""
    return all(importlib.util.find_spec(name) is not None for name in ("av", "simplejpeg"))


class PyAVMjpegSource(FrameSource):
    """What the PyAV MJPEG sources share: packets from a demuxer, decoded by a :class:`JpegDecoder`.

    Subclasses open their container (:meth:`_open`, through :meth:`_open_mjpeg`) and say what
    happens when the packets run out (:meth:`_packet_after_end`, :meth:`_frame_after_end`).
    """

    defers_decode = True
    #: what a demuxing error means, for the warning
    _damage = "treating it as the end of the file"

    def __init__(self, description: str) -> None:
        super().__init__(description)
        #: frames decoded (or tried): fewer than read when a pipeline drops frames still compressed
        self.frames_decoded = 0
        self.backend = ""
        self._fps: float | None = None
        self._decoder = JpegDecoder()
        self._container: Any = None
        self._packets: Any = None

    @property
    def fps(self) -> float | None:
        return self._fps

    def prefer_min_size(self, size: tuple[int, int] | DecodeFloor | None) -> bool:
        self._decoder.min_size = size
        return True

    @property
    def native_size(self) -> tuple[int, int] | None:
        return self._decoder.native_size

    @property
    def reduction(self) -> int:
        """How much the last frame was shrunk in decoding: 1 (full size), 2, 4 or 8."""
        return self._decoder.reduction

    # -- compressed frames -------------------------------------------------------------------
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

    def decode(self, encoded: Any, out: np.ndarray | None = None) -> np.ndarray | None:
        self.frames_decoded += 1
        try:
            return self._decoder.decode(encoded, out)
        except ValueError as exc:
            self.corrupt_frames += 1
            log.warning("%s: skipped a frame that does not decode (%s)", self.description, exc)
            return None

    # -- decoded frames ----------------------------------------------------------------------
    def _read(self, out: np.ndarray | None) -> np.ndarray | None:
        if not self._ready_to_read():
            return None
        frame = self._grab(out)
        return frame if frame is not None else self._frame_after_end(out)

    def _grab(self, out: np.ndarray | None) -> np.ndarray | None:
        """The next frame that decodes, or None when the packets ran out."""
        while (packet := self._next_packet()) is not None:
            frame = self.decode(packet, out)
            if frame is not None:
                return frame
        return None

    # -- the container -----------------------------------------------------------------------
    def _open_mjpeg(self, target: str, failure: str, **options: Any) -> Any:
        """Open ``target`` and demux its first video stream, which is returned; CaptureError with
        ``failure``, or NotMjpeg when the video is another codec."""
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
        stream = streams[0]
        self._container, self._packets = container, container.demux(stream)
        rate = stream.average_rate or stream.guessed_rate
        self._fps = float(rate) if rate and 0 < rate < 1000 else None
        self.backend = BACKEND
        return stream

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
        container, self._container, self._packets = self._container, None, None
        if container is not None:
            container.close()

    # -- for subclasses ----------------------------------------------------------------------
    def _ready_to_read(self) -> bool:
        """False when the source was interrupted while waiting to be due (pacing)."""
        return True

    @abstractmethod
    def _packet_after_end(self) -> Any | None:
        """The packet to hand out when the packets ran out (after a loop or a reconnect), or None."""

    @abstractmethod
    def _frame_after_end(self, out: np.ndarray | None) -> np.ndarray | None:
        """The frame to hand out when the packets ran out (after a loop or a reconnect), or None."""


class MjpegFileSource(PyAVMjpegSource):
    """An MJPEG video file, demuxed by PyAV and decoded by libjpeg-turbo into the caller's buffer.

    With :meth:`prefer_min_size` the frames come at 1/2, 1/4 or 1/8 of the file's size, never
    smaller than asked; :attr:`native_size` keeps the file's own size so results can be mapped
    back to it. A damaged frame is skipped and counted in :attr:`corrupt_frames`; a damaged
    container ends the file early, with a warning. Ends at the end, or restarts with ``loop=True``.
    """

    def __init__(self, path: str | os.PathLike, *, loop: bool = False, pace: bool = False) -> None:
        self.path = Path(path)
        super().__init__(f"video file {self.path}")
        self.loop = loop
        #: play at the file's frame rate (like a camera) instead of as fast as possible
        self.pace = pace
        self._pacer = FramePacer(None)
        self._frame_count: int | None = None

    @property
    def frame_count(self) -> int | None:
        """Frames in the file, when the container says."""
        return self._frame_count

    def _open(self) -> None:
        check_video_file(self.path)
        stream = self._open_mjpeg(str(self.path), video_file_failure(self.path))
        self._frame_count = stream.frames or None
        if self.pace and self._fps:
            self._pacer = FramePacer(self._fps)

    def _ready_to_read(self) -> bool:
        return not self.pace or self._pacer.wait(self)

    def _packet_after_end(self) -> Any | None:
        if not self._restarts():
            return None
        self._reopen()
        return self._next_packet()

    def _frame_after_end(self, out: np.ndarray | None) -> np.ndarray | None:
        if not self._restarts():
            return None
        self._reopen()
        return self._grab(out)

    def _restarts(self) -> bool:
        """The file loops, has been read from, and no one asked to stop."""
        return self.loop and bool(self.frames_read) and not self.interrupted

    def _reopen(self) -> None:
        """Back to the first frame: open the file again."""
        self._release()
        self._open()


class MjpegStreamSource(PyAVMjpegSource):
    """An HTTP MJPEG stream (``multipart/x-mixed-replace``: IP cameras, ESP32-CAM, motion, mjpg-streamer)
    demuxed by PyAV and decoded by libjpeg-turbo, reduced on request like :class:`MjpegFileSource`.

    Reconnects like any live source. Opening a stream that is not MJPEG raises :class:`NotMjpeg`;
    :func:`~edgeinfer.capture.open_source` then uses OpenCV's :class:`StreamSource` for it. Hands
    out frames still compressed, so a pipeline under ``latest`` decodes only the frames it keeps.
    """

    live = True
    _damage = "the stream dropped"

    def __init__(self, url: str, *, open_timeout_s: float = DEFAULT_OPEN_TIMEOUT_S,
                 read_timeout_s: float = DEFAULT_READ_TIMEOUT_S, backoff: Backoff = DEFAULT_BACKOFF) -> None:
        super().__init__(stream_description(url))
        self.url = url
        self.backoff = backoff
        self._timeouts = (open_timeout_s, read_timeout_s)

    def _open(self) -> None:
        self._open_mjpeg(self.url, stream_open_failure(self.description), timeout=self._timeouts)

    def _packet_after_end(self) -> Any | None:
        return self._reconnect(self._next_packet)

    def _frame_after_end(self, out: np.ndarray | None) -> np.ndarray | None:
        return self._reconnect(lambda: self._grab(out))

    def _reconnect(self, fetch: Callable[[], Any | None]) -> Any | None:
        return reconnect(self, self.backoff, release=self._release, reopen=self._open, fetch=fetch)
