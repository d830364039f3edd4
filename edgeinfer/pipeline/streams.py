"""The streams of a run: each one given, its open :class:`~.stream.Stream`, its status, and its outages.

:class:`StreamSet` is what a :class:`~.multi.MultiPipeline` knows of its streams: one
:class:`StreamRecord` per stream it was given (the source as given, the engine worker serving it, the
open stream or None, its status — starting, running, ended, failed — and its failures). A stream whose
capture fails is *failed*, one whose source has no more frames *ended*. With ``reopen`` a failed
stream (or one that could not be opened at the start) is closed and opened again on the ``backoff``
schedule, up to its ``give_up_s``, by the thread ``edgeinfer-reopen``; the listeners hear
``stream_failed`` (once per outage), ``stream_restored`` and ``stream_ended`` of the named streams.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import CaptureError, EdgeInferError
from .stats import PipelineStats, merge_stats

if TYPE_CHECKING:
    from ..util.backoff import Backoff
    from .engine_worker import EngineWorker
    from .stream import Stream

log = logging.getLogger("edgeinfer.pipeline")

#: what a run reports about its streams (the agent's ``events`` topic)
STREAM_FAILED, STREAM_RESTORED, STREAM_ENDED = "stream_failed", "stream_restored", "stream_ended"
#: seconds between the reopening thread's looks at the failed streams
REOPEN_POLL_S = 0.1

StreamListener = Callable[["StreamEvent"], Any]


@dataclass(frozen=True)
class StreamEvent:
    """Something that happened to one stream of a run: ``kind`` is one of the STREAM_* names."""

    kind: str
    level: str
    message: str
    data: dict[str, Any]


@dataclass
class StreamRecord:
    """One stream a run was given: the source as given, the worker serving it, the open :class:`Stream` (None
    while a failed one waits to be opened again), its status and failures."""

    name: str
    source: Any
    worker: EngineWorker
    stream: Stream | None = None
    status: str = "starting"  # starting, running, ended, failed
    error: BaseException | None = None
    failures: int = 0  # failed openings in a row
    failed_since: float | None = None  # time.monotonic()
    retry_at: float | None = None  # when to open it again; None: not again

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "source": str(self.source), "status": self.status,
                "error": error_text(self.error) if self.error is not None else None}

    def stats(self, stream: Stream | None = None, *, window: bool) -> PipelineStats:
        """The open stream's statistics since it started, or (``window``) since the previous window."""
        stream = stream or self.stream
        assert stream is not None
        worker = self.worker
        return (stream.take_window if window else stream.stats)(worker.engine, worker.failover.failover.stats_fields())


class StreamSet:
    """The streams of one run (see the module); ``make_stream`` opens a record's source as a stream of the run."""

    def __init__(self, *, name: str, backoff: Backoff, reopen: bool, make_stream: Callable[[StreamRecord], Stream],
                 started: Callable[[], bool]) -> None:
        self.name = name
        self.lock = threading.RLock()
        self._records: dict[str, StreamRecord] = {}
        self._backoff = backoff
        self._reopen = reopen
        self._make_stream = make_stream  # opens a record's source as a stream of the run
        self._started = started  # whether the run runs (a stream opened then starts at once)
        self._listeners: tuple[StreamListener, ...] = ()
        self._backlog: list[StreamEvent] = []  # what happened before the first listener (at the start), kept
        self._closed_windows: dict[str, PipelineStats] = {}  # windows of streams closed since the last take
        self._thread: threading.Thread | None = None
        self._wake = threading.Event()
        self._stopped = False

    # ------------------------------------------------------------------------ records
    def add(self, name: str, source: Any, worker: EngineWorker, *, given: bool = False) -> None:
        """Open ``source`` as stream ``name``, served by ``worker``. ValueError for a name in use; the source's
        error when it cannot be opened — except for a stream ``given`` at the start with ``reopen``: reported,
        and opened again on the backoff."""
        with self.lock:
            if name in self._records:
                raise ValueError(f"there is already a stream named {name!r}")
            record = self._records[name] = StreamRecord(name, source, worker)
        try:
            self._open(record)
        except Exception as exc:  # CaptureError mostly; a frame the model cannot take is a ValueError
            if given and self._reopen:
                self.failed(record, exc)
                return
            self.remove_record(name)
            raise

    def _open(self, record: StreamRecord) -> None:
        stream = self._make_stream(record)
        with self.lock:
            record.stream, record.status, record.error = stream, "running", None
            record.failures, record.failed_since, record.retry_at = 0, None, None
            record.worker.add(stream)
            if self._started():
                stream.start()

    def remove_record(self, name: str) -> StreamRecord | None:
        with self.lock:
            return self._records.pop(name, None)

    def remove(self, name: str) -> PipelineStats:
        """Stop and close stream ``name`` (KeyError when none is open); its statistics over its run."""
        record = self.remove_record(name)
        if record is None or record.stream is None:
            names = ", ".join(r.name for r in self.open_records()) or "none"
            raise KeyError(f"no stream named {name!r} (streams: {names})")
        stream = record.stream
        record.worker.remove(stream)
        stream.stop()
        stream.close_events()
        stats = record.stats(window=False)
        stream.close_source()
        return stats

    def open_records(self) -> list[StreamRecord]:
        """The records whose stream is open, in the order given."""
        with self.lock:
            return [record for record in self._records.values() if record.stream is not None]

    def open_streams(self) -> list[Stream]:
        return [record.stream for record in self.open_records()]  # type: ignore[misc]

    def get(self, name: str) -> Stream:
        """The open stream ``name`` (KeyError when there is none)."""
        with self.lock:
            stream = self._records[name].stream
        if stream is None:
            raise KeyError(name)
        return stream

    def record(self, name: str) -> StreamRecord:
        with self.lock:
            return self._records[name]

    # ------------------------------------------------------------------------ ends and failures
    def ended(self, stream: Stream) -> bool | None:
        """The engine's thread took ``stream``'s end: it ended, or failed (closed, with ``reopen``, to be opened
        again). Whether a stream still runs; None when the stream is no longer the run's (removed)."""
        with self.lock:
            record = self._records.get(stream.name)
            if record is None or record.stream is not stream:
                return None
            outage = None
            if stream.error is None:
                record.status = "ended"
            else:
                outage = self._mark_failed(record, stream.error)
                if self._reopen:  # closed now; its last window goes into the next one
                    record.worker.remove(stream)
                    record.stream = None
                    self._closed_windows[stream.name] = merge_stats(self._closed_windows.get(stream.name),
                                                                    record.stats(stream, window=True))
            running = any(r.status == "running" for r in self._records.values())
        if outage is not None:
            self._report_failed(record, stream.error, *outage)  # type: ignore[arg-type]
        elif stream.name:
            log.info("%sstream %s ended (%s has no more frames)", self.prefix(), stream.name, stream.source.description)
            self._emit(record, STREAM_ENDED, "info", f"stream {stream.name} ended (its source has no more frames)")
        if record.stream is None:
            stream.close_source()  # its capture thread has left
            self._wake.set()
        return running

    def failed(self, record: StreamRecord, error: BaseException) -> None:
        """``record``'s stream could not be opened, or its capture failed: reported once per outage, and opened
        again on the backoff with ``reopen``."""
        with self.lock:
            first, delay = self._mark_failed(record, error)
        self._report_failed(record, error, first, delay)

    def _mark_failed(self, record: StreamRecord, error: BaseException) -> tuple[bool, float | None]:
        """(With the lock held.) Whether this failure starts an outage, and the delay before the next opening
        (None: not again)."""
        first = record.status != "failed"
        record.status, record.error = "failed", error
        record.failures += 1
        now = time.monotonic()
        if record.failed_since is None:
            record.failed_since = now
        give_up, delay = self._backoff.give_up_s, None
        if self._reopen and (give_up is None or now - record.failed_since < give_up):
            delay = self._backoff.delay(record.failures)
        record.retry_at = None if delay is None else now + delay
        return first, delay

    def _report_failed(self, record: StreamRecord, error: BaseException, first: bool, delay: float | None) -> None:
        """Log a failure; tell the listeners of the first of an outage (never under the lock)."""
        if not record.name:
            return  # a run of one unnamed stream (a Pipeline): its error is the run's, and the capture logged it
        again = f"; opening it again in {delay:.1f} s" if delay is not None else ""
        log.log(logging.WARNING if first else logging.DEBUG, "%sstream %s failed: %s%s", self.prefix(), record.name,
                error_text(error), again)
        if first:
            this = f"opened again in {delay:.1f} s" if delay is not None else "not opened again"
            self._emit(record, STREAM_FAILED, "error", f"stream {record.name} failed ({error_text(error)}); the "
                                                       f"other streams run on, this one is {this}",
                       error=error_text(error), type=type(error).__name__,
                       retry_in_s=None if delay is None else round(delay, 2))

    def error(self) -> BaseException | None:
        """The run's error once no stream runs: None when every stream ended; an unnamed single stream's own
        error; else each failed stream's error in one (a CaptureError when every one is)."""
        with self.lock:
            records = list(self._records.values())
        failed = [r for r in records if r.status == "failed" and r.error is not None]
        if not failed:
            return None
        if len(records) == 1 and not records[0].name:
            return failed[0].error
        detail = "; ".join(f"{r.name}: {error_text(r.error)}" for r in failed)
        cls = CaptureError if all(isinstance(r.error, CaptureError) for r in failed) else EdgeInferError
        return cls(f"no stream of {f'pipeline {self.name}' if self.name else 'the run'} is running ({detail})")

    def any_running(self) -> bool:
        with self.lock:
            return any(r.status == "running" for r in self._records.values())

    # ------------------------------------------------------------------------ statistics
    def stats(self) -> dict[str, PipelineStats]:
        """Per open stream, since it started."""
        return {record.name: record.stats(window=False) for record in self.open_records()}

    def take_windows(self) -> dict[str, PipelineStats]:
        """Per stream, since the previous call (a stream closed meanwhile: its last window)."""
        with self.lock:
            windows = {record.name: record.stats(window=True) for record in self.open_records()}
            closed, self._closed_windows = self._closed_windows, {}
        for name, last in closed.items():
            windows[name] = merge_stats(last, windows.get(name))  # type: ignore[assignment]
        return windows

    # ------------------------------------------------------------------------ reopening
    def start(self) -> None:
        """Open failed streams again when they are due (with ``reopen``), until stop()."""
        if self._reopen:
            self._thread = threading.Thread(target=self._reopen_failed, name="edgeinfer-reopen", daemon=True)
            self._thread.start()

    def end(self) -> None:
        """Open nothing again (the run is over)."""
        self._stopped = True
        self._wake.set()

    def stop(self) -> None:
        """end(), and wait for the reopening thread."""
        self.end()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(30.0)

    def _reopen_failed(self) -> None:
        """Thread ``edgeinfer-reopen``."""
        while not self._stopped:
            self._wake.wait(REOPEN_POLL_S)
            self._wake.clear()
            now = time.monotonic()
            with self.lock:
                due = [r for r in self._records.values()
                       if r.status == "failed" and r.stream is None and r.retry_at is not None and now >= r.retry_at]
            for record in due:
                if self._stopped:
                    return
                try:
                    self._open(record)
                except Exception as exc:
                    self.failed(record, exc)  # not reported again: the outage goes on
                else:
                    log.info("%sstream %s is back", self.prefix(), record.name)
                    self._emit(record, STREAM_RESTORED, "info", f"stream {record.name} is running again")

    # ------------------------------------------------------------------------ listeners and views
    def add_listener(self, listener: StreamListener) -> None:
        """Every listener also hears what happened before the first one was added (a stream that could not be
        opened at the start): the agent's reporter and its analytics store each need it."""
        with self.lock:
            self._listeners = (*self._listeners, listener)
            backlog = list(self._backlog)
        for event in backlog:
            _tell((listener,), event)

    def _emit(self, record: StreamRecord, kind: str, level: str, message: str, **data: Any) -> None:
        event = StreamEvent(kind, level, f"{self.prefix()}{message}",
                            {"stream": record.name, "source": str(record.source), **data})
        with self.lock:
            if not self._listeners:
                self._backlog.append(event)
                return
            listeners = self._listeners
        _tell(listeners, event)

    def prefix(self) -> str:
        return f"pipeline {self.name}: " if self.name else ""

    def state(self, name: str) -> tuple[str, BaseException | None]:
        record = self.record(name)
        if record.status in ("running", "ended"):
            return record.status, None
        return "failed", record.error

    def status(self) -> list[dict[str, Any]]:
        with self.lock:
            return [record.describe() for record in self._records.values()]

    def errors(self) -> dict[str, BaseException]:
        with self.lock:
            return {name: r.error for name, r in self._records.items() if r.status == "failed" and r.error}


def _tell(listeners: tuple[StreamListener, ...], event: StreamEvent) -> None:
    for listener in listeners:
        try:
            listener(event)
        except Exception:
            log.exception("stream listener failed on %s (the run goes on)", event.kind)


def error_text(error: BaseException | None) -> str:
    """An error as one line: ``Type: message``."""
    return f"{type(error).__name__}: {' '.join(str(error).split())}"
