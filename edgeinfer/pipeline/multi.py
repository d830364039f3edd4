"""A run: one or more sources served by one engine (or more), fairly, batched where it can.

:class:`MultiPipeline` is the run every face uses — :class:`~.core.Pipeline` is a run of one unnamed
stream, the agent runs every ``pipelines:`` entry as one. Each source is a :class:`~.stream.Stream`
(its ring of preallocated slots, its ``edgeinfer-capture`` thread, its per-stream state); each engine
has one :class:`~.engine_worker.EngineWorker` thread, the one inference loop, serving its streams
round-robin and, when the engine's input has a batch dimension larger than one, several streams'
frames in one invoke.

Streams can be added and removed while the others run (``add_stream`` / ``remove_stream``); a
stream can be pinned to its own engine (``add_stream(..., engine=...)``: another worker). Results
are :class:`~.stats.FrameResult` with ``stream`` set, through a callback, observers or iteration;
``stats()`` and ``take_window()`` are per stream. ``max_frames`` counts the results of the whole run.

A stream whose capture fails (a camera gone for good) is *failed*, one whose source has no more
frames *ended*; the others run on. With ``reopen=True`` a failed stream — or one whose source could
not be opened at the start — is closed and opened again on the ``backoff`` schedule (up to its
``give_up_s``) while the others run; the stream listeners hear ``stream_failed`` (once per outage),
``stream_restored`` and ``stream_ended``. The run ends when no stream is running: with ``error``
set when one failed (an unnamed single stream's own error; else one naming every failed stream).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from ..errors import ClosedError
from ..runtime.engine import Engine
from ._opencv import OpenCVThreads
from .delivery import Observer, ResultDelivery
from .engine_worker import BatchRow, EngineWorker, batch_size
from .engines import EnginePool
from .failover import DelegateEvent, DelegateStatus
from .labels import Labels
from .live_options import reconfigure as reconfigure_run
from .options import PipelineOptions
from .run_samples import PipelineSamples
from .stats import FrameResult, PipelineStats
from .stream import Stream
from .streams import STREAM_ENDED, STREAM_FAILED, STREAM_RESTORED, StreamEvent, StreamRecord, StreamSet
from .tasks import ModelReading, read_run_model

log = logging.getLogger("edgeinfer.pipeline")


class MultiPipeline:
    """Several sources, one engine (or more): per-stream capture, fair shared inference, per-stream stats.

    ::

        with edgeinfer.MultiPipeline("model.tflite", {"door": "rtsp://...", "yard": 0}) as multi:
            for result in multi:
                print(result.stream, result.frame_id, result.result[0].label)
            print({name: s.fps for name, s in multi.stats().items()})

    ``model`` is a path or an :class:`Engine` you keep owning (an engine whose input has a batch
    dimension > 1 takes that many frames per invoke; ``batch=N`` loads a path that way, on a delegate
    that can reshape the model: openvino). Every keyword is a pipeline option shared by the streams
    (task, labels, policy, queue_size, max_frames, ...); ``policy`` defaults to ``latest`` (cameras).
    ``name`` names the run in its logs and errors; ``reopen`` opens failed streams again (see the module).
    """

    def __init__(self, model: str | os.PathLike | Engine,
                 sources: Mapping[str, Any] | list[Any] | tuple[Any, ...] = (),
                 options: PipelineOptions | None = None, *, batch: int | None = None, name: str = "",
                 reopen: bool = False, **option_values: Any) -> None:
        if options is None:
            option_values.setdefault("policy", "latest")
        self.name = name
        self.options = options = PipelineOptions.merged(options, option_values)
        named = list(sources.items() if isinstance(sources, Mapping)
                     else ((f"stream{i}", s) for i, s in enumerate(sources)))
        self._delivery = ResultDelivery(options.queue_size * min(4, max(1, len(named))))
        self._streams = StreamSet(name=name, backoff=options.backoff, reopen=reopen, make_stream=self._make_stream,
                                  started=lambda: self._started)
        self._lock = self._streams.lock
        self._engines = EnginePool(options, batch=batch, deliver=self._deliver, on_end=self._stream_ended,
                                   on_error=self._end_run)
        self._started = self._closed = self._stopping = self._ended = False
        self._finished = threading.Event()
        #: why the run ended, if it failed: an engine with no delegate left, or its streams' failure
        self.error: BaseException | None = None
        self.reading: ModelReading | None = None  # how the model is read: its task, output layout, preprocessing
        self._event_listeners: tuple[Callable[[dict], Any], ...] = ()
        self.samples = PipelineSamples(name, lambda: self._streams.open_streams())  # the sampling rules' samples
        #: results delivered so far, every stream's (max_frames; the agent's health gate: agent/config_apply.py)
        self.delivered = 0
        self._opencv = OpenCVThreads(options.opencv_threads)
        labels = options.labels
        self.labels: Labels | None = Labels.load(labels) if isinstance(labels, (str, os.PathLike)) else labels
        owns = not isinstance(model, Engine)
        engine = self._engines.load(model, [source for _, source in named]) if owns else model  # type: ignore[arg-type]
        try:
            self.reading, self.labels = read_run_model(BatchRow(engine, 0), options, self.labels)  # type: ignore[arg-type]
            self.options = options = dataclasses.replace(options, task=self.reading.task)
            self._engines.options, self._engines.labels = options, self.labels
            self._default = self._engines.worker_for(engine, owns)
            for stream_name, source in named:
                self._streams.add(stream_name, source, self._default, given=True)
            if reopen and named and not self._streams.any_running():
                raise self._streams.error()  # type: ignore[misc]
        except BaseException:
            if not self._engines.workers and owns:
                engine.close()
            self.close()
            raise

    # ------------------------------------------------------------------------ streams
    @property
    def streams(self) -> list[str]:
        """The names of the streams open now."""
        return [record.name for record in self._streams.open_records()]

    def add_stream(self, name: str, source: Any, *, engine: Engine | str | os.PathLike | None = None) -> None:
        """Add a stream (also while running; the others are not paused). ``engine`` pins it to its own engine.
        ValueError for a name in use; the source's error (CaptureError mostly) when it cannot be opened."""
        with self._lock:
            if self._closed:
                raise ClosedError("the multi-stream pipeline is closed")
            worker = self._default
            if engine is not None:
                owns = not isinstance(engine, Engine)
                worker = self._engines.worker_for(self._engines.load(engine) if owns else engine,  # type: ignore[arg-type]
                                                  owns)
        self._streams.add(name, source, worker)

    def _make_stream(self, record: StreamRecord) -> Stream:
        """Open ``record``'s source as a stream of this run (the source closed again when the model cannot take
        its frames)."""
        worker = record.worker
        stream = Stream.open(record.name, record.source, self.options, row=worker.row(), task=worker.task,
                             labels=self.labels, wake=worker.wake,
                             callback_errors=lambda: self._delivery.callback_errors)
        for listener in self._event_listeners if stream.events is not None else ():
            stream.events.add_listener(listener)  # type: ignore[union-attr]
        self.samples.attach(stream.sampler, lambda: worker.engine.model)  # the model serving it when kept
        return stream

    def remove_stream(self, name: str) -> PipelineStats:
        """Stop and close one stream (the others go on); its statistics over its run."""
        return self._streams.remove(name)

    def _stream_ended(self, stream: Stream) -> None:
        """A worker took a stream's end (see the module): when no stream runs any more, the run is over."""
        stream.finish()
        if self._stopping:
            return
        if self._streams.ended(stream) is False:  # no stream runs any more
            self._end_run(self._streams.error())

    def get_stream(self, name: str) -> Stream:
        """The open stream ``name`` (KeyError when there is none): its source, counters, analytics, events."""
        return self._streams.get(name)

    def stream_state(self, name: str) -> tuple[str, BaseException | None]:
        """``("running" | "ended" | "failed", error)`` of stream ``name`` (KeyError when there is none): ended once
        its engine has taken its last frame; failed when its capture stopped on an error (or could not reopen)."""
        return self._streams.state(name)

    def stream_status(self) -> list[dict[str, Any]]:
        """Each stream's name, source, status (starting, running, ended, failed) and error, in the order given."""
        return self._streams.status()

    def stream_errors(self) -> dict[str, BaseException]:
        """The streams whose capture stopped on an error (a camera gone for good), with the error."""
        return self._streams.errors()

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
            self._opencv.acquire()
            self._engines.start()
            for record in self._streams.open_records():
                record.stream.start()  # type: ignore[union-attr]
            self._streams.start()
        return self

    def _stopping_now(self) -> bool:
        """Whether the consumer of the results is gone (stop())."""
        return self._stopping

    started = property(lambda self: self._started, doc="Whether start() was called.")

    @property
    def finished(self) -> bool:
        """Whether the run is over (every stream done, an engine failed, max_frames, or stop())."""
        return self._finished.is_set()

    def _deliver(self, result: FrameResult) -> None:
        self._delivery.deliver(result, self._stopping_now)
        self.delivered += 1  # one worker per engine; with several, the GIL keeps the count close enough
        max_frames = self.options.max_frames
        if max_frames is not None and self.delivered >= max_frames:
            self._end_run(None)

    def _end_run(self, error: BaseException | None) -> None:
        """The run is over (no stream runs, an engine stopped on ``error`` with no delegate left, max_frames):
        stop capturing, finish the recordings, end the results."""
        with self._lock:
            if self._ended or self._stopping:
                return
            self._ended = True
            if error is not None and self.error is None:
                self.error = error
            streams = self._streams.open_streams()
        self._engines.end()
        self._streams.end()
        self._wind_down(streams)

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the run is over (every stream done, an engine failed, max_frames, or stop()); True if so."""
        return self._finished.wait(timeout)

    def stop(self) -> None:
        """Stop every stream and worker. Results already queued are dropped."""
        with self._lock:
            self._stopping = True
            streams = self._streams.open_streams()
        self._streams.stop()
        self._delivery.wake_producer()  # an engine's thread waiting for an iterating consumer gone
        self._engines.stop()
        self._wind_down(streams)

    def _wind_down(self, streams: list[Stream]) -> None:
        """Stop capturing, finish the recordings in progress, end the results: the run is over."""
        for stream in streams:
            stream.stop()
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
        for stream in self._streams.open_streams():
            stream.close_source()
        self._engines.close()  # what it loaded (never the caller's, nor one abandoned in a hang)
        self._opencv.release()

    def __enter__(self) -> MultiPipeline:
        if self._closed:
            raise ClosedError("the multi-stream pipeline is closed")
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __iter__(self) -> Iterator[FrameResult]:
        """Results of every stream as they come, until the run is over or stop()."""
        self._delivery.iterating = True
        self.start()
        try:
            yield from self._delivery.results()
        finally:
            self._delivery.iterating = False

    # ------------------------------------------------------------------------ engines and listeners
    @property
    def engine(self) -> Engine:
        """The engine the streams are served with now (the first worker's; a failover replaces it)."""
        return self._default.engine

    @property
    def delegate_status(self) -> DelegateStatus:
        """The first engine's delegate in use, the one wanted, whether degraded, failovers and frames lost."""
        return self._default.failover.failover.status()

    @property
    def busy(self) -> bool:
        """Whether an engine's thread still runs (closing its engine under it could crash the runtime)."""
        return self._engines.busy

    @property
    def abandoned_threads(self) -> list[threading.Thread]:
        """Engine threads left stuck in a hung invoke (never joined; each leaves if its call returns)."""
        return self._engines.abandoned_threads

    def swap_engine(self, engine: Engine, timeout: float = 30.0) -> Engine:
        """A model update: every stream of the first engine is served with ``engine`` from the next batch
        on (capture goes on); returns the previous engine, now yours to close. The pipeline owns (and
        closes) the new one, the one wanted from now on (failovers follow its plan). ValueError, the run
        untouched, when it cannot serve the streams' task."""
        return self._default.swap(engine, timeout)

    reconfigure = reconfigure_run  # (options, timeout=30): new options while every stream goes on (live_options.py)
    def add_observer(self, observer: Observer) -> None:
        """Also hand every result to ``observer`` (guarded like a callback)."""
        self._delivery.add_observer(observer)

    def remove_observer(self, observer: Observer) -> None:
        """Stop handing results to ``observer`` (no error if it was not added)."""
        self._delivery.remove_observer(observer)

    def add_delegate_listener(self, listener: Callable[[DelegateEvent], Any]) -> None:
        """Call ``listener(event)`` on each ``delegate_fallback`` / ``delegate_restored`` of any engine."""
        self._engines.add_delegate_listener(listener)

    def add_stream_listener(self, listener: Callable[[StreamEvent], Any]) -> None:
        """Call ``listener(event)`` on each ``stream_failed`` / ``stream_restored`` / ``stream_ended`` of a
        named stream (keep it short: it runs in the engine's or the reopening thread). Each listener also
        hears what happened before the first was added (a stream that could not be opened at the start)."""
        self._streams.add_listener(listener)

    def add_event_listener(self, listener: Callable[[dict], Any]) -> None:
        """Call ``listener(event)`` for each event a rule of any stream fires (``event["stream"]`` names
        it), once its evidence is written; streams added later too. ValueError without ``events`` rules."""
        if not self.options.events:
            raise ValueError("this pipeline has no event rules (option events)")
        with self._lock:
            self._event_listeners = (*self._event_listeners, listener)
            streams = self._streams.open_streams()
        for stream in streams:
            if stream.events is not None:
                stream.events.add_listener(listener)

    # ------------------------------------------------------------------------ statistics
    @property
    def invokes(self) -> int:
        """Engine invokes so far, over every worker (with batching, fewer than the frames)."""
        return self._engines.invokes

    def stats(self) -> dict[str, PipelineStats]:
        """Per open stream, since it started."""
        return self._streams.stats()

    def take_window(self) -> dict[str, PipelineStats]:
        """Per stream, since the previous call (a stream closed meanwhile: its last window): for telemetry."""
        return self._streams.take_windows()

    def fairness(self) -> float:
        """The slowest stream's fps over the fastest's since start (1.0: perfectly fair)."""
        rates = [s.fps for s in self.stats().values()]
        return min(rates) / max(rates) if rates and max(rates) > 0 else 1.0


__all__ = ["STREAM_ENDED", "STREAM_FAILED", "STREAM_RESTORED", "BatchRow", "EngineWorker", "MultiPipeline",
           "StreamEvent", "StreamRecord", "batch_size"]

