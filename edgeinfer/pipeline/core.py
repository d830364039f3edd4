"""The capture → preprocess → infer → postprocess loop that keeps the accelerator busy.

Two threads, one ring of frame buffers, nothing allocated per frame but the result:

* ``edgeinfer-capture`` reads (decodes) each frame into a preallocated slot of the ring
  (``VideoCapture.read(image=slot)``) and, unless the inference thread is already waiting for it,
  resizes and converts it into a per-slot copy of the model input ("staged" preprocessing);
* ``edgeinfer-infer`` takes the oldest ready slot, writes the model input into the engine's input
  view (one memcpy of a staged input, or the whole preprocess), hands the slot back, invokes,
  decodes the outputs into a typed result and delivers it (iterator or callback).

OpenCV, LiteRT and ONNX Runtime release the GIL while they work, so decode and invoke overlap on
separate cores. Slots move between the threads through two ``queue.SimpleQueue`` of slot numbers
(``free`` and ``ready``), which block without polling and allocate nothing per frame. Policies:

* ``every`` — process every frame; the capture thread waits for a free slot (back-pressure);
* ``latest`` — keep at most ``queue_size`` frames waiting; the oldest is dropped and counted.

Per-frame stage timings go into a preallocated ring of samples; percentiles are computed only when
:attr:`Pipeline.stats` or :meth:`Pipeline.take_window` is asked. See docs/pipeline.md.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..capture import DEFAULT_BACKOFF, Backoff, FrameSource, open_source
from ..errors import CaptureError, EdgeInferError
from ..runtime.engine import Engine
from .labels import Labels
from .postprocess import (
    DEFAULT_IOU_THRESHOLD,
    DEFAULT_MAX_DETECTIONS,
    DEFAULT_SCORE_THRESHOLD,
    TASKS,
    ClassificationDecoder,
    DetectionDecoder,
    PoseDecoder,
    SegmentationDecoder,
)
from .preprocess import Preprocessor, Transform, input_geometry

if TYPE_CHECKING:
    import numpy as np

log = logging.getLogger("edgeinfer.pipeline")

POLICIES = ("every", "latest")
#: the stages timed for every frame, in milliseconds
STAGES = ("capture", "queue", "preprocess", "infer", "postprocess", "latency")
#: samples kept for percentiles (the last this many frames)
DEFAULT_STATS_WINDOW = 4096
DEFAULT_QUEUE_SIZE = 2
#: where preprocessing runs: decided from measured stage times, or pinned
PREPROCESS_PLACES = ("auto", "capture", "inference")
#: default resize per task: classification references use a plain resize; geometry tasks keep aspect
TASK_RESIZE = {"classify": "stretch", "detect": "letterbox", "pose": "letterbox", "segment": "letterbox"}
#: the pytorch-ssd family (Ultraface) normalises float input as (pixel - 127) / 128
SSD_FLOAT_MEAN, SSD_FLOAT_STD = 127.0, 128.0

_END = -1  # sentinel slot number: the source ended / the pipeline stops
_STOP = object()  # sentinel in the result queue


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
        return {"capture": round(self.capture, 3), "queue": round(self.queue, 3),
                "preprocess": round(self.preprocess, 3), "infer": round(self.infer, 3),
                "postprocess": round(self.postprocess, 3), "latency": round(self.latency, 3)}


@dataclass(frozen=True, slots=True)
class FrameResult:
    """One processed frame: id, capture wall time (``time.time()``), the task's result, timings."""

    frame_id: int
    timestamp: float
    result: Any
    timings: StageTimings
    #: a copy of the frame, only with ``Pipeline(keep_frames=True)``
    frame: np.ndarray | None = None

    def to_dict(self) -> dict[str, Any]:
        result = self.result
        if isinstance(result, list):
            payload: Any = [item.to_dict() for item in result]
        else:
            payload = result.to_dict()
        return {"frame_id": self.frame_id, "timestamp": round(self.timestamp, 6), "result": payload,
                "timings_ms": self.timings.to_dict()}


@dataclass(frozen=True)
class PipelineStats:
    """Counters and per-stage latency percentiles (ms) over a run or a window of it."""

    frames: int
    dropped: int
    fps: float
    elapsed_s: float
    #: {"capture"|"queue"|"preprocess"|"infer"|"postprocess"|"latency": {"p50","p95","p99","mean"}} in ms
    stages: dict[str, dict[str, float]]
    delegate: str
    reconnects: int = 0
    callback_errors: int = 0
    source: str = ""
    #: the last frame was decoded at 1/reduction of the source's size (1: full size)
    reduction: int = 1
    #: frames the source could not decode (skipped), over its life
    corrupt_frames: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"frames": self.frames, "dropped": self.dropped, "fps": round(self.fps, 3),
                "elapsed_s": round(self.elapsed_s, 3), "delegate": self.delegate, "reconnects": self.reconnects,
                "callback_errors": self.callback_errors, "source": self.source, "reduction": self.reduction,
                "corrupt_frames": self.corrupt_frames,
                "stages": {k: {m: round(v, 3) for m, v in d.items()} for k, d in self.stages.items()}}


class _Plan:
    """Everything that depends on (engine, frame size): preprocessor, staged inputs, decoder."""

    __slots__ = ("decoder", "engine", "frame_shape", "gen", "native", "pre", "pre_staged", "staged", "transform",
                 "view")

    def __init__(self, gen: int, engine: Engine, frame_shape: tuple[int, ...], native: tuple[int, int] | None,
                 pre: Preprocessor, pre_staged: Preprocessor, decoder: Any, slots: int, transform: Transform) -> None:
        import numpy as np

        self.gen = gen
        self.engine = engine
        self.frame_shape = frame_shape
        self.native = native  # the source's own frame size when frames arrive reduced, else None
        # one preprocessor per thread: each owns scratch buffers, and both threads may preprocess at once
        self.pre = pre  # inference thread, into the engine's input view
        self.pre_staged = pre_staged  # capture thread, into staged[slot]
        self.transform = transform  # frame → model input, expressed in the source's own pixels
        self.decoder = decoder
        self.view = engine.input_view(0)
        self.staged = [np.empty(self.view.shape, self.view.dtype) for _ in range(slots)]


class _StatsRing:
    """Preallocated per-stage samples; written by the inference thread, read on demand."""

    def __init__(self, size: int) -> None:
        import numpy as np

        self.size = size
        self.samples = np.zeros((len(STAGES), size), np.float64)
        self.count = 0
        self.lock = threading.Lock()

    def summary(self, first: int, last: int) -> dict[str, dict[str, float]]:
        """Percentiles of samples [first, last) (only the most recent ``size`` are kept)."""
        import numpy as np

        with self.lock:
            first = max(first, last - self.size)
            n = last - first
            if n <= 0:
                return {name: {"p50": 0.0, "p95": 0.0, "p99": 0.0, "mean": 0.0} for name in STAGES}
            start = first % self.size
            end = start + n
            if end <= self.size:
                window = self.samples[:, start:end].copy()
            else:
                window = np.concatenate([self.samples[:, start:], self.samples[:, : end - self.size]], axis=1)
        p50, p95, p99 = np.percentile(window, [50, 95, 99], axis=1)
        mean = window.mean(axis=1)
        return {name: {"p50": float(p50[i]), "p95": float(p95[i]), "p99": float(p99[i]), "mean": float(mean[i])}
                for i, name in enumerate(STAGES)}


class Pipeline:
    """Capture → preprocess → infer → postprocess on two threads, with typed results and stage timings.

    ::

        with edgeinfer.Pipeline("model.tflite", source="clip.mp4", labels="labels.txt") as p:
            for result in p:
                print(result.frame_id, result.result[0].label, result.timings.latency)
            print(p.stats.fps)

    ``model`` is a path (loaded on ``delegate`` with ``threads``; the pipeline closes it) or an
    :class:`Engine` you keep owning. ``source`` is anything :func:`edgeinfer.capture.open_source`
    takes, or a :class:`FrameSource`; it is opened here, so a bad source raises CaptureError now.

    ``reduced_decode`` (default on, off with ``keep_frames``) lets a source that can decode less
    than the whole frame do so, down to the model's input size — MJPEG files and streams, and JPEG
    folders, decode at 1/2, 1/4 or 1/8 scale (:mod:`edgeinfer.mjpeg`). Boxes, keypoints and masks
    are still in the source's pixels.
    """

    def __init__(
        self,
        model: str | os.PathLike | Engine,
        source: str | int | os.PathLike | FrameSource,
        *,
        task: str = "classify",
        labels: str | os.PathLike | Labels | None = None,
        delegate: str | None = None,
        threads: int | None = None,
        policy: str = "every",
        max_fps: float | None = None,
        max_frames: int | None = None,
        loop: bool = False,
        top_k: int = 5,
        queue_size: int = DEFAULT_QUEUE_SIZE,
        resize: str | None = None,
        mean: float | tuple[float, ...] | None = None,
        std: float | tuple[float, ...] | None = None,
        score_threshold: float = DEFAULT_SCORE_THRESHOLD,
        iou_threshold: float = DEFAULT_IOU_THRESHOLD,
        max_detections: int = DEFAULT_MAX_DETECTIONS,
        keep_frames: bool = False,
        size: tuple[int, int] | None = None,
        fps: float | None = None,
        fourcc: str | None = None,
        backoff: Backoff = DEFAULT_BACKOFF,
        preprocess_in: str = "auto",
        opencv_threads: int | None = 1,
        reduced_decode: bool = True,
        stats_window: int = DEFAULT_STATS_WINDOW,
    ) -> None:
        if task not in TASKS:
            raise ValueError(f"task must be one of {', '.join(TASKS)}, not {task!r}")
        if policy not in POLICIES:
            raise ValueError(f"policy must be one of {', '.join(POLICIES)}, not {policy!r}")
        if preprocess_in not in PREPROCESS_PLACES:
            raise ValueError(f"preprocess_in must be one of {', '.join(PREPROCESS_PLACES)}, not {preprocess_in!r}")
        if max_fps is not None and max_fps <= 0:
            raise ValueError(f"max_fps must be > 0, not {max_fps}")
        if max_frames is not None and max_frames < 1:
            raise ValueError(f"max_frames must be >= 1, not {max_frames}")
        if queue_size < 1:
            raise ValueError(f"queue_size must be >= 1, not {queue_size}")
        if threads is not None and threads < 1:
            raise ValueError(f"threads must be >= 1, not {threads}")
        if stats_window < 16:
            raise ValueError("stats_window must be >= 16")
        self.task = task
        self.policy = policy
        self.max_fps = max_fps
        self.max_frames = max_frames
        self.queue_size = queue_size
        self.keep_frames = keep_frames
        self.preprocess_in = preprocess_in
        self.opencv_threads = opencv_threads
        # frames kept for the caller stay full size; otherwise sources that can decode less may
        self.reduced_decode = reduced_decode and not keep_frames
        self._resize = resize or TASK_RESIZE[task]
        self._mean, self._std = mean, std
        self._decoder_options = {"top_k": top_k, "score_threshold": score_threshold,
                                 "iou_threshold": iou_threshold, "max_detections": max_detections}
        self.labels = Labels.load(labels) if isinstance(labels, (str, os.PathLike)) else labels

        self.source = open_source(source, size=size, fps=fps, fourcc=fourcc, loop=loop, backoff=backoff)
        self._owns_source = not isinstance(source, FrameSource)
        try:
            if isinstance(model, Engine):
                self.engine = model
                self._owns_engine = False
            else:
                from ..runtime.selection import load

                self.engine = load(model, delegate, threads=threads)
                self._owns_engine = True
            self._check_engine(self.engine)
            self._offer_input_size(self.engine)
            if self.labels is None and task == "classify":
                self.labels = Labels.embedded(self.engine.model)
        except BaseException:
            if self._owns_source:
                self.source.close()
            raise

        slots = queue_size + 2  # queued + one being filled + one being read into the engine
        self._slots = slots
        self._frames: list[Any] = [None] * slots
        self._staged_gen = [-1] * slots
        # per slot: (frame id, read start, read end, preprocess end [perf_counter], wall time)
        self._slot_info: list[tuple[int, float, float, float, float]] = [(0, 0.0, 0.0, 0.0, 0.0)] * slots
        # Sources that split reading from decoding (MJPEG files and streams) publish frames still
        # compressed; either thread decodes them (see _capture_encoded). A slot's lock is held from
        # publishing until its frame is decoded.
        self._defer_decode = self.source.defers_decode
        self._encoded: list[Any] = [None] * slots
        # per slot: the source's own frame size when the frame was decoded reduced (set by the thread
        # that decoded it, right after decoding), else None
        self._natives: list[tuple[int, int] | None] = [None] * slots
        self._decode_failed = [False] * slots
        self._decode_locks = [threading.Lock() for _ in range(slots)]
        self._undecoded: deque[int] = deque()  # published, not yet claimed by a decoding thread
        self._claim_lock = threading.Lock()
        # moving averages (s) of decoding one frame and of the inference thread's work on one frame
        self._decode_s = 0.0
        self._infer_s = 0.0
        self._free: queue.SimpleQueue = queue.SimpleQueue()
        self._ready: queue.SimpleQueue = queue.SimpleQueue()
        for slot in range(slots):
            self._free.put(slot)
        self._results: queue.SimpleQueue = queue.SimpleQueue()
        self._credits: queue.SimpleQueue = queue.SimpleQueue()
        for _ in range(max(4, queue_size * 2)):
            self._credits.put(True)

        self._stats = _StatsRing(stats_window)
        self._plan: _Plan | None = None
        self._plan_gen = 0
        self._plan_lock = threading.Lock()
        self._swap: tuple[Engine, threading.Event, list] | None = None
        # True while the inference thread waits for a frame: it has time to preprocess it itself
        self._infer_idle = False

        self._callback: Callable[[FrameResult], None] | None = None
        self._observers: tuple[Callable[[FrameResult], None], ...] = ()
        self._iterating = False
        self._capture_thread: threading.Thread | None = None
        self._infer_thread: threading.Thread | None = None
        self._stop_requested = False
        self._pacing = threading.Lock()  # held while running; released by stop() to cut a max_fps wait
        self._started = False
        self._closed = False
        self._finished = threading.Event()
        self._lock = threading.Lock()
        self._opencv_previous: int | None = None

        self.error: BaseException | None = None
        self.frames = 0
        self.dropped = 0
        self.callback_errors = 0
        #: frames the inference thread decoded itself while it would have waited (decode-bound runs)
        self.decoded_by_inference = 0
        self._t_start = 0.0
        self._t_end = 0.0
        self._window = (0, 0, 0.0)  # frames, dropped, time at the previous take_window()

    # ------------------------------------------------------------------------------ set-up
    def _check_engine(self, engine: Engine) -> None:
        if len(engine.inputs) != 1:
            raise ValueError(f"the pipeline feeds one image input; {engine.model.path} has {len(engine.inputs)}")
        input_geometry(engine.inputs[0])  # ValueError when the input is not an image
        self._make_decoder(engine)

    def _make_decoder(self, engine: Engine) -> Any:
        """The task's decoder bound to ``engine``'s output views (ValueError if the model does not fit)."""
        options = self._decoder_options
        outputs = [engine.output_view(i) for i in range(len(engine.outputs))]
        height, width, _, _ = input_geometry(engine.inputs[0])
        if self.task == "classify":
            return ClassificationDecoder(outputs[0], engine.outputs[0], self.labels, options["top_k"])
        if self.task == "detect":
            return DetectionDecoder(outputs, engine.outputs, (width, height), self.labels,
                                    score_threshold=options["score_threshold"],
                                    iou_threshold=options["iou_threshold"],
                                    max_detections=options["max_detections"])
        if self.task == "pose":
            return PoseDecoder(outputs[0], engine.outputs[0], (width, height))
        return SegmentationDecoder(outputs[0], engine.outputs[0], self.labels)

    def _offer_input_size(self, engine: Engine) -> None:
        """Let the source decode frames as small as the model input (MJPEG: 1/2, 1/4, 1/8 scale)."""
        if self.reduced_decode:
            height, width, _, _ = input_geometry(engine.inputs[0])
            self.source.prefer_min_size((width, height))

    def _normalisation(self, engine: Engine, decoder: Any) -> tuple[Any, Any]:
        mean, std = self._mean, self._std
        if (mean is None and std is None and engine.inputs[0].dtype.startswith("float")
                and getattr(decoder, "layout", None) == "ssd"):
            return SSD_FLOAT_MEAN, SSD_FLOAT_STD
        return mean, std

    def _build_plan(self, engine: Engine, frame_shape: tuple[int, ...], native: tuple[int, int] | None) -> _Plan:
        decoder = self._make_decoder(engine)
        mean, std = self._normalisation(engine, decoder)
        size = (frame_shape[1], frame_shape[0])
        pre, pre_staged = (Preprocessor(engine.inputs[0], size, resize=self._resize, mean=mean, std=std)  # type: ignore[arg-type]
                           for _ in range(2))
        # results are in the source's own pixels even when its frames arrive reduced
        transform = pre.transform if native is None else pre.transform.for_source_size(*native)
        with self._plan_lock:
            self._plan_gen += 1
            gen = self._plan_gen
        return _Plan(gen, engine, frame_shape, native, pre, pre_staged, decoder, self._slots, transform)

    # ------------------------------------------------------------------------------ control
    @property
    def running(self) -> bool:
        """True while the threads run."""
        return self._started and not self._finished.is_set()

    def start(self, callback: Callable[[FrameResult], None] | None = None) -> Pipeline:
        """Start the threads; each result goes to ``callback`` (in the inference thread; keep it short)."""
        with self._lock:
            if self._closed:
                raise EdgeInferError("the pipeline is closed — create a new one")
            if self._started:
                if callback is not None and callback is not self._callback:
                    raise RuntimeError("the pipeline is already running; pass the callback to the first start()")
                return self
            self._callback = callback
            self._started = True
            if self.opencv_threads is not None:
                _opencv_threads_acquire(self.opencv_threads)
                self._opencv_previous = self.opencv_threads
            self.source.resume()
            self._pacing.acquire()
            self._t_start = time.perf_counter()
            self._window = (0, 0, self._t_start)
            self._capture_thread = threading.Thread(target=self._capture_loop, name="edgeinfer-capture", daemon=True)
            self._infer_thread = threading.Thread(target=self._infer_loop, name="edgeinfer-infer", daemon=True)
            self._infer_thread.start()
            self._capture_thread.start()
        return self

    def __iter__(self) -> Iterator[FrameResult]:
        """Results in frame order until the source ends, ``max_frames`` or stop(); leaving the loop stops."""
        if self._callback is not None:
            raise RuntimeError("results go to the callback given to start(); do not also iterate")
        self._iterating = True
        self.start()
        try:
            while True:
                item = self._results.get()
                if item is _STOP:
                    self._results.put(_STOP)  # a later iteration ends at once too
                    break
                self._credits.put(True)
                yield item
        finally:
            self._iterating = False
            if not self._finished.is_set():
                self.stop()
        if self.error is not None:
            raise self.error

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the run ends (source ended, max_frames, error or stop); True if it has."""
        if not self._started:
            return False
        return self._finished.wait(timeout)

    def stop(self) -> None:
        """Stop both threads and wait for them. Results already queued are dropped."""
        if not self._started or self._stop_requested:
            self._join()
            return
        self._stop_requested = True
        self.source.interrupt()
        if self._pacing.locked():
            try:
                self._pacing.release()
            except RuntimeError:
                pass
        self._free.put(_END)  # wake a capture thread waiting for a slot
        self._ready.put(_END)  # wake an inference thread waiting for a frame
        self._credits.put(True)  # wake an inference thread waiting for the consumer
        self._join()

    def _join(self) -> None:
        current = threading.current_thread()
        for thread in (self._capture_thread, self._infer_thread):
            if thread is not None and thread is not current and thread.is_alive():
                thread.join(timeout=30.0)
                if thread.is_alive():
                    log.warning("thread %s did not stop within 30 s (blocked in a device read?)", thread.name)

    def close(self) -> None:
        """Stop, then close the source and the engine the pipeline owns. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self.stop()
        if self._opencv_previous is not None:
            _opencv_threads_release()
            self._opencv_previous = None
        capture = self._capture_thread
        if capture is not None and capture.is_alive():
            # releasing a device under a thread still blocked in its read() can crash the driver: leak it
            log.warning("not closing %s: the capture thread is still blocked in it", self.source.description)
        elif self._owns_source:
            self.source.close()
        infer = self._infer_thread
        if self._owns_engine and not (infer is not None and infer.is_alive()):
            self.engine.close()

    def __enter__(self) -> Pipeline:
        if self._closed:
            raise EdgeInferError("the pipeline is closed — create a new one")
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __del__(self) -> None:  # a forgotten pipeline must not keep a camera open
        try:
            if not self._closed and self._started:
                self.close()
        except Exception:
            pass

    # -------------------------------------------------------------------------- hot swap
    def swap_engine(self, engine: Engine, timeout: float = 30.0) -> Engine:
        """Use ``engine`` from the next frame on; returns the previous engine (now yours to close).

        The pipeline owns (and closes) the new engine. Raises ValueError, leaving the run alone, when
        the new engine does not fit the task.
        """
        if engine is self.engine:
            return engine
        if engine.closed:
            raise ValueError("cannot swap in a closed engine")
        self._check_engine(engine)
        plan = self._plan
        prepared = self._build_plan(engine, plan.frame_shape, plan.native) if plan is not None else None
        if not self.running:
            old = self.engine
            self.engine, self._plan = engine, prepared
            self._owns_engine = True
            return old
        done = threading.Event()
        holder: list = [prepared]
        self._swap = (engine, done, holder)
        if not done.wait(timeout):
            if self._swap is not None and self._swap[0] is engine:
                self._swap = None
                raise EdgeInferError(f"the pipeline did not reach a frame boundary within {timeout:g} s")
            done.wait()
        return holder[1]

    def _apply_swap(self) -> None:
        request, self._swap = self._swap, None
        if request is None:
            return
        engine, done, holder = request
        old = self.engine
        self.engine = engine
        self._plan = holder[0]
        self._owns_engine = True
        self._offer_input_size(engine)
        holder.append(old)
        log.info("swapped engine %s -> %s", old.description, engine.description)
        done.set()

    # ----------------------------------------------------------------------------- stats
    @property
    def stats(self) -> PipelineStats:
        """Counters since start; percentiles over the last ``stats_window`` frames."""
        frames = self._stats.count
        return self._make_stats(0, frames, self.dropped, self._elapsed())

    def take_window(self) -> PipelineStats:
        """Stats of the frames since the previous call (or since start): for telemetry windows."""
        now = self._t_end if self._finished.is_set() else time.perf_counter()
        frames, dropped = self._stats.count, self.dropped
        prev_frames, prev_dropped, prev_time = self._window
        self._window = (frames, dropped, now)
        elapsed = max(now - prev_time, 0.0) if self._started else 0.0
        return self._make_stats(prev_frames, frames, dropped - prev_dropped, elapsed)

    def _elapsed(self) -> float:
        if not self._started:
            return 0.0
        end = self._t_end if self._finished.is_set() else time.perf_counter()
        return max(end - self._t_start, 0.0)

    def _make_stats(self, first: int, last: int, dropped: int, elapsed: float) -> PipelineStats:
        frames = last - first
        return PipelineStats(
            frames=frames, dropped=dropped, fps=frames / elapsed if elapsed > 0 else 0.0, elapsed_s=elapsed,
            stages=self._stats.summary(first, last), delegate=self.engine.description,
            reconnects=self.source.reconnects, callback_errors=self.callback_errors,
            source=self.source.description, reduction=self.source.reduction,
            corrupt_frames=self.source.corrupt_frames,
        )

    # ---------------------------------------------------------------------------- threads
    def _capture_loop(self) -> None:
        try:
            if self._defer_decode:
                self._capture_encoded()
            else:
                self._capture_decoded()
        except CaptureError as exc:
            self.error = exc
            log.error("capture stopped: %s", exc)
        except BaseException as exc:
            self.error = exc
            log.exception("capture thread failed")
        finally:
            self._ready.put(_END)

    def _capture_decoded(self) -> None:
        """Capture for sources that deliver decoded frames: read into the ring, stage, publish."""
        perf = time.perf_counter
        wall = time.time
        source = self.source
        frames = self._frames
        natives = self._natives
        info = self._slot_info
        ready = self._ready
        free = self._free
        latest = self.policy == "latest"
        for frame_id, slot in enumerate(self._free_slots()):
            t0 = perf()
            buffer = frames[slot]
            frame = source.read(buffer)
            if frame is None:
                free.put(slot)
                break
            t1 = perf()
            if frame is not buffer:  # first pass through the ring, or the frame size changed
                frames[slot] = frame
            natives[slot] = source.native_size
            t2 = self._stage(slot, frame, t1)
            info[slot] = (frame_id, t0, t1, t2, wall())
            if latest:
                self._drop_stale()
            ready.put(slot)

    def _free_slots(self) -> Iterator[int]:
        """Capture thread: free ring slots, one at a time, until stop() or the ring is closed.

        max_fps with `every` (files) paces the reading here, so frames do not wait in the ring and
        the latency figure stays honest. With `latest` (live sources) the inference thread paces and
        the newest frame wins.
        """
        period = 1.0 / self.max_fps if self.max_fps and self.policy != "latest" else 0.0
        next_due = 0.0
        free = self._free
        while not self._stop_requested:
            if period:
                next_due = self._pace(next_due, period)
                if next_due < 0:
                    return
            slot = free.get()
            if slot == _END:
                return
            yield slot

    def _stage(self, slot: int, frame: Any, now: float) -> float:
        """Preprocess ``frame`` into the slot's staged input when this thread should; the time after.

        Greedy balance: preprocess in the capture thread unless the inference thread sits waiting
        for this frame (then it has the time, and the frame reaches it sooner). Decode-bound runs
        thus preprocess in the inference thread, inference-bound runs here, balanced ones mix.
        """
        plan = self._plan
        place = self.preprocess_in
        if (plan is not None and frame.shape == plan.frame_shape and plan.native == self._natives[slot]
                and place != "inference"
                and (place == "capture" or not self._infer_idle)):
            plan.pre_staged(frame, plan.staged[slot])
            self._staged_gen[slot] = plan.gen
            return time.perf_counter()
        self._staged_gen[slot] = -1
        return now

    def _capture_encoded(self) -> None:
        """Capture for sources that hand out frames still compressed (MJPEG files and HTTP streams).

        Each frame is published in order as soon as it is read, and decoded by whichever thread
        gets to it first: this one, right after publishing, or the inference thread when it would
        otherwise wait for it. Under ``every`` a decode-bound run thus decodes on two cores, still
        in frame order, and an inference-bound one decodes here, ahead of the inference thread.
        Under ``latest`` this thread decodes only while the inference thread waits for a frame;
        otherwise frames wait compressed, and the ones dropped for newer ones are never decoded.
        """
        perf = time.perf_counter
        wall = time.time
        source = self.source
        info = self._slot_info
        ready = self._ready
        free = self._free
        locks = self._decode_locks
        undecoded = self._undecoded
        claim_lock = self._claim_lock
        latest = self.policy == "latest"
        for frame_id, slot in enumerate(self._free_slots()):
            t0 = perf()
            packet = source.read_encoded()
            if packet is None:
                free.put(slot)
                break
            self._encoded[slot] = packet
            locks[slot].acquire()  # released by whichever thread decodes the frame
            info[slot] = (frame_id, t0, perf(), 0.0, wall())
            with claim_lock:
                undecoded.append(slot)
            if latest:
                self._drop_stale()
                ready.put(slot)
                if self._infer_idle:  # it waits for this very frame: decode it now
                    self._decode_next(in_capture=True)
                continue
            ready.put(slot)
            # keep one more frame published ahead, for an idle inference thread to decode meanwhile
            if len(undecoded) < 2 and free.qsize():
                continue
            self._decode_next(in_capture=True)

    def _drop_stale(self) -> None:
        """``latest``: drop the oldest waiting frames until there is room for one more (frames still
        compressed, that no thread has decoded, are dropped as they are: their slot locks released)."""
        ready, free = self._ready, self._free
        while ready.qsize() >= self.queue_size:
            try:
                old = ready.get_nowait()
            except queue.Empty:
                return
            if old == _END:
                ready.put(_END)
                return
            with self._claim_lock:
                waiting = old in self._undecoded
                if waiting:
                    self._undecoded.remove(old)
            if waiting:
                self._encoded[old] = None
                self._decode_locks[old].release()
            free.put(old)
            self.dropped += 1

    def _decode_next(self, in_capture: bool) -> bool:
        """Decode the oldest published frame that no thread has taken yet; False when there is none."""
        with self._claim_lock:
            if not self._undecoded:
                return False
            slot = self._undecoded.popleft()
        self._decode_slot(slot, in_capture)
        return True

    def _claim_for_inference(self, needed: int) -> int | None:
        """The frame the inference thread should decode while ``needed`` is not ready, or None to wait.

        ``needed`` itself when no thread has taken it yet. A later frame only when decoding is the
        bottleneck (decoding takes longer than inferring, on average): otherwise the capture thread
        keeps ahead by itself, and a decode here would only delay the next inference.
        """
        with self._claim_lock:
            undecoded = self._undecoded
            if not undecoded:
                return None
            if undecoded[0] != needed and (self.policy == "latest" or self._decode_s <= self._infer_s):
                return None
            return undecoded.popleft()

    def _decode_slot(self, slot: int, in_capture: bool) -> None:
        perf = time.perf_counter
        try:
            started = perf()
            packet, self._encoded[slot] = self._encoded[slot], None
            buffer = self._frames[slot]
            frame = self.source.decode(packet, buffer)
            t1 = perf()
            self._decode_s += 0.1 * ((t1 - started) - self._decode_s)  # moving average, for _claim_for_inference
            self._decode_failed[slot] = frame is None
            if frame is None:
                return
            if frame is not buffer:
                self._frames[slot] = frame
            self._natives[slot] = self.source.native_size  # this thread's last decode
            t2 = self._stage(slot, frame, t1) if in_capture else t1
            frame_id, t0, fetched, _, stamp = self._slot_info[slot]
            # capture time = reading the packet + decoding it, wherever that happened
            self._slot_info[slot] = (frame_id, t1 - (fetched - t0) - (t1 - started), t1, t2, stamp)
            if not in_capture:
                self._staged_gen[slot] = -1
                self.decoded_by_inference += 1
        finally:
            self._decode_locks[slot].release()

    def _await_decoded(self, slot: int) -> None:
        """Inference thread: make sure ``slot`` is decoded, decoding it or a later frame meanwhile."""
        lock = self._decode_locks[slot]
        while not lock.acquire(blocking=False):
            claimed = self._claim_for_inference(slot)
            if claimed is None:
                lock.acquire()  # the capture thread is decoding it: wait
                break
            self._decode_slot(claimed, in_capture=False)
        lock.release()

    def _pace(self, next_due: float, period: float) -> float:
        """Sleep until ``next_due`` (perf_counter); the next due time, or -1 when stop() cut the wait."""
        now = time.perf_counter()
        if next_due <= now:
            return now + period
        if self._pacing.acquire(timeout=next_due - now):
            self._pacing.release()
            return -1.0
        return next_due + period

    def _infer_loop(self) -> None:
        import numpy as np

        perf = time.perf_counter
        ready = self._ready
        free = self._free
        frames = self._frames
        staged_gen = self._staged_gen
        info = self._slot_info
        stats = self._stats
        samples = stats.samples
        ring = stats.size
        period = 1.0 / self.max_fps if self.max_fps and self.policy == "latest" else 0.0
        next_due = 0.0
        max_frames = self.max_frames
        keep_frames = self.keep_frames
        copyto = np.copyto
        defer_decode = self._defer_decode
        natives = self._natives
        try:
            while not self._stop_requested:
                if period:
                    next_due = self._pace(next_due, period)
                    if next_due < 0:
                        break
                self._infer_idle = ready.empty()
                slot = ready.get()
                self._infer_idle = False
                if slot == _END:
                    break
                if defer_decode:
                    self._await_decoded(slot)
                    if self._decode_failed[slot]:
                        free.put(slot)  # a damaged frame: skipped (the source counts it)
                        continue
                t3 = perf()
                if self._swap is not None:
                    self._apply_swap()
                frame = frames[slot]
                plan = self._plan
                native = natives[slot]
                if plan is None or plan.frame_shape != frame.shape or plan.native != native:
                    plan = self._plan = self._build_plan(self.engine, frame.shape, native)
                staged = staged_gen[slot] == plan.gen
                if staged:
                    copyto(plan.view, plan.staged[slot])
                else:
                    plan.pre(frame, plan.view)
                kept = frame.copy() if keep_frames else None
                frame_id, t0, t1, t2, stamp = info[slot]
                free.put(slot)
                t4 = perf()
                plan.engine.invoke()
                t5 = perf()
                result = plan.decoder(plan.transform)
                t6 = perf()
                self._infer_s += 0.1 * ((t6 - t3) - self._infer_s)
                timings = StageTimings(
                    capture=(t1 - t0) * 1e3, preprocess=((t2 - t1) + (t4 - t3)) * 1e3, infer=(t5 - t4) * 1e3,
                    postprocess=(t6 - t5) * 1e3, latency=(t6 - t1) * 1e3, queue=(t3 - t2) * 1e3,
                )
                with stats.lock:
                    i = stats.count % ring
                    samples[0, i] = timings.capture
                    samples[1, i] = timings.queue
                    samples[2, i] = timings.preprocess
                    samples[3, i] = timings.infer
                    samples[4, i] = timings.postprocess
                    samples[5, i] = timings.latency
                    stats.count += 1
                self.frames += 1
                self._deliver(FrameResult(frame_id, stamp, result, timings, kept))
                if max_frames is not None and self.frames >= max_frames:
                    break
        except BaseException as exc:
            self.error = exc
            log.error("inference stopped: %s", exc)
        finally:
            self._t_end = perf()
            self._finish()

    def add_observer(self, observer: Callable[[FrameResult], None]) -> None:
        """Also hand every result to ``observer`` (guarded like a callback): health checks, recorders."""
        self._observers = (*self._observers, observer)

    def remove_observer(self, observer: Callable[[FrameResult], None]) -> None:
        """Stop handing results to ``observer`` (no error if it was not added)."""
        self._observers = tuple(o for o in self._observers if o is not observer)

    def _deliver(self, result: FrameResult) -> None:
        for observer in self._observers:  # a tuple swapped whole, so no lock is needed
            try:
                observer(result)
            except Exception:
                log.exception("pipeline observer failed on frame %d (the pipeline goes on)", result.frame_id)
        callback = self._callback
        if callback is not None:
            try:
                callback(result)
            except Exception:
                self.callback_errors += 1
                log.exception("pipeline callback failed on frame %d (the pipeline goes on)", result.frame_id)
            return
        if self._iterating:
            self._credits.get()  # back-pressure: at most a few results wait for the consumer
            if not self._stop_requested:
                self._results.put(result)

    def _finish(self) -> None:
        """End of the inference thread: stop capture, release waiters, mark the run finished."""
        self._stop_requested = True
        self.source.interrupt()
        self._free.put(_END)
        if self._swap is not None:
            self._apply_swap()
        capture = self._capture_thread
        if capture is not None and capture is not threading.current_thread():
            capture.join(timeout=30.0)
        self._results.put(_STOP)
        self._finished.set()


# ----------------------------------------------------------------------- OpenCV thread count
_opencv_lock = threading.Lock()
_opencv_users = 0
_opencv_saved: int | None = None


def _opencv_threads_acquire(threads: int) -> None:
    """Set OpenCV's (process-wide) thread count while a pipeline runs; restored by the last one out.

    The pipeline already spreads work over cores (decode in one thread, the delegate's threads in
    another); OpenCV's own worker pool would compete with the delegate for the same cores.
    """
    global _opencv_users, _opencv_saved
    import cv2

    with _opencv_lock:
        if _opencv_users == 0:
            _opencv_saved = cv2.getNumThreads()
        _opencv_users += 1
        cv2.setNumThreads(threads)


def _opencv_threads_release() -> None:
    global _opencv_users, _opencv_saved
    import cv2

    with _opencv_lock:
        _opencv_users = max(0, _opencv_users - 1)
        if _opencv_users == 0 and _opencv_saved is not None:
            cv2.setNumThreads(_opencv_saved)
            _opencv_saved = None


__all__ = ["POLICIES", "STAGES", "FrameResult", "Pipeline", "PipelineStats", "StageTimings"]
