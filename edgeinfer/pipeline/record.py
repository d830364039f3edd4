"""The record source: a second stream of the same camera that the evidence comes from (docs/events.md).

Frigate's detect / record split: a camera's small sub-stream feeds detection, its main stream the
snapshot and clip. :class:`RecordSource` reads the main stream no faster than the evidence needs it:

* a **file** is read in step with the detect stream (its frame *n* is the same moment as the detect
  file's frame *n*), forward to the frame the evidence asks for, in the ``edgeinfer-evidence`` thread
  — frames in between are skipped still compressed where the source can (MJPEG), so only the few kept
  frames are decoded;
* a **live** source is followed by an ``edgeinfer-record`` thread that keeps its newest frame (still
  compressed where the source can hand it so, decoded only when evidence takes it).

A record source that ends or fails is *lost*: logged once, and the evidence falls back to the detect
stream's frames; detection never stops for it.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

    from ..capture import FrameSource

log = logging.getLogger(__name__)

#: seconds close() waits for the live reader thread
_JOIN_S = 5.0


class RecordSource:
    """The evidence's frames from another source than detection's (see the module)."""

    def __init__(self, source: FrameSource, *, owns: bool = True, stream: str = "") -> None:
        self.source = source
        self.owns = owns
        self.stream = stream
        self.live = bool(source.live)
        #: why the record source no longer serves (it ended or failed); None while it does
        self.lost: str | None = None
        self._deferred = bool(source.defers_decode)
        self._lock = threading.Lock()
        self._last: tuple[int, Any] | None = None  # (frame number, frame or still-compressed frame)
        self._read_id = -1
        self._thread: threading.Thread | None = None
        self._closed = False

    @classmethod
    def open(cls, spec: Any, options: Any, stream: str = "") -> RecordSource:
        """Open ``spec`` (anything :func:`~edgeinfer.capture.open_source` takes) at full size: CaptureError
        when it cannot be opened (a missing file, a camera that does not answer). ``options``: the pipeline's
        PipelineOptions (its ``loop`` and ``backoff``)."""
        from ..capture import FrameSource, open_source

        opened = open_source(spec, loop=options.loop, backoff=options.backoff, reduced=False)
        return cls(opened, owns=not isinstance(spec, FrameSource), stream=stream)

    @property
    def serving(self) -> bool:
        return self.lost is None

    def start(self) -> None:
        """A live source is followed from now on (a file is read when asked)."""
        if self.live and self._thread is None and not self._closed:
            name = f"edgeinfer-record-{self.stream}" if self.stream else "edgeinfer-record"
            self._thread = threading.Thread(target=self._follow, name=name, daemon=True)
            self._thread.start()

    def frame_at(self, frame_id: int) -> np.ndarray | None:
        """The record frame of the detect stream's frame ``frame_id``: a file's frame of that number, a live
        source's newest. None when it cannot be had (a damaged frame, or the record source is lost)."""
        if self.lost is not None:
            return None
        try:
            got = self._newest() if self.live else self._forward_to(int(frame_id))
            if got is None or not self._deferred:
                return got
            return self.source.decode(got)  # None: damaged, this frame only
        except Exception as error:  # a broken record stream must not end the evidence
            self._lose(f"failed: {error}")
            return None

    def _newest(self) -> Any:
        with self._lock:
            last = self._last
        return last[1] if last is not None else None

    def _forward_to(self, frame_id: int) -> Any:
        """Read forward to frame ``frame_id`` (a file; the evidence thread only). An id already passed
        gets the newest frame read: the moments asked for only go forward."""
        last = self._last
        buffer = None
        while last is None or last[0] < frame_id:
            got = self._read(buffer)
            if got is None:
                self._lose(f"ended at its frame {self._read_id + 1}")
                return None
            self._read_id += 1
            last = self._last = (self._read_id, got)
            buffer = None if self._deferred else got  # one decode buffer while skipping
        return last[1]

    def _read(self, buffer: np.ndarray | None) -> Any:
        return self.source.read_encoded() if self._deferred else self.source.read(buffer)

    def _follow(self) -> None:
        """The live reader: the newest frame kept (a fresh array each: the one handed out is never written)."""
        try:
            while not self._closed:
                got = self._read(None)
                if got is None:
                    if not self._closed:
                        self._lose("ended")
                    return
                with self._lock:
                    self._read_id += 1
                    self._last = (self._read_id, got)
        except Exception as error:
            self._lose(f"failed: {error}")

    def _lose(self, reason: str) -> None:
        if self.lost is None:
            self.lost = reason
            log.warning("record source %s of stream %r %s: evidence falls back to the detect stream's frames",
                        self.source.description, self.stream, reason)

    def close(self) -> None:
        """Stop following and close the source if it was opened here (not under a reader still blocked in it)."""
        self._closed = True
        self.source.interrupt()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(_JOIN_S)
            if thread.is_alive():
                log.warning("not closing record source %s: its reader is still blocked in it",
                            self.source.description)
                return
        if self.owns:
            self.source.close()
