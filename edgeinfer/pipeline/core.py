"""The capture → preprocess → infer → postprocess loop of one source, as a library user writes it.

:class:`Pipeline` is a run of one unnamed stream (:class:`~.multi.MultiPipeline`): the same two
parts serve both faces — a :class:`~.stream.Stream` (``edgeinfer-capture``: the source read into a
ring of preallocated frame buffers, each frame's model input staged there) and the one inference
loop, :class:`~.engine_worker.EngineWorker` (``edgeinfer-infer``: the oldest ready frame into the
engine's input view — one memcpy of a staged input, or the whole preprocess — invoke, decode,
deliver). Nothing is allocated per frame but the result.

OpenCV, LiteRT and ONNX Runtime release the GIL while they work, so decode and invoke overlap on
separate cores. Policies:

* ``every`` — process every frame; the capture thread waits for a free slot (back-pressure);
* ``latest`` — keep at most ``queue_size`` frames waiting; the oldest is dropped and counted.

Per-frame stage timings go into a preallocated ring of samples; percentiles are computed only when
:attr:`Pipeline.stats` or :meth:`Pipeline.take_window` is asked. See docs/pipeline.md.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from ..capture import FrameSource
from ..errors import ClosedError
from ..runtime.engine import Engine
from .multi import MultiPipeline
from .options import PipelineOptions
from .stats import FrameResult, PipelineStats

if TYPE_CHECKING:
    from .analytics import StreamAnalytics
    from .delivery import Observer
    from .events import StreamEvents
    from .failover import DelegateEvent, DelegateStatus
    from .labels import Labels
    from .sampling import StreamSampler
    from .stream import Stream
    from .tasks import ModelReading


class Pipeline:
    """Capture → preprocess → infer → postprocess on two threads, with typed results and stage timings.

    ::

        with edgeinfer.Pipeline("model.tflite", source="clip.mp4", labels="labels.txt") as p:
            for result in p:
                print(result.frame_id, result.result[0].label, result.timings.latency)
            print(p.stats.fps)

    ``model`` is a path (loaded on ``delegate`` with ``threads``; the pipeline closes it) or an
    :class:`Engine` you keep owning. ``source`` is anything :func:`edgeinfer.open_source` takes, or
    a :class:`FrameSource`; it is opened here, so a bad source raises CaptureError now. Every other
    keyword is a field of :class:`~edgeinfer.pipeline.options.PipelineOptions` (task, labels,
    policy, max_fps, max_frames, thresholds, camera size, ...); ``options`` gives them as a record.

    ``reduced_decode`` (default on, off with ``keep_frames``) lets MJPEG files, streams and JPEG folders
    decode at 1/2, 1/4 or 1/8 scale, down to the model's input size; results stay in source pixels.
    """

    def __init__(self, model: str | os.PathLike | Engine, source: str | int | os.PathLike | FrameSource,
                 options: PipelineOptions | None = None, **option_values: Any) -> None:
        self._run = MultiPipeline(model, {"": source}, PipelineOptions.merged(options, option_values))
        #: the run's options, its task decided from the model when none was given
        self.options = self._run.options
        self._stream: Stream = self._run.get_stream("")
        self._callback: Callable[[FrameResult], None] | None = None
        self._closed = False

    # ------------------------------------------------------------------------- state
    def __getattr__(self, name: str) -> Any:
        """The options read as attributes too: ``pipeline.queue_size``, ``pipeline.max_fps``, ..."""
        options = self.__dict__.get("options")
        if options is None or name not in PipelineOptions.names():
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        return options.decode_reduced if name == "reduced_decode" else getattr(options, name)

    @property
    def multi(self) -> MultiPipeline:
        """The run underneath (one unnamed stream ``""``): what a live view taps."""
        return self._run

    @property
    def source(self) -> FrameSource:
        return self._stream.source

    @property
    def labels(self) -> Labels | None:
        return self._run.labels

    @property
    def reading(self) -> ModelReading:
        """How the model is read: its task (and where that came from), its output layout, its preprocessing."""
        return self._run.reading

    @property
    def engine(self) -> Engine:
        """The engine running now (a swap or a failover replaces it between two frames)."""
        return self._run.engine

    @property
    def error(self) -> BaseException | None:
        """The error that ended the run, if one did."""
        return self._run.error

    @property
    def frames(self) -> int:
        """Frames processed so far."""
        return self._stream.control.frames

    @property
    def dropped(self) -> int:
        """Frames dropped (``latest``) so far."""
        return self._stream.control.dropped

    @property
    def callback_errors(self) -> int:
        """Exceptions raised by the callback (each logged; the pipeline went on)."""
        return self._stream.callback_errors()

    @property
    def decoded_by_inference(self) -> int:
        """Frames the inference thread decoded itself while it would have waited (decode-bound runs)."""
        shared = self._stream.shared
        return shared.decoded_by_inference if shared is not None else 0

    @property
    def running(self) -> bool:
        """True while the threads run."""
        return self._run.started and not self._run.finished

    @property
    def delegate_status(self) -> DelegateStatus:
        """The delegate in use, the one wanted, whether the run is degraded, failovers and frames lost."""
        return self._run.delegate_status

    @property
    def analytics(self) -> StreamAnalytics | None:
        """Tracking, lines and zones (options ``track``, ``lines``, ``zones``): counts, listeners; else None."""
        return self._stream.analytics

    @property
    def sampler(self) -> StreamSampler | None:
        """The sampling rules (options ``sample`` with a ``samples_dir``): ``request(n)``, ``counts()``."""
        return self._stream.sampler

    @property
    def events(self) -> StreamEvents | None:
        """The event rules (option ``events``) and their evidence: ``add_listener``, ``counts()``; else None."""
        return self._stream.events

    # ----------------------------------------------------------------------- control
    def start(self, callback: Callable[[FrameResult], None] | None = None) -> Pipeline:
        """Start the threads; each result goes to ``callback`` (in the inference thread; keep it short)."""
        if self._closed:
            raise ClosedError("the pipeline is closed — create a new one")
        if self._run.started:
            if callback is not None and callback is not self._callback:
                raise RuntimeError("the pipeline is already running; pass the callback to the first start()")
            return self
        self._callback = callback
        self._run.start(callback)
        return self

    def __iter__(self) -> Iterator[FrameResult]:
        """Results in frame order until the source ends, ``max_frames`` or stop(); leaving the loop stops."""
        if self._callback is not None:
            raise RuntimeError("results go to the callback given to start(); do not also iterate")
        if self._closed:
            raise ClosedError("the pipeline is closed — create a new one")
        try:
            yield from self._run
        finally:
            if not self._run.finished:
                self.stop()
        if self.error is not None:
            raise self.error

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the run ends (source ended, max_frames, error or stop); True if it has."""
        return self._run.started and self._run.wait(timeout)

    def stop(self) -> None:
        """Stop both threads and wait for them. Results already queued are dropped."""
        self._run.stop()

    def close(self) -> None:
        """Stop, then close the source and the engine the pipeline owns. Idempotent."""
        self._closed = True
        self._run.close()

    def __enter__(self) -> Pipeline:
        if self._closed:
            raise ClosedError("the pipeline is closed — create a new one")
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __del__(self) -> None:  # a forgotten pipeline must not keep a camera open
        try:
            if not self._closed and self._run.started:
                self.close()
        except Exception:
            pass

    # ------------------------------------------------------------------- listeners
    def add_delegate_listener(self, listener: Callable[[DelegateEvent], None]) -> None:
        """Call ``listener(event)`` on each ``delegate_fallback`` / ``delegate_restored`` (keep it short)."""
        self._run.add_delegate_listener(listener)

    def add_observer(self, observer: Observer) -> None:
        """Also hand every result to ``observer`` (guarded like a callback): health checks, recorders."""
        self._run.add_observer(observer)

    def remove_observer(self, observer: Observer) -> None:
        """Stop handing results to ``observer`` (no error if it was not added)."""
        self._run.remove_observer(observer)

    def add_event_listener(self, listener: Callable[[dict], Any]) -> None:
        """Call ``listener(event)`` for each event a rule fires, once its snapshot and clip are written
        (docs/events.md). ValueError when the pipeline has no ``events`` rules."""
        self._run.add_event_listener(listener)

    # -------------------------------------------------------------------- hot swap
    def swap_engine(self, engine: Engine, timeout: float = 30.0) -> Engine:
        """Use ``engine`` from the next frame on; returns the previous engine (now yours to close).

        The pipeline owns (and closes) the new engine, the one wanted from now on (failovers follow its
        selection plan). Raises ValueError, leaving the run alone, when it does not fit the task.
        """
        return self._run.swap_engine(engine, timeout)

    # ---------------------------------------------------------------------- stats
    @property
    def stats(self) -> PipelineStats:
        """Counters since start; percentiles over the last ``stats_window`` frames."""
        return self._run.stats()[""]

    def take_window(self) -> PipelineStats:
        """Stats of the frames since the previous call (or since start): for telemetry windows."""
        return self._run.take_window()[""]


__all__ = ["Pipeline", "PipelineOptions"]
