"""Many cameras, one accelerator: several streams served by one engine, fairly, batched where it can.

:class:`MultiPipeline` runs one ``edgeinfer-capture-<stream>`` thread per source (the same
:class:`~.capture_loop.CaptureLoop` and frame ring as :class:`~.core.Pipeline`: frames land in
preallocated slots and are preprocessed there into per-slot staged inputs) and one
``edgeinfer-engine-<n>`` thread per engine (:class:`EngineWorker`). The worker takes ready frames
round-robin — after serving a stream it looks at the next one first, so no stream starves — and,
when the engine's input has a batch dimension larger than one (OpenVINO reshaped to a batch,
TensorRT or ONNX Runtime with a batch), frames of several streams go into one invoke: each into its
own row of the input tensor, each decoded from its own row of the outputs.

Streams can be added and removed while the others run (``add_stream`` / ``remove_stream``); a
stream can be pinned to its own engine (``add_stream(..., engine=...)``: another worker). Results
are :class:`~.stats.FrameResult` with ``stream`` set, through a callback, observers or iteration;
``stats()`` and ``take_window()`` are per stream.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from ..capture import FrameSource, open_source
from ..errors import ClosedError
from ..runtime.engine import Engine
from .analytics import analytics_from_options
from .binding import ModelBinding
from .capture_loop import CaptureLoop
from .control import RunControl
from .delivery import Observer, ResultDelivery
from .engine_worker import BatchRow, EngineWorker, batch_size
from .events import events_from_options, stream_folder
from .labels import Labels
from .motion import motion_gate_from_options
from .options import PipelineOptions
from .ring import FrameRing
from .stats import FrameResult, PipelineStats, StatsRing, StatsWindow, window_stats
from .tasks import get_task

log = logging.getLogger("edgeinfer.pipeline")

JOIN_TIMEOUT_S = 30.0


class StreamCapture(CaptureLoop):
    """The capture loop of one stream: each published frame (and the end) also wakes its engine's worker."""

    def __init__(self, *args: Any, wake: Callable[[], None], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._wake = wake

    def _publish(self, slot: Any) -> None:
        super()._publish(slot)
        self._wake()

    def run(self) -> None:
        try:
            super().run()
        finally:
            self._wake()


class Stream:
    """One source of a multi-stream run: its ring, capture thread, counters and stage timings."""

    def __init__(self, name: str, source: FrameSource, owns_source: bool, worker: EngineWorker,
                 options: PipelineOptions, labels: Labels | None) -> None:
        self.name = name
        self.source = source
        self.owns_source = owns_source
        self.worker = worker
        self.ring = FrameRing(options.queue_size)
        self.control = RunControl()
        self.stats_ring = StatsRing(options.stats_window)
        self.binding = ModelBinding(BatchRow(worker.engine, 0), owns_engine=False,  # type: ignore[arg-type]
                                    task=worker.task, options=options, labels=labels, source=source,
                                    slots=len(self.ring.slots))
        self.binding.offer_input_size(self.binding.engine)
        self.capture = StreamCapture(source, self.ring, self.binding, self.control, options, wake=worker.wake)
        self.thread: threading.Thread | None = None
        self.ended = False
        self.next_due = 0.0  # max_fps: when the worker serves this stream next (time.monotonic)
        self.window = StatsWindow()
        self.gate = motion_gate_from_options(options)
        self.last: tuple[int, Any] = (-1, None)  # (plan generation, result) a frame that did not change reuses
        self.analytics = analytics_from_options(options)  # tracking, lines and zones of this stream
        # event rules of this stream; its evidence in a folder of its own under evidence_dir
        self.events = events_from_options(options, stream=name, evidence_dir=stream_folder(options.evidence_dir, name))
        if self.events is not None and self.analytics is not None:
            self.analytics.add_listener(self.events.on_analytics)

    def start(self) -> None:
        self.control.begin()
        self.window.start(self.control.t_start)
        self.source.resume()
        self.thread = threading.Thread(target=self.capture.run, name=f"edgeinfer-capture-{self.name}", daemon=True)
        self.thread.start()

    def stop(self) -> None:
        """Stop capturing and wait for the capture thread."""
        self.control.request_stop()
        self.source.interrupt()
        self.ring.end()
        if self.thread is not None and self.thread is not threading.current_thread():
            self.thread.join(JOIN_TIMEOUT_S)

    @property
    def error(self) -> BaseException | None:
        """What stopped this stream's capture, None when it ended normally or still runs."""
        return self.control.error

    def close_events(self) -> None:
        """Finish the recordings in progress (after the worker has stopped handing this stream's frames)."""
        if self.events is not None:
            self.events.close()

    def stats(self) -> PipelineStats:
        """Since the stream started."""
        return self._stats_of(0, self.stats_ring.count, self.control.dropped, self.control.reused,
                              max(time.perf_counter() - self.control.t_start, 0.0))

    def take_window(self) -> PipelineStats:
        """Since the previous call: for telemetry."""
        return self._stats_of(*self.window.take(self.stats_ring.count, self.control.dropped, self.control.reused,
                                                time.perf_counter()))

    def _stats_of(self, first: int, last: int, dropped: int, reused: int, elapsed: float) -> PipelineStats:
        return window_stats(self.stats_ring, first, last, dropped=dropped, reused=reused, elapsed=elapsed,
                            source=self.source, delegate=self.worker.engine.description,
                            analytics=self.analytics.counts() if self.analytics is not None else None,
                            **self.worker.failover.failover.stats_fields())


class MultiPipeline:
    """Several sources, one engine (or more): per-stream capture, fair shared inference, per-stream stats.

    ::

        with edgeinfer.MultiPipeline("model.tflite", {"door": "rtsp://...", "yard": 0}) as multi:
            for result in multi:
                print(result.stream, result.frame_id, result.result[0].label)
            print({name: s.fps for name, s in multi.stats().items()})

    ``model`` is a path or an :class:`Engine` you keep owning (an engine whose input has a batch
    dimension > 1 takes that many frames per invoke; ``batch=N`` loads a path that way, on a delegate
    that can reshape the model: openvino). Every keyword is a pipeline option shared by
    the streams (task, labels, policy, queue_size, ...); ``policy`` defaults to ``latest`` (cameras).
    """

    def __init__(self, model: str | os.PathLike | Engine,
                 sources: Mapping[str, Any] | list[Any] | tuple[Any, ...] = (),
                 options: PipelineOptions | None = None, *, batch: int | None = None, **option_values: Any) -> None:
        if options is None:
            option_values.setdefault("policy", "latest")
        self._batch = batch
        self.options = options = PipelineOptions.merged(options, option_values)
        labels = options.labels
        self.labels: Labels | None = Labels.load(labels) if isinstance(labels, (str, os.PathLike)) else labels
        self._delivery = ResultDelivery(options.queue_size * 4)
        self._lock = threading.Lock()
        self._streams: dict[str, Stream] = {}
        self._workers: list[EngineWorker] = []
        self._started = False
        self._closed = False
        self._finished = threading.Event()
        #: the error an engine stopped on (no delegate left); the run is over
        self.error: BaseException | None = None
        self._event_listeners: tuple[Callable[[dict], Any], ...] = ()
        owns = not isinstance(model, Engine)
        engine = self._load(model) if owns else model
        if self.labels is None and get_task(options.task).embedded_labels:
            self.labels = Labels.embedded(engine.model)
        self._default = self._worker_for(engine, owns)
        named = sources.items() if isinstance(sources, Mapping) else ((f"stream{i}", s) for i, s in enumerate(sources))
        try:
            for name, source in named:
                self.add_stream(name, source)
        except BaseException:
            self.close()
            raise

    def _load(self, model: str | os.PathLike) -> Engine:
        from ..runtime.selection import load

        return load(model, self.options.delegate, threads=self.options.threads, batch=self._batch)

    def _worker_for(self, engine: Engine, owns: bool) -> EngineWorker:
        for worker in self._workers:
            if worker.engine is engine:
                return worker
        worker = EngineWorker(engine, owns, self.options, self.labels, self._deliver, len(self._workers),
                              self._stream_ended, self._engine_failed)
        self._workers.append(worker)
        if self._started:
            worker.start()
        return worker

    # ------------------------------------------------------------------------ streams
    @property
    def streams(self) -> list[str]:
        """The names of the streams running now."""
        return list(self._streams)

    def add_stream(self, name: str, source: Any, *, engine: Engine | str | os.PathLike | None = None) -> None:
        """Add a stream (also while running; the others are not paused). ``engine`` pins it to its own engine."""
        with self._lock:
            if self._closed:
                raise ClosedError("the multi-stream pipeline is closed")
            if name in self._streams:
                raise ValueError(f"there is already a stream named {name!r}")
            worker = self._default
            if engine is not None:
                owns = not isinstance(engine, Engine)
                worker = self._worker_for(self._load(engine) if owns else engine, owns)  # type: ignore[arg-type]
            opts = self.options
            opened = open_source(source, size=opts.size, fps=opts.fps, fourcc=opts.fourcc, loop=opts.loop,
                                 backoff=opts.backoff, reduced=opts.decode_reduced)
            try:
                stream = Stream(name, opened, not isinstance(source, FrameSource), worker, opts, self.labels)
                stream.binding.check(stream.binding.engine)  # type: ignore[arg-type]
            except BaseException:
                if not isinstance(source, FrameSource):
                    opened.close()
                raise
            self._streams[name] = stream
            for listener in self._event_listeners if stream.events is not None else ():
                stream.events.add_listener(listener)  # type: ignore[union-attr]
            worker.add(stream)
            if self._started:
                stream.start()

    def remove_stream(self, name: str) -> PipelineStats:
        """Stop and close one stream (the others go on); its statistics over its run."""
        with self._lock:
            stream = self._streams.pop(name, None)
        if stream is None:
            raise KeyError(f"no stream named {name!r} (streams: {', '.join(self._streams) or 'none'})")
        stream.worker.remove(stream)
        stream.stop()
        stream.close_events()
        stats = stream.stats()
        if stream.owns_source:
            stream.source.close()
        return stats

    # ------------------------------------------------------------------------ running
    def start(self, callback: Callable[[FrameResult], None] | None = None) -> MultiPipeline:
        """Start every stream and engine worker; each result goes to ``callback`` (in a worker thread)."""
        with self._lock:
            if self._closed:
                raise ClosedError("the multi-stream pipeline is closed")
            if self._started:
                return self
            self._started = True
            self._delivery.callback = callback
            for worker in self._workers:
                worker.start()
            for stream in self._streams.values():
                stream.start()
        return self

    def _stream_ended(self, stream: Stream) -> None:
        """A worker saw a stream's end: when every stream has ended, so has the run (iteration stops)."""
        if stream.error is not None:
            log.warning("stream %s failed: %s", stream.name, stream.error)
        elif not stream.control.stop_requested:
            log.info("stream %s ended (%s has no more frames)", stream.name, stream.source.description)
        with self._lock:
            done = all(s.ended for s in self._streams.values())
        if done:
            self._delivery.end()
            self._finished.set()

    def _engine_failed(self, error: BaseException) -> None:
        """An engine worker stopped on an error (no delegate left to fail over to): the run is over."""
        self.error = error
        self._delivery.end()
        self._finished.set()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until every stream has ended, an engine failed (``error``), or stop(); True if so."""
        return self._finished.wait(timeout)

    def stream_state(self, name: str) -> tuple[str, BaseException | None]:
        """``("running" | "ended" | "failed", error)`` of stream ``name`` (KeyError when there is none):
        ended once its engine has taken its last frame; failed when its capture stopped on an error."""
        with self._lock:
            stream = self._streams[name]
        if not stream.ended:
            return "running", None
        return ("failed", stream.error) if stream.error is not None else ("ended", None)

    def take_stream_window(self, name: str) -> PipelineStats:
        """Stream ``name``'s statistics since the previous call (KeyError when there is none)."""
        with self._lock:
            stream = self._streams[name]
        return stream.take_window()

    @property
    def engine(self) -> Engine:
        """The engine the streams are served with now (the first worker's; a failover replaces it)."""
        return self._default.engine

    def swap_engine(self, engine: Engine, timeout: float = 30.0) -> Engine:
        """A model update: every stream of the first engine is served with ``engine`` from the next batch
        on (capture goes on); returns the previous engine, now yours to close. The pipeline owns (and
        closes) the new one, the one wanted from now on (failovers follow its plan). ValueError, the run
        untouched, when it cannot serve the streams' task."""
        return self._default.swap(engine, timeout)

    @property
    def busy(self) -> bool:
        """Whether an engine's thread still runs (closing its engine under it could crash the runtime)."""
        return any(worker.running for worker in self._workers)

    def stream_errors(self) -> dict[str, BaseException]:
        """The streams whose capture stopped on an error (a camera gone for good), with the error."""
        with self._lock:
            return {name: s.error for name, s in self._streams.items() if s.error is not None}

    def _deliver(self, result: FrameResult) -> None:
        self._delivery.deliver(result, lambda: self._closed)

    def add_observer(self, observer: Observer) -> None:
        """Also hand every result to ``observer`` (guarded like a callback)."""
        self._delivery.add_observer(observer)

    def remove_observer(self, observer: Observer) -> None:
        """Stop handing results to ``observer`` (no error if it was not added)."""
        self._delivery.remove_observer(observer)

    def add_delegate_listener(self, listener: Callable[[Any], None]) -> None:
        """Call ``listener(event)`` on each ``delegate_fallback`` / ``delegate_restored`` of any engine."""
        for worker in self._workers:
            worker.failover.add_listener(listener)

    def add_event_listener(self, listener: Callable[[dict], Any]) -> None:
        """Call ``listener(event)`` for each event a rule of any stream fires (``event["stream"]`` names
        it), once its evidence is written; streams added later too. ValueError without ``events`` rules."""
        if not self.options.events:
            raise ValueError("this pipeline has no event rules (option events)")
        with self._lock:
            self._event_listeners = (*self._event_listeners, listener)
            streams = list(self._streams.values())
        for stream in streams:
            if stream.events is not None:
                stream.events.add_listener(listener)

    def __iter__(self) -> Iterator[FrameResult]:
        """Results of every stream as they come, until stop()."""
        self._delivery.iterating = True
        self.start()
        try:
            yield from self._delivery.results()
        finally:
            self._delivery.iterating = False

    def stop(self) -> None:
        """Stop every stream and worker."""
        with self._lock:
            streams = list(self._streams.values())
        for stream in streams:
            stream.stop()
        self._delivery.wake_producer()
        for worker in self._workers:
            worker.stop()
        for stream in streams:
            stream.close_events()
        self._delivery.end()
        self._finished.set()

    def close(self) -> None:
        """Stop, then close the sources and engines the pipeline owns. Idempotent."""
        if self._closed:
            return
        self.stop()
        self._closed = True
        for stream in self._streams.values():
            if stream.owns_source:
                stream.source.close()
        for worker in self._workers:
            if not worker.running:
                worker.failover.close()  # what it loaded (never the caller's, nor one abandoned in a hang)

    def __enter__(self) -> MultiPipeline:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # ------------------------------------------------------------------------ statistics
    @property
    def invokes(self) -> int:
        """Engine invokes so far, over every worker (with batching, fewer than the frames)."""
        return sum(worker.invokes for worker in self._workers)

    def stats(self) -> dict[str, PipelineStats]:
        """Per stream, since it started."""
        return {name: s.stats() for name, s in list(self._streams.items())}

    def take_window(self) -> dict[str, PipelineStats]:
        """Per stream, since the previous call: for telemetry."""
        return {name: s.take_window() for name, s in list(self._streams.items())}

    def fairness(self) -> float:
        """The slowest stream's fps over the fastest's since start (1.0: perfectly fair)."""
        rates = [s.fps for s in self.stats().values()]
        return min(rates) / max(rates) if rates and max(rates) > 0 else 1.0


__all__ = ["BatchRow", "EngineWorker", "MultiPipeline", "batch_size"]
