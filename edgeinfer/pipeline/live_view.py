"""A live view of one stream: its frames drawn by :func:`~.annotate.annotate` and JPEG-encoded, at a bounded rate.

:class:`LiveViewFeed` hands ``sink(jpeg, result)`` one annotated JPEG at a time, made on its own thread
(``edgeinfer-live-<stream>``), never the inference thread's. The inference thread only copies a frame when the
feed asks for one (``Stream.frame_wanted``, set when the next frame is due and cleared by the first result that
carries it) and drops it into a box of one (a newer frame replaces one not yet taken): a stream nobody watches
pays one attribute test per frame, a watched one a frame copy per frame sent. Bounded by ``fps`` and ``max_kbps``
(the next frame waits for whichever is later) and ``width``; it stops at ``until`` (unix time), when the sink
says so, or on :meth:`stop`. The feed follows the run it is given by ``resolve``: a restarted pipeline or a
reopened stream is picked up again.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from .annotate import Geometry, annotate

if TYPE_CHECKING:
    from .multi import MultiPipeline
    from .stats import FrameResult
    from .stream import Stream

log = logging.getLogger(__name__)

#: JPEG quality of a live frame
QUALITY = 70
#: the most frames a second a feed sends
MAX_FPS = 15.0

#: ``sink(jpeg, result)``: send one frame; False stops the feed (nobody watches, or the view was refused)
Sink = Callable[[bytes, "FrameResult"], bool]


class LiveViewFeed:
    """Annotated JPEGs of stream ``stream`` of the run ``resolve()`` returns (None between runs) to ``sink``."""

    def __init__(self, resolve: Callable[[], MultiPipeline | None], stream: str, sink: Sink, *, fps: float = 5.0,
                 width: int = 640, max_kbps: float | None = None, until: float | None = None,
                 quality: int = QUALITY) -> None:
        self._resolve = resolve
        self.stream = stream
        self._sink = sink
        self.quality = quality
        self.fps, self.width, self.max_kbps, self.until = 5.0, 640, max_kbps, until
        self.update(fps=fps, width=width, max_kbps=max_kbps, until=until)
        self._box: queue.Queue[FrameResult] = queue.Queue(maxsize=1)
        self._stop = threading.Event()
        self._attached: MultiPipeline | None = None
        self._wanting: Stream | None = None
        self._thread: threading.Thread | None = None
        #: frames and bytes handed to the sink
        self.frames = self.bytes = 0
        #: the source's (width, height) of the last frame sent: the coordinate space of its boxes, lines, zones
        self.source_size: tuple[int, int] | None = None

    def update(self, *, fps: float, width: int, max_kbps: float | None, until: float | None) -> None:
        """New bounds for a running feed (a second request for the same view moves ``until`` on)."""
        if not 0 < fps <= MAX_FPS or width < 16:
            raise ValueError(f"a live view needs 0 < fps <= {MAX_FPS:g} and width >= 16, not {fps}, {width}")
        self.fps, self.width, self.max_kbps, self.until = float(fps), int(width), max_kbps, until

    # -- lifetime -----------------------------------------------------------------------------------
    def start(self) -> LiveViewFeed:
        self._thread = threading.Thread(target=self._run, name=f"edgeinfer-live-{self.stream or 'main'}", daemon=True)
        self._thread.start()
        return self

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop sending; returns once the thread has left (or after ``timeout``)."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    # -- the inference thread's side ----------------------------------------------------------------
    def _observe(self, result: FrameResult) -> None:
        if result.frame is None or result.stream != self.stream:
            return
        wanting = self._wanting
        if wanting is not None:
            wanting.frame_wanted = False
        try:
            self._box.put_nowait(result)
        except queue.Full:  # the stale one goes: the view shows the newest frame
            try:
                self._box.get_nowait()
            except queue.Empty:
                pass
            try:
                self._box.put_nowait(result)
            except queue.Full:
                pass

    # -- the feed's thread --------------------------------------------------------------------------
    def _run(self) -> None:
        due = 0.0
        try:
            while not self._stop.is_set():
                if self.until is not None and time.time() >= self.until:
                    log.info("live view of %r: its time is up", self.stream)
                    return
                stream = self._stream()
                if stream is None:
                    self._stop.wait(0.2)
                    continue
                if self._stop.wait(max(0.0, due - time.monotonic())):
                    return
                self._wanting = stream
                stream.frame_wanted = True
                try:
                    result = self._box.get(timeout=0.5)
                except queue.Empty:
                    continue
                started = time.monotonic()
                jpeg = self.encode(result, stream)
                if not self._sink(jpeg, result):
                    return
                self.frames += 1
                self.bytes += len(jpeg)
                due = started + self._gap(len(jpeg))
        except Exception:  # a drawing or sink bug ends the view, never the pipeline
            log.exception("live view of %r failed", self.stream)
        finally:
            self._detach()

    def _gap(self, size: int) -> float:
        """Seconds until the next frame: the frame rate's period, or longer when the byte budget needs it."""
        gap = 1.0 / self.fps
        if self.max_kbps:
            gap = max(gap, size * 8 / (self.max_kbps * 1000.0))
        return gap

    def _stream(self) -> Stream | None:
        """The stream to watch now, attached to the current run (None while there is none)."""
        pipeline = self._resolve()
        if pipeline is not self._attached:
            self._detach()
            if pipeline is not None:
                pipeline.add_observer(self._observe)
                self._attached = pipeline
        if pipeline is None:
            return None
        try:
            return pipeline.get_stream(self.stream)
        except KeyError:
            return None

    def _detach(self) -> None:
        wanting, self._wanting = self._wanting, None
        if wanting is not None:
            wanting.frame_wanted = False
        if self._attached is not None:
            self._attached.remove_observer(self._observe)
            self._attached = None

    def encode(self, result: FrameResult, stream: Stream) -> bytes:
        """``result``'s frame with what the model saw and the stream's lines and zones, as a JPEG;
        :attr:`source_size` is then the source's (width, height): the coordinates results, lines and zones use."""
        import cv2

        analytics = stream.analytics
        frame = result.frame
        native = stream.source.native_size  # a frame decoded reduced: results are still in the source's pixels
        width, height = native if native is not None else (frame.shape[1], frame.shape[0])  # type: ignore[union-attr]
        self.source_size = (int(width), int(height))
        image = annotate(frame, result.result, geometry=Geometry.of(analytics),  # type: ignore[arg-type]
                         counts=analytics.counts() if analytics is not None else None, width=self.width,
                         source_width=self.source_size[0])
        ok, data = cv2.imencode(".jpg", image, [cv2.IMWRITE_JPEG_QUALITY, self.quality])
        if not ok:
            raise ValueError("the frame could not be JPEG-encoded")
        return data.tobytes()
