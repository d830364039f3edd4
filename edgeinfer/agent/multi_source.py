"""A pipeline with several sources, as the agent runs it: one MultiPipeline with the face of a Pipeline.

A ``pipelines:`` entry with ``sources`` runs as one :class:`~edgeinfer.pipeline.multi.MultiPipeline`:
one engine serving every stream round-robin (``batch`` frames per invoke where the delegate batches),
each stream with its own capture thread, counters, motion gate, tracker, lines and zones, every
stream on the entry's options. :class:`MultiSourcePipeline` gives it what
:class:`~.runner.PipelineRunner` expects of an :class:`edgeinfer.Pipeline` (``start``, ``wait``,
``stop``, ``close``, ``error``, ``engine``, ``stats``, ``take_window``, observers), so the runner
supervises it like any pipeline: restarts with backoff, the restart command, clean stops. What one
source never needs is added here:

- **One failing stream does not take the others down.** A source that cannot be opened, or that
  dies while running, is reported once (``stream_failed``), closed, and opened again on the
  pipeline's ``backoff`` schedule (a live source's reconnect schedule; up to ``give_up_s`` when it
  is set, never with ``restart: never``) while the other streams run on; ``stream_restored`` when it
  is back. A stream whose source ends (a file without ``loop``) reports ``stream_ended``. The run
  ends when no stream is left running: cleanly when every stream ended, with the failed streams'
  error otherwise (the runner then restarts the whole pipeline with its backoff, as it does a single
  source that fails). The build itself fails only when no stream opens at all.
- **Windows.** ``take_window()`` is a :class:`MultiStats`: the pipeline's aggregate as a
  ``PipelineStats`` (frames, dropped, reused and fps summed over the streams; ``stages`` are the
  busiest stream's percentiles, since percentiles do not add up; ``outputs`` summarise the answers of
  every stream), each stream's own window and status, and the stream events of the window, which
  the runner emits as it takes the window.
- **Model updates** swap the engine between two batches (:meth:`MultiSourcePipeline.swap_engine`),
  every stream going on; the engine swapped out is the caller's (the update keeps it to roll back).

MultiPipeline does not say publicly that one stream has ended or why, nor that its engine worker
died (its run then never ends); the functions at the end of this module read that from its
internals, in one place.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import CaptureError, ClosedError, EdgeInferError
from ..pipeline.stats import PipelineStats
from .pipeline_config import PipelineConfig, StreamSource

log = logging.getLogger(__name__)

#: seconds between looks at the streams (ends, failures, reopenings due)
POLL_S = 0.1
#: how long stop() waits for the thread that watches the streams (it may be opening a source)
JOIN_TIMEOUT_S = 30.0
#: what a pipeline with several sources reports about its streams (the ``events`` topic)
STREAM_EVENTS = ("stream_failed", "stream_restored", "stream_ended")


@dataclass(frozen=True)
class StreamEvent:
    """Something that happened to one stream, emitted by the runner with the window that carries it."""

    kind: str
    level: str
    message: str
    data: dict[str, Any]


@dataclass(frozen=True)
class MultiStats(PipelineStats):
    """A window of a pipeline with several sources: the aggregate, and each stream's own."""

    #: each stream's window, in config order (a stream that is not open has none)
    streams: dict[str, PipelineStats] = field(default_factory=dict)
    #: each stream's status: starting, running, ended or failed
    stream_status: dict[str, str] = field(default_factory=dict)
    #: what happened to the streams in the window
    events: tuple[StreamEvent, ...] = ()


def merge_stats(first: PipelineStats | None, second: PipelineStats | None) -> PipelineStats | None:
    """Two consecutive windows as one: counts add up, the later window's rates and percentiles stand."""
    if first is None or second is None:
        return second if first is None else first
    from ..pipeline.outputs import merge_summaries

    return dataclasses.replace(second, frames=first.frames + second.frames, dropped=first.dropped + second.dropped,
                               reused=first.reused + second.reused,
                               outputs=merge_summaries(first.outputs, second.outputs))


def merge_multi_windows(first: Any, second: Any) -> Any:
    """Two consecutive MultiStats windows as one (per stream too; the events of both, in order)."""
    merged = merge_stats(first, second)
    if first is None or second is None or not isinstance(merged, MultiStats):
        return merged
    before, after = getattr(first, "streams", {}), getattr(second, "streams", {})
    streams = {name: merge_stats(before.get(name), after.get(name)) for name in (*before, *after)}
    return dataclasses.replace(merged, streams={name: s for name, s in streams.items() if s is not None},
                               events=(*getattr(first, "events", ()), *getattr(second, "events", ())))


@dataclass
class _Stream:
    """What the agent knows of one configured stream."""

    spec: StreamSource
    status: str = "starting"
    error: BaseException | None = None
    #: failed openings in a row, and since when it has been failing (monotonic)
    failures: int = 0
    failed_since: float | None = None
    #: when to open it again (monotonic); None: not again
    retry_at: float | None = None

    @property
    def name(self) -> str:
        return self.spec.name

    def describe(self) -> dict[str, Any]:
        error = _text(self.error) if self.error is not None else None
        return {"name": self.name, "source": str(self.spec.source), "status": self.status, "error": error}


class MultiSourcePipeline:
    """The streams of one ``sources`` entry on one engine, supervised like a Pipeline (see the module)."""

    def __init__(self, config: PipelineConfig) -> None:
        from ..pipeline.multi import MultiPipeline
        from ..pipeline.outputs import OutputSummary
        from ..runtime.selection import load

        self.config = config
        self.name = config.name
        options = config.options
        self._backoff = options.backoff
        self._reopen = config.restart != "never"
        self._lock = threading.RLock()
        self._streams = [_Stream(spec) for spec in config.sources]
        self._events: list[StreamEvent] = []
        self._closed_windows: dict[str, PipelineStats] = {}  # streams closed since the last window
        self._retired = (0, 0)  # frames and drops of streams closed during the run
        self._observers: tuple[Callable[[Any], None], ...] = ()
        self._outputs = OutputSummary()
        self._frames = 0
        self._error: BaseException | None = None
        self._finished = threading.Event()
        self._stopping = threading.Event()
        self._wake = threading.Event()  # look at the streams now (max_frames reached, stop)
        self._thread: threading.Thread | None = None
        self._started = self._closed = self._opencv = False
        self._multi: Any = None
        self._engine = load(config.model, options.delegate, threads=options.threads, batch=config.batch)
        try:
            self._multi = MultiPipeline(self._engine, {}, **config.pipeline_kwargs())
            self._multi.add_observer(self._observe)
            now = time.monotonic()
            for stream in self._streams:
                self._open(stream, now)
            if not any(stream.status == "running" for stream in self._streams):
                raise self._no_stream_error()
        except BaseException:
            self.close()
            raise

    # -- what the runner uses of a Pipeline ---------------------------------------------------
    @property
    def engine(self) -> Any:
        """The one engine every stream runs on now (after a delegate failover, the replacement)."""
        return _current_engine(self._multi) or self._engine

    @property
    def error(self) -> BaseException | None:
        """Why the run ended, if it failed: the engine's error, or the failed streams' when none was left."""
        return self._error

    @property
    def streams(self) -> list[str]:
        """The configured streams' names, in config order."""
        return [stream.name for stream in self._streams]

    def start(self, callback: Callable[[Any], None] | None = None) -> MultiSourcePipeline:
        """Start every open stream, the engine's thread and the thread that watches the streams."""
        if self._closed:
            raise ClosedError(f"pipeline {self.name} is closed — create a new one")
        if self._started:
            return self
        self._started = True
        threads = self.config.opencv_threads
        if threads is not None:
            from ..pipeline._opencv import opencv_threads_acquire

            opencv_threads_acquire(threads)
            self._opencv = True
        self._multi.start(callback)
        self._thread = threading.Thread(target=self._watch, name=f"edgeinfer-streams-{self.name}", daemon=True)
        self._thread.start()
        return self

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the run has ended (see the module) or stop(); True if it has."""
        return self._started and self._finished.wait(timeout)

    def stop(self) -> None:
        """Stop watching, then every stream and the engine's thread."""
        self._stopping.set()
        self._wake.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread() and thread.is_alive():
            thread.join(JOIN_TIMEOUT_S)
        if self._multi is not None:
            self._multi.stop()
        self._finished.set()

    def close(self) -> None:
        """Stop, close the sources and the engine. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self.stop()
        if self._multi is not None:
            self._multi.close()
        if _engine_busy(self._multi):
            log.warning("pipeline %s: not closing its engine, an inference is still running on it", self.name)
        elif self._engine is not None:  # (after a model update the MultiPipeline closes the engine it runs)
            self._engine.close()
        if self._opencv:
            from ..pipeline._opencv import opencv_threads_release

            opencv_threads_release()
            self._opencv = False

    def swap_engine(self, engine: Any, timeout: float = 30.0) -> Any:
        """Serve every stream with ``engine`` from the next batch on; the previous engine, now the caller's
        (the MultiPipeline owns the new one). ValueError, the run untouched, when it does not fit."""
        old = self._multi.swap_engine(engine, timeout)
        if old is self._engine:
            self._engine = None  # the one this pipeline loaded is the caller's now
        return old

    def add_observer(self, observer: Callable[[Any], None]) -> None:
        """Also hand every result of every stream (``result.stream`` names it) to ``observer``."""
        self._observers = (*self._observers, observer)

    def remove_observer(self, observer: Callable[[Any], None]) -> None:
        """Stop handing results to ``observer`` (no error if it was not added)."""
        self._observers = tuple(o for o in self._observers if o is not observer)

    def add_delegate_listener(self, listener: Callable[[Any], None]) -> None:
        """The engine's delegate failovers and failbacks, where MultiPipeline has them (the runner reports them)."""
        add = getattr(self._multi, "add_delegate_listener", None)
        if add is not None:
            add(listener)

    def add_event_listener(self, listener: Callable[[dict], Any]) -> None:
        """The MultiPipeline's rule-triggered events (option ``events``), of every stream."""
        self._multi.add_event_listener(listener)

    @property
    def stats(self) -> MultiStats:
        """Since the run started, over every stream (streams closed on the way included in the counts)."""
        with self._lock:
            frames, dropped = self._retired
            combined = self._combine(self._multi.stats(), None, ())
        return dataclasses.replace(combined, frames=combined.frames + frames, dropped=combined.dropped + dropped)

    def take_window(self) -> MultiStats:
        """The window since the previous call: the aggregate, each stream's, the stream events."""
        with self._lock:
            windows = self._multi.take_window()
            for name, closed in self._closed_windows.items():
                windows[name] = merge_stats(closed, windows.get(name))
            self._closed_windows = {}
            events, self._events = tuple(self._events), []
            return self._combine(windows, self._outputs.take(), events)

    def stream_status(self) -> list[dict[str, Any]]:
        """Each stream's name, source, status and error (its entry in the ``state`` message)."""
        with self._lock:
            return [stream.describe() for stream in self._streams]

    # -- the streams --------------------------------------------------------------------------
    def _observe(self, result: Any) -> None:
        """Engine thread: count and summarise each result, then hand it to the observers."""
        if not result.reused:
            self._frames += 1
            self._outputs.observe(result.result)
            if self._frames == self.config.max_frames:
                self._wake.set()
        for observer in self._observers:
            try:
                observer(result)
            except Exception:
                log.exception("pipeline %s: an observer failed on frame %d of stream %s (the run goes on)",
                              self.name, result.frame_id, result.stream)

    def _open(self, stream: _Stream, now: float) -> bool:
        """Open ``stream``'s source and add it to the run; on failure, report it and plan the next try."""
        try:
            self._multi.add_stream(stream.name, stream.spec.source)
        except Exception as exc:  # CaptureError mostly; a frame the model cannot take is a ValueError
            self._failed(stream, exc, now)
            return False
        with self._lock:
            stream.status, stream.error, stream.failures = "running", None, 0
            stream.failed_since = stream.retry_at = None
        return True

    def _failed(self, stream: _Stream, error: BaseException, now: float) -> None:
        with self._lock:
            first = stream.status != "failed"
            stream.status, stream.error = "failed", error
            stream.failures += 1
            if stream.failed_since is None:
                stream.failed_since = now
            give_up = self._backoff.give_up_s
            delay: float | None = None
            if self._reopen and (give_up is None or now - stream.failed_since < give_up):
                delay = self._backoff.delay(stream.failures)
            stream.retry_at = None if delay is None else now + delay
        log.log(logging.WARNING if first else logging.DEBUG, "pipeline %s: stream %s failed: %s%s", self.name,
                stream.name, _text(error), f"; opening it again in {delay:.1f} s" if delay is not None else "")
        if first:
            again = f"opened again in {delay:.1f} s" if delay is not None else "not opened again"
            self._event(stream, "stream_failed", "error",
                        f"pipeline {self.name}: stream {stream.name} failed ({_text(error)}); the other streams "
                        f"run on, this one is {again}",
                        error=_text(error), type=type(error).__name__,
                        retry_in_s=None if delay is None else round(delay, 2))

    def _event(self, stream: _Stream, kind: str, level: str, message: str, **data: Any) -> None:
        with self._lock:
            self._events.append(StreamEvent(kind, level, message,
                                            {"stream": stream.name, "source": str(stream.spec.source), **data}))

    def _watch(self) -> None:
        """Thread ``edgeinfer-streams-<name>``: notice ends and failures, reopen failed streams, end the run."""
        while not self._stopping.is_set():
            self._wake.wait(POLL_S)
            self._wake.clear()
            if self._stopping.is_set():
                break
            try:
                if self._check(time.monotonic()):
                    break
            except Exception as exc:  # a bug here must not leave the streams unwatched for ever
                log.exception("pipeline %s: watching the streams failed", self.name)
                self._error = exc
                break
        if not self._stopping.is_set():
            self._multi.stop()
            self._finished.set()

    def _check(self, now: float) -> bool:
        """One look at the run; True when it is over (``error`` says why, if it failed)."""
        engine_error = _engine_error(self._multi)
        if engine_error is not None:
            self._error = engine_error
            return True
        for stream in self._streams:
            if stream.status == "running":
                ended, error = _stream_end(self._multi, stream.name)
                if ended:
                    self._stream_ended(stream, error, now)
            elif stream.status == "failed" and stream.retry_at is not None and now >= stream.retry_at:
                self._reopen_stream(stream, now)
        max_frames = self.config.max_frames
        if max_frames is not None and self._frames >= max_frames:
            return True
        if any(stream.status == "running" for stream in self._streams):
            return False
        if any(stream.status == "failed" for stream in self._streams):
            self._error = self._no_stream_error()
        return True

    def _reopen_stream(self, stream: _Stream, now: float) -> None:
        if self._open(stream, now):
            log.info("pipeline %s: stream %s is back", self.name, stream.name)
            self._event(stream, "stream_restored", "info", f"pipeline {self.name}: stream {stream.name} is running "
                                                           "again")

    def _stream_ended(self, stream: _Stream, error: BaseException | None, now: float) -> None:
        if error is None:
            with self._lock:
                stream.status = "ended"
            log.info("pipeline %s: stream %s ended (its source has no more frames)", self.name, stream.name)
            self._event(stream, "stream_ended", "info",
                        f"pipeline {self.name}: stream {stream.name} ended (its source has no more frames)")
            return
        with self._lock:  # closed: its last window goes into the next one
            window = _take_stream_window(self._multi, stream.name)
            self._closed_windows[stream.name] = merge_stats(self._closed_windows.get(stream.name), window)
            try:
                total = self._multi.remove_stream(stream.name)
                self._retired = (self._retired[0] + total.frames, self._retired[1] + total.dropped)
            except KeyError:
                pass
        self._failed(stream, error, now)

    def _no_stream_error(self) -> EdgeInferError:
        """No stream runs: each failed stream's error in one (a CaptureError when every one is)."""
        failed = [stream for stream in self._streams if stream.error is not None]
        detail = "; ".join(f"{stream.name}: {_text(stream.error)}" for stream in failed)
        cls = CaptureError if all(isinstance(stream.error, CaptureError) for stream in failed) else EdgeInferError
        return cls(f"no stream of pipeline {self.name} is running ({detail or 'every one ended'})")

    def _combine(self, windows: Mapping[str, PipelineStats], outputs: dict[str, Any] | None,
                 events: tuple[StreamEvent, ...]) -> MultiStats:
        ordered = {stream.name: windows[stream.name] for stream in self._streams if stream.name in windows}
        present = list(ordered.values())
        busiest = max(present, key=lambda w: w.frames, default=None)
        # the streams share the engine: its delegate, failover state and lost frames are the same in each
        wanted = next((w.delegate_wanted for w in present if w.delegate_wanted), None)
        return MultiStats(
            frames=sum(w.frames for w in present), dropped=sum(w.dropped for w in present),
            fps=sum(w.fps for w in present), elapsed_s=max((w.elapsed_s for w in present), default=0.0),
            stages=busiest.stages if busiest is not None else {}, delegate=self.engine.description,
            reconnects=sum(w.reconnects for w in present), corrupt_frames=sum(w.corrupt_frames for w in present),
            source=", ".join(f"{stream.name}={stream.spec.source}" for stream in self._streams),
            degraded=any(w.degraded for w in present), delegate_wanted=wanted,
            frames_lost=max((w.frames_lost for w in present), default=0),
            reused=sum(w.reused for w in present), outputs=outputs, streams=ordered,
            stream_status={stream.name: stream.status for stream in self._streams}, events=events)


def _text(error: BaseException | None) -> str:
    """An error as one line: ``Type: message``."""
    return f"{type(error).__name__}: {' '.join(str(error).split())}"


# -- what MultiPipeline says of its streams and engines ----------------------------------------------

def _stream_end(multi: Any, name: str) -> tuple[bool, BaseException | None]:
    """Whether the engine has taken stream ``name``'s end, and the error its capture died of (None: it ended)."""
    try:
        state, error = multi.stream_state(name)
    except KeyError:
        return False, None
    return state != "running", error


def _take_stream_window(multi: Any, name: str) -> PipelineStats | None:
    """Stream ``name``'s window since the last one (before it is removed: remove_stream gives its whole run)."""
    try:
        return multi.take_stream_window(name)
    except KeyError:
        return None


def _engine_error(multi: Any) -> BaseException | None:
    """The error an engine stopped on (no delegate left to fail over to)."""
    return multi.error


def _current_engine(multi: Any) -> Any:
    """The engine the streams are served with now: a failover replaces it."""
    return multi.engine


def _engine_busy(multi: Any) -> bool:
    """Whether an engine's thread still runs (closing its engine under it could crash the runtime)."""
    return multi is not None and multi.busy


__all__ = ["STREAM_EVENTS", "MultiSourcePipeline", "MultiStats", "StreamEvent", "merge_multi_windows",
           "merge_stats"]
