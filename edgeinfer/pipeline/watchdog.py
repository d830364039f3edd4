"""The invoke watchdog: a delegate that stops answering is noticed within a bound.

A hung native call cannot be interrupted from Python, so nothing on the engine's thread waits for
it: the engine's thread only notes when each invoke starts (one attribute store, see
:class:`~.engine_worker.EngineWorker`) and how long each took (:class:`InvokeTimes`), and the thread
``edgeinfer-watchdog`` looks every
:data:`TICK_S` or so. An invoke older than the bound — ``watchdog_factor`` x the p99 of the recent
invoke times (of the engine running now), never under ``watchdog_floor_s``, and :data:`STARTUP_S`
for an engine's first invoke (which may compile or upload the model) — is reported to
``on_hang``; the engine's thread is then abandoned with its engine, and a new one goes on with another.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .options import PipelineOptions

log = logging.getLogger("edgeinfer.pipeline")

#: the bound of an engine's first invoke (or the floor, if larger)
STARTUP_S = 30.0
#: the watchdog looks at least this often (and at a tenth of the floor when that is shorter)
TICK_S = 0.1
#: how often the bound is recomputed from the recent invoke times
BOUND_REFRESH_S = 1.0
#: the invoke samples the p99 is taken over
RECENT_INVOKES = 512


class InvokeTimes:
    """The last :data:`RECENT_INVOKES` invoke times (ms), preallocated; one store per invoke."""

    def __init__(self, size: int = RECENT_INVOKES) -> None:
        import numpy as np

        self.size = size
        self.samples = np.zeros(size, np.float64)
        self.count = 0

    def record(self, ms: float) -> None:
        self.samples[self.count % self.size] = ms
        self.count += 1

    def recent_percentile(self, q: float, last: int) -> float | None:
        """Percentile ``q`` of the most recent ``last`` invoke times (ms); None before any."""
        import numpy as np

        from .stats import percentiles

        count = self.count
        n = min(count, self.size, last)
        if n <= 0:
            return None
        end = count % self.size
        window = self.samples[end - n:end] if end >= n else np.concatenate([self.samples[end - n:],
                                                                          self.samples[:end]])
        return float(percentiles(window, (q,))[0])


class InvokeWatchdog:
    """Watches ``started()`` (perf_counter of the invoke in progress, 0 when none) against the bound."""

    def __init__(self, options: PipelineOptions, times: InvokeTimes, *, started: Callable[[], float],
                 on_hang: Callable[[float, float], None]) -> None:
        self.floor_s = options.watchdog_floor_s
        self.factor = options.watchdog_factor
        self._times = times
        self._started = started
        self._on_hang = on_hang
        self._tick = min(TICK_S, self.floor_s / 10)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._bound = max(self.floor_s, STARTUP_S)
        self._bound_at = 0.0
        self._since = 0  # the stats count when the engine running now took over
        self.hangs = 0

    def engine_changed(self) -> None:
        """Another engine runs from now on: its own invokes set the bound again, after a warm-up."""
        self._since = self._times.count
        self._bound_at = 0.0

    def bound(self) -> float:
        """Seconds an invoke may take before it counts as hung (recomputed at most once a second)."""
        now = time.monotonic()
        if now - self._bound_at >= BOUND_REFRESH_S:
            self._bound_at = now
            self._bound = self._compute_bound()
        return self._bound

    def _compute_bound(self) -> float:
        timed = self._times.count - self._since
        if timed < 1:
            return max(self.floor_s, STARTUP_S)
        p99_ms = self._times.recent_percentile(99, min(RECENT_INVOKES, timed)) or 0.0
        return max(self.floor_s, self.factor * p99_ms / 1e3)

    def start(self) -> InvokeWatchdog:
        self._thread = threading.Thread(target=self._run, name="edgeinfer-watchdog", daemon=True)
        self._thread.start()
        return self

    def stop(self, join: bool = True) -> None:
        self._stop.set()
        thread = self._thread
        if join and thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5.0)

    def _run(self) -> None:
        perf = time.perf_counter
        while not self._stop.wait(self._tick):
            try:
                started = self._started()
                if started:
                    waited = perf() - started
                    bound = self.bound()
                    if waited > bound:
                        self.hangs += 1
                        self._on_hang(started, bound)
            except Exception:  # the watchdog must outlive a bug in what it calls
                log.exception("the invoke watchdog's check failed (it goes on)")
