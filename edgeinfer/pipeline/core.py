"""The capture → preprocess → infer → postprocess loop that keeps the accelerator busy.

Two threads, one ring of frame buffers, nothing allocated per frame but the result:

* ``edgeinfer-capture`` (:mod:`.capture_loop`) reads (decodes) each frame into a preallocated slot
  of the ring (``VideoCapture.read(image=slot)``) and, unless the inference thread is already
  waiting for it, resizes and converts it into a per-slot copy of the model input ("staged"
  preprocessing);
* ``edgeinfer-infer`` (:mod:`.infer_loop`) takes the oldest ready slot, writes the model input into
  the engine's input view (one memcpy of a staged input, or the whole preprocess), hands the slot
  back, invokes, decodes the outputs into a typed result and delivers it (iterator or callback).

OpenCV, LiteRT and ONNX Runtime release the GIL while they work, so decode and invoke overlap on
separate cores. Slots move between the threads through the ring's queues (:mod:`.ring`). Policies:

* ``every`` — process every frame; the capture thread waits for a free slot (back-pressure);
* ``latest`` — keep at most ``queue_size`` frames waiting; the oldest is dropped and counted.

Per-frame stage timings go into a preallocated ring of samples; percentiles are computed only when
:attr:`Pipeline.stats` or :meth:`Pipeline.take_window` is asked. See docs/pipeline.md.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterator
from typing import Any

from ..capture import FrameSource, open_source
from ..errors import ClosedError
from ..runtime.engine import Engine
from ._opencv import opencv_threads_acquire, opencv_threads_release
from .binding import ModelBinding
from .capture_loop import CaptureLoop
from .control import RunControl
from .decoding import SharedDecoding
from .delivery import ResultDelivery
from .hooks import PipelineHooks
from .infer_loop import InferenceLoop
from .labels import Labels
from .options import PipelineOptions
from .outputs import OutputSummary
from .ring import END, FrameRing
from .stats import FrameResult, PipelineStats, StatsRing, StatsWindow, window_stats
from .supervisor import DelegateSupervisor
from .tasks import get_task

log = logging.getLogger("edgeinfer.pipeline")

#: seconds stop() and close() wait for each thread
JOIN_TIMEOUT_S = 30.0


class Pipeline(PipelineHooks):
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
        self.options = options = PipelineOptions.merged(options, option_values)
        task = get_task(options.task)
        labels = options.labels
        self.labels: Labels | None = Labels.load(labels) if isinstance(labels, (str, os.PathLike)) else labels

        self.source = open_source(source, size=options.size, fps=options.fps, fourcc=options.fourcc,
                                  loop=options.loop, backoff=options.backoff, reduced=options.decode_reduced)
        self._owns_source = not isinstance(source, FrameSource)
        owns_engine = not isinstance(model, Engine)
        engine: Engine | None = None
        try:
            engine = self._load(model) if owns_engine else model
            if self.labels is None and task.embedded_labels:
                self.labels = Labels.embedded(engine.model)
            self._ring = FrameRing(options.queue_size)
            self._binding = ModelBinding(engine, owns_engine=owns_engine, task=task, options=options,
                                         labels=self.labels, source=self.source, slots=len(self._ring.slots))
            self._binding.check(engine)
            self._binding.offer_input_size(engine)
        except BaseException:
            if owns_engine and engine is not None:
                engine.close()
            if self._owns_source:
                self.source.close()
            raise

        self._control = RunControl()
        self._stats = StatsRing(options.stats_window)
        self._delivery = ResultDelivery(options.queue_size)
        self._capture = CaptureLoop(self.source, self._ring, self._binding, self._control, options)
        self._infer = InferenceLoop(self._ring, self._binding, self._control, self._stats, self._delivery,
                                    options, finish=self._finish)
        if self.source.defers_decode:
            shared = SharedDecoding(self.source, self._ring, latest=options.policy == "latest",
                                    stage=self._capture.stage)
            self._capture.shared = self._infer.shared = shared
        self._outputs = OutputSummary()
        self._infer.outputs = self._outputs
        self._supervisor = DelegateSupervisor(
            self._binding, self._infer, self._control, self._stats, options,
            user_engine=None if owns_engine else engine, finish=self._finish,
            start_infer_thread=self._start_infer_thread, infer_thread=lambda: self._infer_thread,
            running=lambda: self.running)
        self._capture_thread: threading.Thread | None = None
        self._infer_thread: threading.Thread | None = None
        self._started = False
        self._closed = False
        self._lock = threading.Lock()
        self._opencv_threads_set = False
        self._window = StatsWindow()

    def _load(self, model: str | os.PathLike) -> Engine:
        from ..runtime.selection import load

        return load(model, self.options.delegate, threads=self.options.threads)

    # ------------------------------------------------------------------------- state
    def __getattr__(self, name: str) -> Any:
        """The options read as attributes too: ``pipeline.queue_size``, ``pipeline.max_fps``, ..."""
        options = self.__dict__.get("options")
        if options is None or name not in PipelineOptions.names():
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        return options.decode_reduced if name == "reduced_decode" else getattr(options, name)

    @property
    def engine(self) -> Engine:
        """The engine running now (a swap replaces it between two frames)."""
        return self._binding.engine

    @property
    def error(self) -> BaseException | None:
        """The error that ended the run, if one did."""
        return self._control.error

    @property
    def frames(self) -> int:
        """Frames processed so far."""
        return self._control.frames

    @property
    def dropped(self) -> int:
        """Frames dropped (``latest``) so far."""
        return self._control.dropped

    @property
    def callback_errors(self) -> int:
        """Exceptions raised by the callback (each logged; the pipeline went on)."""
        return self._delivery.callback_errors

    @property
    def decoded_by_inference(self) -> int:
        """Frames the inference thread decoded itself while it would have waited (decode-bound runs)."""
        return self._infer.shared.decoded_by_inference if self._infer.shared is not None else 0

    @property
    def running(self) -> bool:
        """True while the threads run."""
        return self._started and not self._control.finished.is_set()

    # ----------------------------------------------------------------------- control
    def start(self, callback: Callable[[FrameResult], None] | None = None) -> Pipeline:
        """Start the threads; each result goes to ``callback`` (in the inference thread; keep it short)."""
        with self._lock:
            if self._closed:
                raise ClosedError("the pipeline is closed — create a new one")
            if self._started:
                if callback is not None and callback is not self._delivery.callback:
                    raise RuntimeError("the pipeline is already running; pass the callback to the first start()")
                return self
            self._delivery.callback = callback
            self._started = True
            if self.options.opencv_threads is not None:
                opencv_threads_acquire(self.options.opencv_threads)
                self._opencv_threads_set = True
            self.source.resume()
            self._control.begin()
            self._window.start(self._control.t_start)
            self._capture_thread = threading.Thread(target=self._capture.run, name="edgeinfer-capture", daemon=True)
            self._start_infer_thread()
            self._capture_thread.start()
            self._supervisor.start()
        return self

    def _start_infer_thread(self) -> None:
        self._infer_thread = threading.Thread(target=self._infer.run, args=(self._infer.epoch,),
                                              name="edgeinfer-infer", daemon=True)
        self._infer_thread.start()

    def __iter__(self) -> Iterator[FrameResult]:
        """Results in frame order until the source ends, ``max_frames`` or stop(); leaving the loop stops."""
        if self._delivery.callback is not None:
            raise RuntimeError("results go to the callback given to start(); do not also iterate")
        self._delivery.iterating = True
        self.start()
        try:
            yield from self._delivery.results()
        finally:
            self._delivery.iterating = False
            if not self._control.finished.is_set():
                self.stop()
        if self.error is not None:
            raise self.error

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the run ends (source ended, max_frames, error or stop); True if it has."""
        if not self._started:
            return False
        return self._control.finished.wait(timeout)

    def stop(self) -> None:
        """Stop both threads and wait for them. Results already queued are dropped."""
        if not self._started or not self._control.request_stop():
            self._join()
            return
        self.source.interrupt()
        self._ring.end()  # wake a capture thread waiting for a slot, an inference thread waiting for a frame
        self._delivery.wake_producer()  # and one waiting for the consumer
        self._supervisor.wait_idle()  # a hang being handled finishes first (it sees the stop)
        self._join()

    def _join(self) -> None:
        current = threading.current_thread()
        self._supervisor.stop()
        for thread in (self._capture_thread, self._infer_thread):
            if thread in self._supervisor.abandoned_threads:
                continue  # stuck in a hung invoke: it leaves by itself if the call ever returns
            if thread is not None and thread is not current and thread.is_alive():
                thread.join(timeout=JOIN_TIMEOUT_S)
                if thread.is_alive():
                    log.warning("thread %s did not stop within %g s (blocked in a device read?)", thread.name,
                                JOIN_TIMEOUT_S)

    def _finish(self) -> None:
        """End of the inference thread: stop capture, release waiters, mark the run finished."""
        self._control.stop_requested = True
        self._supervisor.stop(join=False)
        self.source.interrupt()
        self._ring.free.put(END)  # wake a capture thread waiting for a slot
        if self._binding.swap_pending:
            self._binding.apply_pending_swap()
        capture = self._capture_thread
        if capture is not None and capture is not threading.current_thread():
            capture.join(timeout=JOIN_TIMEOUT_S)
        self._delivery.end()
        self._infer.close_events()
        self._control.finished.set()

    def close(self) -> None:
        """Stop, then close the source and the engine the pipeline owns. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self.stop()
        if self._opencv_threads_set:
            opencv_threads_release()
            self._opencv_threads_set = False
        capture = self._capture_thread
        if capture is not None and capture.is_alive():
            # releasing a device under a thread still blocked in its read() can crash the driver: leak it
            log.warning("not closing %s: the capture thread is still blocked in it", self.source.description)
        elif self._owns_source:
            self.source.close()
        infer = self._infer_thread
        busy = infer is not None and infer.is_alive() and infer not in self._supervisor.abandoned_threads
        if self._binding.owns_engine and not busy and self._supervisor.may_close(self.engine):
            self.engine.close()

    def __enter__(self) -> Pipeline:
        if self._closed:
            raise ClosedError("the pipeline is closed — create a new one")
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __del__(self) -> None:  # a forgotten pipeline must not keep a camera open
        try:
            if not self._closed and self._started:
                self.close()
        except Exception:
            pass

    # -------------------------------------------------------------------- hot swap
    def swap_engine(self, engine: Engine, timeout: float = 30.0) -> Engine:
        """Use ``engine`` from the next frame on; returns the previous engine (now yours to close).

        The pipeline owns (and closes) the new engine, the one wanted from now on (failovers follow its
        selection plan). Raises ValueError, leaving the run alone, when it does not fit the task.
        """
        old = self._binding.swap(engine, running=self.running, timeout=timeout)
        self._supervisor.engine_swapped(engine)
        return old

    # ---------------------------------------------------------------------- stats
    @property
    def stats(self) -> PipelineStats:
        """Counters since start; percentiles over the last ``stats_window`` frames."""
        return self._stats_of(0, self._stats.count, self.dropped, self._control.reused,
                              self._control.elapsed(self._started), None)

    def take_window(self) -> PipelineStats:
        """Stats of the frames since the previous call (or since start): for telemetry windows."""
        first, last, dropped, reused, elapsed = self._window.take(self._stats.count, self.dropped,
                                                                  self._control.reused, self._control.now())
        return self._stats_of(first, last, dropped, reused, elapsed if self._started else 0.0, self._outputs.take())

    def _stats_of(self, first: int, last: int, dropped: int, reused: int, elapsed: float,
                  outputs: dict[str, Any] | None) -> PipelineStats:
        analytics = self._infer.analytics
        return window_stats(self._stats, first, last, dropped=dropped, reused=reused, elapsed=elapsed,
                            source=self.source, delegate=self.engine.description,
                            callback_errors=self.callback_errors, outputs=outputs,
                            analytics=analytics.counts() if analytics is not None else None,
                            **self._supervisor.failover.stats_fields())


__all__ = ["Pipeline", "PipelineOptions"]
