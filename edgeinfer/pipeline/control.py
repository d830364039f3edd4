"""What the pipeline's owner and its two threads share during a run.

One :class:`RunControl` per pipeline: the stop request, the pacing lock that ``stop()`` releases to
cut a ``max_fps`` wait short, whether the inference thread sits idle waiting for a frame, the
counters, the first error and the run's start and end times.
"""

from __future__ import annotations

import threading
import time


class RunControl:
    """The stop request, pacing, idle flag, counters and error of one pipeline run."""

    def __init__(self) -> None:
        self.stop_requested = False
        #: True while the inference thread waits for a frame: it has time to preprocess it itself
        self.infer_idle = False
        #: held while running; released by stop() to cut a max_fps wait short
        self.pacing = threading.Lock()
        self.finished = threading.Event()
        self.error: BaseException | None = None
        self.frames = 0
        self.dropped = 0
        #: motion gating: frames answered with the previous result
        self.reused = 0
        self.t_start = 0.0
        self.t_end = 0.0

    def begin(self) -> None:
        """The run starts now."""
        self.pacing.acquire()
        self.t_start = time.perf_counter()

    def request_stop(self) -> bool:
        """Ask both threads to stop (and cut a pacing wait short); False if a stop was already asked."""
        if self.stop_requested:
            return False
        self.stop_requested = True
        if self.pacing.locked():
            try:
                self.pacing.release()
            except RuntimeError:
                pass
        return True

    def pace(self, next_due: float, period: float) -> float:
        """Sleep until ``next_due`` (perf_counter); the next due time, or -1 when stop() cut the wait."""
        now = time.perf_counter()
        if next_due <= now:
            return now + period
        if self.pacing.acquire(timeout=next_due - now):
            self.pacing.release()
            return -1.0
        return next_due + period

    def elapsed(self, started: bool) -> float:
        """Seconds since the run started, up to its end once it has ended."""
        if not started:
            return 0.0
        end = self.t_end if self.finished.is_set() else time.perf_counter()
        return max(end - self.t_start, 0.0)

    def now(self) -> float:
        """perf_counter now, or the end of the run once it has ended."""
        return self.t_end if self.finished.is_set() else time.perf_counter()
