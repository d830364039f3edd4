"""What every frame source is: the :class:`FrameSource` contract, and the :class:`FramePacer` that holds
a source to a frame rate."""

from __future__ import annotations

import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from ..errors import ClosedError

if TYPE_CHECKING:
    import numpy as np

    from .jpeg import DecodeFloor


class FrameSource(ABC):
    """Something that yields BGR uint8 frames into caller-owned buffers; open, read, close."""

    #: True for cameras and streams: they reconnect when they drop, and frames come at their own pace
    live: bool = False

    def __init__(self, description: str) -> None:
        self.description = description
        #: frames delivered so far
        self.frames_read = 0
        #: successful reconnects (live sources)
        self.reconnects = 0
        #: frames that did not decode and were skipped
        self.corrupt_frames = 0
        self._opened = False
        self._closed = False
        self._interrupted = threading.Event()

    # -- lifetime ----------------------------------------------------------------------------
    def open(self) -> FrameSource:
        """Open the device / file / stream; CaptureError with what to check when it fails. Idempotent."""
        if self._closed:
            raise ClosedError(f"{self.description} is closed — open a new source")
        if not self._opened:
            self._open()
            self._opened = True
        return self

    def close(self) -> None:
        """Release the device / file / stream. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._interrupted.set()
        self._release()

    def interrupt(self) -> None:
        """Make a blocked or pacing ``read`` return None soon (used by a pipeline's stop())."""
        self._interrupted.set()

    def resume(self) -> None:
        """Undo :meth:`interrupt` so that reading can continue."""
        if not self._closed:
            self._interrupted.clear()

    @property
    def interrupted(self) -> bool:
        """True between :meth:`interrupt` (or :meth:`close`) and :meth:`resume`."""
        return self._interrupted.is_set()

    def sleep_unless_interrupted(self, seconds: float) -> bool:
        """Sleep unless interrupted; False when interrupted. Allocates nothing (no Event.wait)."""
        deadline = time.monotonic() + seconds
        while not self._interrupted.is_set():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return True
            time.sleep(min(remaining, 0.05))
        return False

    def __enter__(self) -> FrameSource:
        return self.open()

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.description}>"

    # -- frames ------------------------------------------------------------------------------
    @property
    def fps(self) -> float | None:
        """Nominal frame rate, when the source knows one."""
        return None

    def read(self, out: np.ndarray | None = None) -> np.ndarray | None:
        """The next frame (written into ``out`` when its shape fits), or None when the source ended."""
        if not self._opened:
            self.open()
        if self._interrupted.is_set():
            return None
        frame = self._read(out)
        if frame is not None:
            self.frames_read += 1
        return frame

    #: read_encoded() / decode() split reading a frame from decoding it (MJPEG files and streams):
    #: two threads can decode consecutive frames at once, and a frame dropped before it is
    #: decoded costs no decode. Frames come in order; keeping them in order is the caller's job.
    defers_decode: bool = False

    def read_encoded(self) -> Any | None:
        """The next frame still compressed (pass it to :meth:`decode`), or None at the end."""
        raise NotImplementedError(f"{type(self).__name__} cannot hand out undecoded frames")

    def decode(self, encoded: Any, out: np.ndarray | None = None) -> np.ndarray | None:
        """Decode what :meth:`read_encoded` gave (into ``out`` when it fits); None when it is damaged.

        Thread-safe: consecutive frames may be decoded by different threads at the same time.
        """
        raise NotImplementedError(f"{type(self).__name__} cannot hand out undecoded frames")

    def prefer_min_size(self, size: tuple[int, int] | DecodeFloor | None) -> bool:
        """Allow frames smaller than the source's own, down to ``size`` (w, h: both sides, or a
        :class:`~.jpeg.DecodeFloor`); None: full size again.

        Sources that can decode less than the whole frame (MJPEG at 1/2, 1/4, 1/8 scale) do so
        from the next frame on and return True; the others ignore it and return False.
        """
        return False

    @property
    def native_size(self) -> tuple[int, int] | None:
        """(width, height) of the source's own frames when they are delivered reduced; else None."""
        return None

    @property
    def reduction(self) -> int:
        """The last frame was decoded at 1/reduction of the source's own size (1: full size)."""
        return 1

    def frames(self) -> Iterator[np.ndarray]:
        """Iterate over frames, reusing one buffer (copy a frame you keep)."""
        buffer = None
        while True:
            frame = self.read(buffer)
            if frame is None:
                return
            buffer = frame
            yield frame

    # -- for subclasses ----------------------------------------------------------------------
    @abstractmethod
    def _open(self) -> None:
        """Open or raise CaptureError."""

    @abstractmethod
    def _read(self, out: np.ndarray | None) -> np.ndarray | None:
        """One frame or None at the end."""

    def _release(self) -> None:  # noqa: B027 - optional hook, most sources hold nothing
        """Drop device handles (may be called more than once)."""


class FramePacer:
    """Holds a source to ``fps`` frames per second (no allocation per frame); ``None`` does not pace."""

    def __init__(self, fps: float | None) -> None:
        self.period = 1.0 / fps if fps else 0.0
        self.next_due = 0.0

    def wait(self, source: FrameSource) -> bool:
        """Sleep until the next frame is due; False when ``source`` was interrupted meanwhile."""
        if not self.period:
            return True
        now = time.monotonic()
        if self.next_due > now:
            if not source.sleep_unless_interrupted(self.next_due - now):
                return False
            self.next_due += self.period
        else:  # late (or first frame): restart the schedule from now
            self.next_due = now + self.period
        return True
