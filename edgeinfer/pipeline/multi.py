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

import dataclasses
import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from ..capture import FrameSource, open_source
from ..errors import ClosedError, InferenceError, InputMismatch
from ..runtime.engine import Engine
from .analytics import analytics_from_options
from .binding import ModelBinding
from .capture_loop import CaptureLoop
from .control import RunControl
from .delivery import Observer, ResultDelivery
from .events import events_from_options, stream_folder
from .infer_loop import reused_result
from .labels import Labels
from .motion import motion_gate_from_options
from .multi_failover import WorkerFailover
from .options import PipelineOptions
from .ring import END, FrameRing
from .stats import FrameResult, PipelineStats, StageTimings, StatsRing, StatsWindow, window_stats
from .tasks import get_task

log = logging.getLogger("edgeinfer.pipeline")

JOIN_TIMEOUT_S = 30.0


class BatchRow:
    """Row ``index`` of an engine's batch, seen as an engine of batch one: what a preprocessor writes into
    and a decoder reads from (the same memory as the engine's views, no copy)."""

    def __init__(self, engine: Engine, index: int) -> None:
        self.engine = engine
        self.index = index
        self.model = engine.model
        self.delegate = engine.delegate
        self.description = engine.description
        self.inputs = tuple(dataclasses.replace(s, shape=(1, *s.shape[1:])) for s in engine.inputs)
        self.outputs = tuple(dataclasses.replace(s, shape=(1, *s.shape[1:])) for s in engine.outputs)

    @property
    def closed(self) -> bool:
        return self.engine.closed

    def input_view(self, index: int = 0) -> Any:
        return self.engine.input_view(index)[self.index:self.index + 1]

    def output_view(self, index: int = 0) -> Any:
        return self.engine.output_view(index)[self.index:self.index + 1]


def batch_size(engine: Engine) -> int:
    """The engine's batch: the first dimension of its input (1 for most models)."""
    shape = engine.inputs[0].shape
    return int(shape[0]) if shape and int(shape[0]) > 1 else 1


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


class EngineWorker:
    """One engine serving its streams: round-robin over the streams with a frame ready, up to a batch per invoke."""

    def __init__(self, engine: Engine, owns_engine: bool, options: PipelineOptions, labels: Labels | None,
                 deliver: Callable[[FrameResult], None], index: int, on_end: Callable[[Stream], None]) -> None:
        self.owns_engine = owns_engine
        self.task = get_task(options.task)
        self._labels, self._settings = labels, options.decoder_settings()
        self._use(engine)
        # an invoke that fails: the plan's next delegate serves every stream of this worker
        self.failover = WorkerFailover(engine, options, check=self._check, install=self._use)
        if owns_engine:
            self.failover.loaded.append(engine)
        self._deliver = deliver
        self._on_end = on_end  # a stream's source has no more frames
        self._signal = threading.Semaphore(0)
        self._lock = threading.Lock()
        self.streams: tuple[Stream, ...] = ()
        self._next = 0
        self._stopping = False
        self.invokes = 0
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name=f"edgeinfer-engine-{index}", daemon=True)

    def _use(self, engine: Engine) -> None:
        """Serve the streams with ``engine`` from the next batch on (at start, and after a failover)."""
        self.engine = engine
        self.batch = batch_size(engine)
        # one decoder per batch row (a decoder reads its row's outputs; the transform comes from the stream)
        self._decoders = [self.task.decoder(BatchRow(engine, b), self._labels, self._settings)  # type: ignore[arg-type]
                          for b in range(self.batch)]
        self._rows = [BatchRow(engine, b).input_view(0) for b in range(self.batch)]
        for stream in getattr(self, "streams", ()):
            stream.binding.replace(BatchRow(engine, 0))  # type: ignore[arg-type]
            stream.binding.owns_engine = False

    def _check(self, engine: Engine) -> None:
        """ValueError when a replacement engine cannot serve the streams' task."""
        for stream in self.streams[:1]:
            stream.binding.check(BatchRow(engine, 0))  # type: ignore[arg-type]

    def wake(self) -> None:
        self._signal.release()

    def add(self, stream: Stream) -> None:
        with self._lock:
            self.streams = (*self.streams, stream)

    def remove(self, stream: Stream) -> None:
        with self._lock:
            self.streams = tuple(s for s in self.streams if s is not stream)

    def stop(self) -> None:
        self._stopping = True
        self.wake()
        if self.thread.is_alive() and self.thread is not threading.current_thread():
            self.thread.join(JOIN_TIMEOUT_S)

    def _run(self) -> None:
        try:
            while True:
                self._signal.acquire()
                if self._stopping:
                    return
                batch = self._collect()
                if batch:
                    self._infer(batch)
                self.failover.between_batches(self.engine, self._stopping)
        except BaseException as exc:
            self.error = exc
            log.error("engine worker stopped: %s", exc)

    def _collect(self) -> list[tuple[Stream, Any]]:
        """Up to a batch of ready frames, at most one per stream, starting after the stream served last."""
        streams = self.streams
        count = len(streams)
        batch: list[tuple[Stream, Any]] = []
        start = self._next
        for offset in range(count):
            stream = streams[(start + offset) % count]
            try:
                slot = stream.ring.ready.get_nowait()
            except queue.Empty:
                continue
            if slot is END:
                if not stream.ended:
                    stream.ended = True
                    self._on_end(stream)
                continue
            if stream.events is not None:
                stream.events.offer(slot.frame, slot.frame_id, slot.wall_time)
            if self._reused(stream, slot):
                continue
            batch.append((stream, slot))
            self._next = (start + offset + 1) % count
            if len(batch) == self.batch:
                break
        for _ in range(len(batch) - 1):  # one wake-up was used; the others belong to these frames too
            self._signal.acquire(blocking=False)
        return batch

    def _reused(self, stream: Stream, slot: Any) -> bool:
        """Motion gating: deliver the stream's previous result for a frame that did not change."""
        gate = stream.gate
        if gate is None:
            return False
        plan = stream.binding.plan_for(slot.frame.shape, slot.native)
        if gate.changed(slot.frame) or stream.last[0] != plan.gen:
            return False
        reused = reused_result(slot, stream.last[1], stream=stream.name)
        stream.ring.free.put(slot)
        stream.control.reused += 1
        self._deliver(reused)
        return True

    def _infer(self, batch: list[tuple[Stream, Any]]) -> None:
        import numpy as np

        perf = time.perf_counter
        taken = []
        for row, (stream, slot) in enumerate(batch):
            t3 = perf()
            frame = slot.frame
            plan = stream.binding.plan_for(frame.shape, slot.native)
            if slot.staged_gen == plan.gen:
                np.copyto(self._rows[row], plan.staged[slot.index])
            else:
                plan.pre(frame, self._rows[row])
            taken.append((stream, plan, slot.frame_id, slot.wall_time, slot.read_start, slot.read_end,
                          slot.staged_end, t3, perf()))
            stream.ring.free.put(slot)
        t4 = perf()
        try:
            self.engine.invoke()
        except InferenceError as exc:
            if isinstance(exc, InputMismatch):
                raise
            self.failover.failed(self.engine, exc, len(taken))  # DelegateFailed when there is no other delegate
            return
        self.invokes += 1
        t5 = perf()
        for row, (stream, plan, frame_id, stamp, t0, t1, t2, t3, t3b) in enumerate(taken):
            result = self._decoders[row](plan.transform)
            if stream.analytics is not None:
                result = stream.analytics.process(result, frame_id, stamp)
            if stream.events is not None:
                stream.events.check(result, frame_id, stamp)
            stream.last = (plan.gen, result)
            t6 = perf()
            timings = StageTimings(capture=(t1 - t0) * 1e3, preprocess=((t2 - t1) + (t3b - t3)) * 1e3,
                                   infer=(t5 - t4) * 1e3, postprocess=(t6 - t5) * 1e3, latency=(t6 - t1) * 1e3,
                                   queue=(t3 - t2) * 1e3)
            stream.stats_ring.record(timings)
            stream.control.frames += 1
            self._deliver(FrameResult(frame_id, stamp, result, timings, stream=stream.name))


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
                              self._stream_ended)
        self._workers.append(worker)
        if self._started:
            worker.thread.start()
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
                                 backoff=opts.backoff)
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
                worker.thread.start()
            for stream in self._streams.values():
                stream.start()
        return self

    def _stream_ended(self, stream: Stream) -> None:
        """A worker saw a stream's end: when every stream has ended, so has the run (iteration stops)."""
        log.info("stream %s ended (%s has no more frames)", stream.name, stream.source.description)
        with self._lock:
            done = all(s.ended for s in self._streams.values())
        if done:
            self._delivery.end()
            self._finished.set()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until every stream has ended (or stop()); True if so."""
        return self._finished.wait(timeout)

    def _deliver(self, result: FrameResult) -> None:
        self._delivery.deliver(result, lambda: self._closed)

    def add_observer(self, observer: Observer) -> None:
        self._delivery.add_observer(observer)

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
            if not worker.thread.is_alive():
                worker.failover.close()  # the engines it loaded: the first (unless the caller's), replacements

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
