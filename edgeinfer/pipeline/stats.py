"""What a pipeline measures: per-frame stage timings, the result record, and run statistics.

:data:`STAGES` is the one definition of the stage names: the telemetry protocol's schema, the
agent's telemetry, ``edgeinfer bench`` and the docs take them from here.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

#: the stages timed for every frame, in milliseconds, in the order a frame goes through them
#: (``latency`` runs from the end of capture to the result)
STAGES = ("capture", "queue", "preprocess", "infer", "postprocess", "latency")
#: what each stage measures, for generated docs and help texts
STAGE_DESCRIPTIONS = {
    "capture": "reading (and decoding) the frame from the source",
    "queue": "waiting between the capture and the inference thread",
    "preprocess": "resize, colour conversion, normalisation into the model input",
    "infer": "the delegate running the model",
    "postprocess": "decoding the outputs into a typed result",
    "latency": "from the frame being read to its result",
}
#: the percentiles reported per stage
PERCENTILES = ("p50", "p95", "p99", "mean")


@dataclass(frozen=True, slots=True)
class StageTimings:
    """Milliseconds one frame spent in each stage; ``latency`` runs from capture to result."""

    capture: float
    preprocess: float
    infer: float
    postprocess: float
    latency: float
    #: time the frame waited in the queue between the two threads
    queue: float = 0.0

    def to_dict(self) -> dict[str, float]:
        return {stage: round(getattr(self, stage), 3) for stage in STAGES}


@dataclass(frozen=True, slots=True)
class FrameResult:
    """One processed frame: id, capture wall time (``time.time()``), the task's result, timings."""

    frame_id: int
    timestamp: float
    result: Any
    timings: StageTimings
    #: a copy of the frame, only with ``Pipeline(keep_frames=True)``
    frame: np.ndarray | None = None
    #: the stream the frame came from (a MultiPipeline's stream name; "" for a single pipeline)
    stream: str = ""
    #: motion gating: the frame looked unchanged, and ``result`` is the previous frame's, reused
    reused: bool = False

    def to_dict(self) -> dict[str, Any]:
        result = self.result
        if isinstance(result, list):
            payload: Any = [item.to_dict() for item in result]
        else:
            payload = result.to_dict()
        data = {"frame_id": self.frame_id, "timestamp": round(self.timestamp, 6), "result": payload,
                "timings_ms": self.timings.to_dict()}
        if self.stream:
            data["stream"] = self.stream
        if self.reused:
            data["reused"] = True
        return data


@dataclass(frozen=True)
class PipelineStats:
    """Counters and per-stage latency percentiles (ms) over a run or a window of it."""

    frames: int
    dropped: int
    fps: float
    elapsed_s: float
    #: {stage: {"p50","p95","p99","mean"}} in ms, for every name in STAGES
    stages: dict[str, dict[str, float]]
    delegate: str
    reconnects: int = 0
    callback_errors: int = 0
    source: str = ""
    #: the last frame was decoded at 1/reduction of the source's size (1: full size)
    reduction: int = 1
    #: frames the source could not decode (skipped), over its life
    corrupt_frames: int = 0
    #: the window's output summary (edgeinfer.pipeline.outputs): top labels, detections, mean score
    outputs: dict[str, Any] | None = None
    #: running on a fallback delegate after the one wanted failed at run time
    degraded: bool = False
    #: the delegate the pipeline wants back while degraded, else None
    delegate_wanted: str | None = None
    #: frames lost to delegate failures (the frame in the failed or hung invoke), over the run
    frames_lost: int = 0
    #: motion gating: frames answered with the previous result (not in ``frames``, ``fps`` or the stages)
    reused: int = 0
    #: tracking, lines and zones: the counts since the run started (StreamAnalytics.counts()), else None
    analytics: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"frames": self.frames, "dropped": self.dropped, "fps": round(self.fps, 3),
                "elapsed_s": round(self.elapsed_s, 3), "delegate": self.delegate, "reconnects": self.reconnects,
                "callback_errors": self.callback_errors, "source": self.source, "reduction": self.reduction,
                "corrupt_frames": self.corrupt_frames, "outputs": self.outputs, "degraded": self.degraded,
                "delegate_wanted": self.delegate_wanted, "frames_lost": self.frames_lost, "reused": self.reused,
                "analytics": self.analytics,
                "stages": {k: {m: round(v, 3) for m, v in d.items()} for k, d in self.stages.items()}}


class StatsWindow:
    """The counters at the previous ``take()``: a telemetry window is the difference from them."""

    def __init__(self) -> None:
        self._previous = (0, 0, 0, 0.0)

    def start(self, at: float) -> None:
        """The run starts at ``at`` (perf_counter): the first window runs from there."""
        self._previous = (0, 0, 0, at)

    def take(self, frames: int, dropped: int, reused: int, now: float) -> tuple[int, int, int, int, float]:
        """(first frame, last frame, dropped, reused, seconds) since the previous call; the next runs from here."""
        prev_frames, prev_dropped, prev_reused, prev_time = self._previous
        self._previous = (frames, dropped, reused, now)
        return prev_frames, frames, dropped - prev_dropped, reused - prev_reused, max(now - prev_time, 0.0)


@dataclass(frozen=True)
class RunStats(PipelineStats):
    """A window of a run of several named streams: the aggregate (as PipelineStats), and each stream's own."""

    #: each open stream's window, in the order given (a stream not open has none)
    streams: dict[str, PipelineStats] = field(default_factory=dict)
    #: each stream's status: starting, running, ended or failed
    stream_status: dict[str, str] = field(default_factory=dict)


def merge_stats(first: PipelineStats | None, second: PipelineStats | None) -> PipelineStats | None:
    """Two consecutive windows as one: counts add up, the later window's rates and percentiles stand (per
    stream too, for a :class:`RunStats`)."""
    if first is None or second is None:
        return second if first is None else first
    from .outputs import merge_summaries

    merged = dataclasses.replace(second, frames=first.frames + second.frames, dropped=first.dropped + second.dropped,
                                 reused=first.reused + second.reused,
                                 outputs=merge_summaries(first.outputs, second.outputs))
    if not isinstance(merged, RunStats):
        return merged
    before, after = getattr(first, "streams", {}), second.streams  # type: ignore[attr-defined]
    streams = {name: merge_stats(before.get(name), after.get(name)) for name in (*before, *after)}
    return dataclasses.replace(merged, streams={name: s for name, s in streams.items() if s is not None})


def combine_streams(windows: Mapping[str, PipelineStats], status: Mapping[str, str], *, delegate: str,
                    source: str) -> RunStats:
    """The windows of a run's streams as one: frames, drops, reuses and fps summed; ``stages`` are the
    busiest stream's percentiles (percentiles do not add up); ``outputs`` summarise every stream's answers.
    The streams share the engine: its delegate, failover state and lost frames are the same in each."""
    from .outputs import merge_summaries

    present = list(windows.values())
    busiest = max(present, key=lambda w: w.frames, default=None)
    outputs = None
    for window in present:
        outputs = merge_summaries(outputs, window.outputs)
    return RunStats(
        frames=sum(w.frames for w in present), dropped=sum(w.dropped for w in present),
        fps=sum(w.fps for w in present), elapsed_s=max((w.elapsed_s for w in present), default=0.0),
        stages=busiest.stages if busiest is not None else {}, delegate=delegate,
        reconnects=sum(w.reconnects for w in present), corrupt_frames=sum(w.corrupt_frames for w in present),
        source=source, degraded=any(w.degraded for w in present),
        delegate_wanted=next((w.delegate_wanted for w in present if w.delegate_wanted), None),
        frames_lost=max((w.frames_lost for w in present), default=0), reused=sum(w.reused for w in present),
        outputs=outputs, streams=dict(windows), stream_status=dict(status))


def window_stats(ring: StatsRing, first: int, last: int, *, dropped: int, reused: int, elapsed: float,
                 source: Any, delegate: str, **extra: Any) -> PipelineStats:
    """Samples [first, last) of ``ring`` and the run's counters as PipelineStats (``extra``: the other fields)."""
    frames = last - first
    return PipelineStats(
        frames=frames, dropped=dropped, fps=frames / elapsed if elapsed > 0 else 0.0, elapsed_s=elapsed,
        stages=ring.summary(first, last), delegate=delegate, reconnects=source.reconnects,
        source=source.description, reduction=source.reduction, corrupt_frames=source.corrupt_frames,
        reused=reused, **extra)


def percentiles(samples: Any, qs: Sequence[float]) -> Any:
    """``np.percentile(samples, qs, axis=-1)`` (its default linear interpolation) on a sorted copy:
    the same figures without ``np.percentile``, whose first call imports ``numpy.ma`` (1.3 MiB resident
    in an agent that has no use for masked arrays)."""
    import numpy as np

    ordered = np.sort(samples, axis=-1)
    n = ordered.shape[-1]
    out = []
    for q in qs:
        position = (n - 1) * float(q) / 100.0
        low = int(position)
        high = min(low + 1, n - 1)
        fraction = position - low
        out.append(ordered[..., low] + (ordered[..., high] - ordered[..., low]) * fraction)
    return out


class StatsRing:
    """Preallocated per-stage samples of the last ``size`` frames; written by the inference thread,
    summarised on demand (percentiles are never computed per frame)."""

    def __init__(self, size: int) -> None:
        import numpy as np

        self.size = size
        self.samples = np.zeros((len(STAGES), size), np.float64)
        self.count = 0
        self.lock = threading.Lock()

    def record(self, timings: StageTimings) -> None:
        """Store one frame's timings (overwriting the oldest once the ring is full)."""
        samples = self.samples
        with self.lock:
            i = self.count % self.size
            samples[0, i] = timings.capture
            samples[1, i] = timings.queue
            samples[2, i] = timings.preprocess
            samples[3, i] = timings.infer
            samples[4, i] = timings.postprocess
            samples[5, i] = timings.latency
            self.count += 1

    def recent_percentile(self, stage: str, q: float, last: int = 512) -> float | None:
        """Percentile ``q`` of ``stage``'s most recent ``last`` samples (ms); None before any sample."""
        import numpy as np

        row = STAGES.index(stage)
        with self.lock:
            n = min(self.count, self.size, last)
            if n <= 0:
                return None
            end = self.count % self.size
            if end >= n:
                window = self.samples[row, end - n:end].copy()
            else:
                window = np.concatenate([self.samples[row, end - n:], self.samples[row, :end]])
        return float(percentiles(window, (q,))[0])

    def summary(self, first: int, last: int) -> dict[str, dict[str, float]]:
        """Percentiles of samples [first, last) (only the most recent ``size`` are kept)."""
        import numpy as np

        with self.lock:
            first = max(first, last - self.size)
            n = last - first
            if n <= 0:
                return {name: dict.fromkeys(PERCENTILES, 0.0) for name in STAGES}
            start = first % self.size
            end = start + n
            if end <= self.size:
                window = self.samples[:, start:end].copy()
            else:
                window = np.concatenate([self.samples[:, start:], self.samples[:, : end - self.size]], axis=1)
        p50, p95, p99 = percentiles(window, (50, 95, 99))
        mean = window.mean(axis=1)
        return {name: {"p50": float(p50[i]), "p95": float(p95[i]), "p99": float(p99[i]), "mean": float(mean[i])}
                for i, name in enumerate(STAGES)}
