"""The engine's thread: the one inference loop of every run, serving its streams round-robin, a batch per invoke.

:class:`EngineWorker` (thread ``edgeinfer-infer``; ``edgeinfer-infer-<n>`` for a run's further
engines) serves :class:`~.stream.Stream` objects: a :class:`~.core.Pipeline` is a run of one, a
:class:`~.multi.MultiPipeline` of several. It takes ready frames round-robin — after serving a stream
it looks at the next one first, so no stream starves — and, when the engine's input has a batch
dimension larger than one, frames of several streams go into one invoke, each into its own
:class:`BatchRow` of the input tensor and decoded from its own row of the outputs. Per frame:

take the oldest ready slot (decoding it first if it was published compressed, or a later frame while
the capture thread decodes this one) → offer it to the event rules → motion gating (an unchanged
frame gets the previous result, marked reused) → the model input into the engine's input row (one
memcpy of a staged input, or the whole preprocess) → the slot back to the ring → invoke → decode →
tracking, lines and zones → event rules → output summary → stage timings → deliver.

An invoke that raises goes on with the plan's next delegate (:class:`~.failover.WorkerFailover`); one
that hangs is seen by the :class:`~.watchdog.InvokeWatchdog`, which abandons the thread stuck in it
(an epoch: if the call ever returns, that thread leaves without delivering) and starts a new one on
the next delegate. A model update (:meth:`EngineWorker.swap`) takes effect between two batches.
"""

from __future__ import annotations

import dataclasses
import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..errors import DelegateFailed, InferenceError, InputMismatch
from .boundary import BatchBoundary
from .failover import WorkerFailover
from .ring import END
from .stats import FrameResult
from .tasks import get_task, read_model
from .watchdog import InvokeTimes, InvokeWatchdog

if TYPE_CHECKING:
    from ..runtime.engine import Engine
    from .binding import InferencePlan
    from .labels import Labels
    from .options import PipelineOptions
    from .ring import Slot
    from .stream import Stream

log = logging.getLogger("edgeinfer.pipeline")

#: seconds stop() waits for the worker's thread
JOIN_TIMEOUT_S = 30.0
#: seconds a model update waits for the worker to finish its batch
SWAP_TIMEOUT_S = 30.0

#: a frame taken for the next invoke: its stream, slot, plan and when it was taken (perf_counter)
Taken = tuple["Stream", "Slot", "InferencePlan", float]


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


class EngineWorker:
    """One engine serving its streams: round-robin over the streams with a frame ready, up to a batch per invoke."""

    def __init__(self, engine: Engine, owns_engine: bool, options: PipelineOptions, labels: Labels | None, *,
                 index: int, deliver: Callable[[FrameResult], None], on_end: Callable[[Stream], None],
                 on_error: Callable[[BaseException], None]) -> None:
        self.task = get_task(options.task or "classify")
        self._labels, self._settings = labels, options.decoder_settings()
        self._options, self._index = options, index  # before _use(): its decoders read the options
        self.streams: tuple[Stream, ...] = ()
        self.watchdog: InvokeWatchdog | None = None  # started with the worker (start())
        #: the recent invoke times, for the watchdog's bound
        self.invoke_times = InvokeTimes()
        self._use(engine)
        # an invoke that fails: the plan's next delegate serves every stream of this worker
        self.failover = WorkerFailover(engine, options, check=self._check, install=self._use)
        if owns_engine:
            self.failover.loaded.append(engine)
        self._deliver = deliver
        self._on_end = on_end  # a stream's source has no more frames (or its capture stopped)
        self._on_error = on_error  # the worker stopped on an error: its streams' run is over
        #: max_fps with policy latest: each stream is served at most once per period
        self._period = 1.0 / options.max_fps if options.max_fps and options.policy == "latest" else 0.0
        self._timeout: float | None = None  # how long to wait for a wake-up before a paced stream is due
        #: one token per frame published (and per end, stop, swap): the worker blocks on it when idle
        self._signal: queue.SimpleQueue[bool] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._next = 0
        self._stopping = False
        self.invokes = 0
        # the watchdog's view: when the invoke in progress began (0: none), and how many frames it holds
        self.invoke_started = 0.0
        self._batch_frames = 0
        #: model updates and changes of the run's options, waiting for a batch boundary (pipeline/boundary.py)
        self.boundary = BatchBoundary(wake=self.wake, serving=lambda: self.running)
        #: which thread serves the streams: one whose epoch is stale was abandoned in a hung invoke
        self.epoch = 0
        self._owner = threading.Lock()
        #: threads stuck in a hung invoke: never joined
        self.abandoned_threads: list[threading.Thread] = []
        self.thread = self._new_thread(0)

    def _new_thread(self, epoch: int) -> threading.Thread:
        name = "edgeinfer-infer" if self._index == 0 else f"edgeinfer-infer-{self._index}"
        return threading.Thread(target=self._run, args=(epoch,), name=name, daemon=True)

    def _use(self, engine: Engine) -> None:
        """Serve the streams with ``engine`` from the next batch on (at start, a failover, a model update)."""
        self.engine = engine
        self.batch = batch_size(engine)
        self._decoders = self._decoders_for(engine)
        self._rows = [BatchRow(engine, b).input_view(0) for b in range(self.batch)]
        for stream in self.streams:
            stream.binding.replace(self.row())
        if self.watchdog is not None:
            self.watchdog.engine_changed()  # its own invokes set the bound again

    def _decoders_for(self, engine: Engine) -> list[Any]:
        """One decoder per batch row (a decoder reads its row's outputs; the transform comes from the stream)."""
        options = self._options
        return [read_model(BatchRow(engine, b), task=options.task, decoder=options.decoder,  # type: ignore[arg-type]
                           labels=self._labels, settings=self._settings, **options.feed_options()).decoder
                for b in range(self.batch)]

    def row(self) -> Engine:
        """What a stream's plans are built against: row 0 of the engine serving it."""
        return BatchRow(self.engine, 0)  # type: ignore[return-value]

    def _check(self, engine: Engine) -> None:
        """ValueError when a replacement engine cannot serve the streams' task."""
        for stream in self.streams[:1]:
            stream.binding.check(BatchRow(engine, 0))  # type: ignore[arg-type]

    # ------------------------------------------------------------------------ streams
    def wake(self) -> None:
        self._signal.put(True)

    def add(self, stream: Stream) -> None:
        with self._lock:
            self.streams = (*self.streams, stream)

    def remove(self, stream: Stream) -> None:
        with self._lock:
            self.streams = tuple(s for s in self.streams if s is not stream)

    # ------------------------------------------------------------------------ lifetime
    def start(self) -> None:
        """Serve the streams, watched for hung invokes (unless ``watchdog=False``)."""
        self.thread.start()
        if self._options.watchdog:
            self.watchdog = InvokeWatchdog(self._options, self.invoke_times, started=lambda: self.invoke_started,
                                           on_hang=self._on_hang).start()

    @property
    def running(self) -> bool:
        """Whether a thread serves the streams (one abandoned in a hung invoke does not count)."""
        thread = self.thread
        return thread.is_alive() and thread not in self.abandoned_threads

    def end(self) -> None:
        """Serve no more batches (the run is over); the thread leaves after the frame it is delivering."""
        self._stopping = True
        self.wake()

    def stop(self) -> None:
        self.end()
        if self.watchdog is not None:
            self.watchdog.stop()
        if self.running and self.thread is not threading.current_thread():
            self.thread.join(JOIN_TIMEOUT_S)

    def _run(self, epoch: int) -> None:
        try:
            while not self._stopping and epoch == self.epoch:
                if self.boundary.pending:
                    self.boundary.run()
                batch, took = self._collect()
                if not batch:
                    if not took:
                        self._idle()  # nothing ready (a frame answered without an invoke needs no wait)
                elif not self._infer(batch, epoch):
                    return  # abandoned while its invoke hung
                else:
                    self.failover.between_batches(self.engine, self._stopping)
        except BaseException as exc:
            if epoch == self.epoch:
                self._stopped_on(exc)
        finally:
            if epoch == self.epoch:
                self.boundary.run()  # asked for as the run ended (a model update): made all the same

    def _stopped_on(self, error: BaseException) -> None:
        """The worker cannot go on (no delegate left): its streams' run is over."""
        log.error("inference stopped: %s", error)
        self._on_error(error)

    def _idle(self) -> None:
        """No stream has a frame to serve: wait for one (the capture threads stage inputs meanwhile). A paced
        stream not due yet is not waited for: its capture thread leaves the frames it may drop undecoded."""
        streams = self.streams
        now = time.monotonic() if self._period else 0.0
        for stream in streams:
            stream.control.infer_idle = stream.next_due <= now
        try:
            self._signal.get(timeout=self._timeout)
        except queue.Empty:
            pass  # a paced stream is due
        for stream in streams:
            stream.control.infer_idle = False

    # ------------------------------------------------------------------------ the loop
    def _collect(self) -> tuple[list[Taken], bool]:
        """Up to a batch of ready frames, at most one per stream, starting after the stream served last; and
        whether anything was taken from a stream (a frame reused, skipped or a stream's end count too)."""
        streams = self.streams
        count = len(streams)
        batch: list[Taken] = []
        took = False
        start, period, signal = self._next, self._period, self._signal
        if period:
            now, self._timeout = time.monotonic(), None
        for offset in range(count):
            stream = streams[(start + offset) % count]
            if period and now < stream.next_due:  # paced (max_fps): its frame waits, newer ones replace it
                wait = stream.next_due - now
                self._timeout = wait if self._timeout is None else min(self._timeout, wait)
                continue
            ready = stream.ring.ready
            if ready.empty():
                continue
            try:
                slot = ready.get_nowait()
            except queue.Empty:  # ``latest``: the capture thread dropped it for a newer one meanwhile
                continue
            took = True
            if signal.qsize():
                signal.get()  # this frame's token (a spare one only costs a look at the streams)
            if slot is END:
                if not stream.ended:
                    stream.ended = True
                    self._on_end(stream)
                continue
            if period:
                stream.next_due = max(stream.next_due + period, now)
            taken = stream.take(slot, self._deliver)
            if taken is None:
                continue
            batch.append((stream, slot, *taken))
            self._next = (start + offset + 1) % count
            if len(batch) == self.batch:
                break
        return batch, took

    def _infer(self, batch: list[Taken], epoch: int) -> bool:
        """Preprocess, invoke and deliver one batch; False when this thread was abandoned meanwhile."""
        engine, rows, decoders = self.engine, self._rows, self._decoders  # a hang installs others for the next thread
        taken = _stage(batch, rows)
        try:
            return self._invoke(taken, epoch, engine, decoders)
        finally:
            for stream, *_, held in taken:
                if held is not None:
                    stream.ring.free.put(held)

    def _invoke(self, taken: list[tuple], epoch: int, engine: Engine, decoders: Any) -> bool:
        perf = time.perf_counter
        self._batch_frames = len(taken)
        t4 = self.invoke_started = perf()
        try:
            engine.invoke()
        except InferenceError as exc:
            if not self._returned(epoch):
                return False
            if isinstance(exc, InputMismatch):
                raise
            self.failover.failed(engine, exc, len(taken))  # DelegateFailed when there is no other delegate
            return True
        if not self._returned(epoch):
            return False
        self.invokes += 1
        t5 = perf()
        self.invoke_times.record((t5 - t4) * 1e3)
        for row, (stream, plan, frame_id, stamp, t0, t1, t2, t3, t3b, kept, held) in enumerate(taken):
            result = decoders[row](plan.transform)
            self._deliver(stream.answer(result, plan, frame_id, stamp, (t0, t1, t2, t3, t3b, t4, t5), kept,
                                        frame=held.frame if held is not None else None))
            if self._stopping:
                break  # the run ended (max_frames): the rest of the batch is not delivered
        return True

    # ------------------------------------------------------------------------ model updates
    def swap(self, engine: Engine, timeout: float = SWAP_TIMEOUT_S) -> Engine:
        """A model update: serve the streams with ``engine`` from the next batch on; the previous engine
        (now the caller's). ValueError, the run untouched, when it cannot serve them."""
        if engine is self.engine:
            return engine
        if engine.closed:
            raise ValueError("cannot swap in a closed engine")
        self._check(engine)
        replaced: list[Engine] = []

        def install() -> None:  # between two batches (or at once when no thread serves the streams)
            replaced.append(self.engine)
            self._install_update(self.engine, engine)
            log.info("swapped engine %s -> %s", replaced[0].description, engine.description)

        self.boundary.call(install, timeout)
        return replaced[0]

    def use_options(self, options: PipelineOptions) -> None:
        """Decode with ``options``' thresholds and pace with its max_fps from the next batch on (the engine's thread
        calls it, between two batches: ``boundary.call``)."""
        self._options, self._settings = options, options.decoder_settings()
        self._period = 1.0 / options.max_fps if options.max_fps and options.policy == "latest" else 0.0
        self._decoders = self._decoders_for(self.engine)

    def _install_update(self, old: Engine, new: Engine) -> None:
        self._use(new)
        self.failover.swapped(old, new)

    # ------------------------------------------------------------------------ hangs
    def _returned(self, epoch: int) -> bool:
        """An invoke returned: whether this thread still serves the streams (else it was abandoned)."""
        with self._owner:
            self.invoke_started = 0.0
            return epoch == self.epoch

    def _on_hang(self, started: float, bound: float) -> None:
        """Watchdog thread: the invoke that began at ``started`` is older than ``bound``; abandon its thread
        and engine, go on with the next delegate in a new thread (or end the run when there is none)."""
        waited = time.perf_counter() - started
        with self._owner:
            if self._stopping or self.invoke_started != started:
                return  # it returned meanwhile
            self.epoch += 1
            self.invoke_started = 0.0
            epoch = self.epoch
        engine = self.engine
        self.abandoned_threads.append(self.thread)
        hung = DelegateFailed(engine.description, f"an invoke did not return within {bound:.2f} s", hung=True)
        try:
            self.failover.hung(engine, hung, self._batch_frames, waited, bound)
        except DelegateFailed as exc:
            self._stopped_on(exc)
            return
        self.thread = self._new_thread(epoch)
        self.thread.start()
        self.wake()  # frames that arrived while the invoke hung


def _stage(batch: list[Taken], rows: Any) -> list[tuple]:
    """Each frame of ``batch`` into its row of the engine's input, and what its answer needs. A frame's buffer
    goes back to its ring here — unless the stream's evidence holds it until its result is answered (an
    event's snapshot is its own frame)."""
    import numpy as np

    perf = time.perf_counter
    taken = []
    for row, (stream, slot, plan, t3) in enumerate(batch):
        frame = slot.frame
        if slot.staged_gen == plan.gen:
            np.copyto(rows[row], plan.staged[slot.index])
        else:
            plan.pre(frame, rows[row])
        kept = frame.copy() if stream.keep_frames or stream.frame_wanted else None  # a live view's frame too
        held = slot if stream.holds_frames else None
        taken.append((stream, plan, slot.frame_id, slot.wall_time, slot.read_start, slot.read_end,
                      slot.staged_end, t3, perf(), kept, held))
        if held is None:
            stream.ring.free.put(slot)
    return taken
