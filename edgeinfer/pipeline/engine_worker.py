"""The engine side of a multi-stream run: one thread serving its streams round-robin, a batch per invoke.

:class:`EngineWorker` (thread ``edgeinfer-engine-<n>``) takes ready frames round-robin — after serving a
stream it looks at the next one first, so no stream starves — and, when the engine's input has a batch
dimension larger than one, frames of several streams go into one invoke, each into its own
:class:`BatchRow` of the input tensor and decoded from its own row of the outputs. Used by
:class:`~.multi.MultiPipeline`.

An invoke that raises goes on with the plan's next delegate (:mod:`.multi_failover`); one that hangs is
seen by the worker's :class:`~.watchdog.InvokeWatchdog`, which abandons the thread stuck in it (an epoch:
if the call ever returns, that thread leaves without delivering) and starts a new one on the next delegate.
"""

from __future__ import annotations

import dataclasses
import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from ..errors import DelegateFailed, EdgeInferError, InferenceError, InputMismatch
from ..runtime.engine import Engine
from .infer_loop import reused_result
from .labels import Labels
from .multi_failover import WorkerFailover
from .options import PipelineOptions
from .ring import END
from .stats import FrameResult, StageTimings, StatsRing
from .tasks import get_task
from .watchdog import RECENT_INVOKES, InvokeWatchdog

#: a :class:`~.multi.Stream` (its ring, binding, stats, gate, analytics, events); not imported: multi imports this
Stream = Any

log = logging.getLogger("edgeinfer.pipeline")

#: seconds stop() waits for the worker's thread
JOIN_TIMEOUT_S = 30.0
#: seconds a model update waits for the worker to finish its batch
SWAP_TIMEOUT_S = 30.0


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

    def __init__(self, engine: Engine, owns_engine: bool, options: PipelineOptions, labels: Labels | None,
                 deliver: Callable[[FrameResult], None], index: int, on_end: Callable[[Stream], None],
                 on_error: Callable[[BaseException], None] | None = None) -> None:
        self.owns_engine = owns_engine
        self.task = get_task(options.task)
        self._labels, self._settings = labels, options.decoder_settings()
        self.streams: tuple[Stream, ...] = ()
        self.watchdog: InvokeWatchdog | None = None  # started with the worker (start())
        self._use(engine)
        # an invoke that fails: the plan's next delegate serves every stream of this worker
        self.failover = WorkerFailover(engine, options, check=self._check, install=self._use)
        if owns_engine:
            self.failover.loaded.append(engine)
        self._deliver = deliver
        self._on_end = on_end  # a stream's source has no more frames
        self._on_error = on_error  # the worker stopped on an error: its streams' run is over
        #: max_fps with policy latest: each stream is served at most once per period
        self._period = 1.0 / options.max_fps if options.max_fps and options.policy == "latest" else 0.0
        self._timeout: float | None = None  # how long to wait for a wake-up before a paced stream is due
        self._signal = threading.Semaphore(0)
        self._lock = threading.Lock()
        self._next = 0
        self._stopping = False
        self.invokes = 0
        self.error: BaseException | None = None
        self._options, self._index = options, index
        # the watchdog's view: when the invoke in progress began (0: none), and the recent invoke times
        self.invoke_started = 0.0
        self.invoke_stats = StatsRing(RECENT_INVOKES)
        self._batch_frames = 0
        self._swap: tuple[Engine, threading.Event] | None = None  # a model update waiting for a batch boundary
        #: which thread serves the streams: one whose epoch is stale was abandoned in a hung invoke
        self.epoch = 0
        self._owner = threading.Lock()
        #: threads stuck in a hung invoke: never joined
        self.abandoned_threads: list[threading.Thread] = []
        self.thread = self._new_thread(0)

    def _new_thread(self, epoch: int) -> threading.Thread:
        return threading.Thread(target=self._run, args=(epoch,), name=f"edgeinfer-engine-{self._index}", daemon=True)

    def _use(self, engine: Engine) -> None:
        """Serve the streams with ``engine`` from the next batch on (at start, and after a failover)."""
        self.engine = engine
        self.batch = batch_size(engine)
        # one decoder per batch row (a decoder reads its row's outputs; the transform comes from the stream)
        self._decoders = [self.task.decoder(BatchRow(engine, b), self._labels, self._settings)  # type: ignore[arg-type]
                          for b in range(self.batch)]
        self._rows = [BatchRow(engine, b).input_view(0) for b in range(self.batch)]
        for stream in self.streams:
            stream.binding.replace(BatchRow(engine, 0))  # type: ignore[arg-type]
            stream.binding.owns_engine = False
        if self.watchdog is not None:
            self.watchdog.engine_changed()  # its own invokes set the bound again

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

    def start(self) -> None:
        """Serve the streams, watched for hung invokes (unless ``watchdog=False``)."""
        self.thread.start()
        if self._options.watchdog:
            self.watchdog = InvokeWatchdog(self._options, self.invoke_stats, started=lambda: self.invoke_started,
                                           on_hang=self._on_hang, on_tick=lambda: None).start()

    @property
    def running(self) -> bool:
        """Whether a thread serves the streams (one abandoned in a hung invoke does not count)."""
        thread = self.thread
        return thread.is_alive() and thread not in self.abandoned_threads

    def stop(self) -> None:
        self._stopping = True
        self.wake()
        if self.watchdog is not None:
            self.watchdog.stop()
        if self.running and self.thread is not threading.current_thread():
            self.thread.join(JOIN_TIMEOUT_S)

    def _run(self, epoch: int) -> None:
        try:
            while True:
                self._signal.acquire(timeout=self._timeout)
                if self._stopping or epoch != self.epoch:
                    return
                self._apply_swap()
                batch = self._collect()
                if batch and not self._infer(batch, epoch):
                    return  # abandoned while its invoke hung
                self.failover.between_batches(self.engine, self._stopping)
        except BaseException as exc:
            if epoch == self.epoch:
                self._stopped_on(exc)

    def _stopped_on(self, error: BaseException) -> None:
        """The worker cannot go on (no delegate left): its streams' run is over."""
        self.error = error
        log.error("engine worker stopped: %s", error)
        if self._on_error is not None:
            self._on_error(error)

    def swap(self, engine: Engine, timeout: float = SWAP_TIMEOUT_S) -> Engine:
        """A model update: serve the streams with ``engine`` from the next batch on; the previous engine
        (now the caller's). ValueError, the run untouched, when it cannot serve them."""
        if engine is self.engine:
            return engine
        if engine.closed:
            raise ValueError("cannot swap in a closed engine")
        self._check(engine)
        old = self.engine
        if not self.running:
            self._install_update(old, engine)
            return old
        done = threading.Event()
        with self._lock:
            self._swap = (engine, done)
        self.wake()
        if not done.wait(timeout):
            with self._lock:
                if self._swap is not None and self._swap[0] is engine:
                    self._swap = None
                    raise EdgeInferError(f"the engine's thread did not reach a batch boundary within {timeout:g} s")
            done.wait()
        return old

    def _apply_swap(self) -> None:
        """Worker thread, between two batches: put a waiting model update in place."""
        with self._lock:
            request, self._swap = self._swap, None
        if request is not None:
            engine, done = request
            old = self.engine
            self._install_update(old, engine)
            log.info("swapped engine %s -> %s", old.description, engine.description)
            done.set()

    def _install_update(self, old: Engine, new: Engine) -> None:
        self._use(new)
        self.failover.swapped(old, new)

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

    def _collect(self) -> list[tuple[Stream, Any]]:
        """Up to a batch of ready frames, at most one per stream, starting after the stream served last."""
        streams = self.streams
        count = len(streams)
        batch: list[tuple[Stream, Any]] = []
        start = self._next
        now, self._timeout = time.monotonic(), None
        for offset in range(count):
            stream = streams[(start + offset) % count]
            if self._period and now < stream.next_due:  # paced (max_fps): its frame waits, newer ones replace it
                wait = stream.next_due - now
                self._timeout = wait if self._timeout is None else min(self._timeout, wait)
                continue
            try:
                slot = stream.ring.ready.get_nowait()
            except queue.Empty:
                continue
            if slot is END:
                if not stream.ended:
                    stream.ended = True
                    self._on_end(stream)
                continue
            if self._period:
                stream.next_due = max(stream.next_due + self._period, now)
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

    def _infer(self, batch: list[tuple[Stream, Any]], epoch: int) -> bool:
        """Preprocess, invoke and deliver one batch; False when this thread was abandoned meanwhile."""
        import numpy as np

        perf = time.perf_counter
        engine, rows, decoders = self.engine, self._rows, self._decoders  # a hang installs others for the next thread
        taken = []
        for row, (stream, slot) in enumerate(batch):
            t3 = perf()
            frame = slot.frame
            plan = stream.binding.plan_for(frame.shape, slot.native)
            if slot.staged_gen == plan.gen:
                np.copyto(rows[row], plan.staged[slot.index])
            else:
                plan.pre(frame, rows[row])
            taken.append((stream, plan, slot.frame_id, slot.wall_time, slot.read_start, slot.read_end,
                          slot.staged_end, t3, perf()))
            stream.ring.free.put(slot)
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
        for row, (stream, plan, frame_id, stamp, t0, t1, t2, t3, t3b) in enumerate(taken):
            result = decoders[row](plan.transform)
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
            if row == 0:
                self.invoke_stats.record(timings)  # the batch's invoke time, for the watchdog's bound
            stream.control.frames += 1
            self._deliver(FrameResult(frame_id, stamp, result, timings, stream=stream.name))
        return True
