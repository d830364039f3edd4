"""The ``edgeinfer-infer`` thread: the oldest ready frame into the engine, invoke, decode, deliver."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..errors import InferenceError, InputMismatch
from .ring import END
from .stats import FrameResult, StageTimings

if TYPE_CHECKING:
    from ..runtime.engine import Engine
    from .analytics import StreamAnalytics
    from .binding import ModelBinding
    from .control import RunControl
    from .decoding import SharedDecoding
    from .delivery import ResultDelivery
    from .events import StreamEvents
    from .motion import MotionGate
    from .options import PipelineOptions
    from .outputs import OutputSummary
    from .ring import FrameRing, Slot
    from .stats import StatsRing

log = logging.getLogger("edgeinfer.pipeline")


def reused_result(slot: Slot, result: object, taken_at: float | None = None, stream: str = "") -> FrameResult:
    """Motion gating: ``slot``'s frame answered with a previous ``result``, marked reused (its own frame id,
    times and capture stage; no preprocess, infer or postprocess). Read before the slot goes back to the ring."""
    t0, t1, t2 = slot.read_start, slot.read_end, slot.staged_end
    timings = StageTimings(capture=(t1 - t0) * 1e3, preprocess=0.0, infer=0.0, postprocess=0.0,
                           latency=(time.perf_counter() - t1) * 1e3,
                           queue=(taken_at - t2) * 1e3 if taken_at is not None else 0.0)
    return FrameResult(slot.frame_id, slot.wall_time, result, timings, stream=stream, reused=True)


class InferenceLoop:
    """Takes the oldest ready slot, writes the model input into the engine's input view (one memcpy of
    a staged input, or the whole preprocess), hands the slot back, invokes, decodes the outputs into
    a typed result and delivers it."""

    def __init__(self, ring: FrameRing, binding: ModelBinding, control: RunControl, stats: StatsRing,
                 delivery: ResultDelivery, options: PipelineOptions, *, finish: Callable[[], None]) -> None:
        self._ring = ring
        self._binding = binding
        self._control = control
        self._stats = stats
        self._delivery = delivery
        self._options = options
        self._finish = finish  # the end of the run: stop capture, release waiters
        #: set for sources that hand out compressed frames (see edgeinfer.pipeline.decoding)
        self.shared: SharedDecoding | None = None
        #: an invoke failed: ``on_failure(engine, error)`` puts another engine in the binding or raises
        self.on_failure: Callable[[Engine, InferenceError], None] | None = None
        #: perf_counter when the invoke in progress started; 0.0 when none runs (read by the watchdog)
        self.invoke_started = 0.0
        #: which thread owns the run: a thread whose epoch is stale was abandoned in a hung invoke
        self.epoch = 0
        self._owner = threading.Lock()
        #: the summary of what the pipeline answered (edgeinfer.pipeline.outputs), None to skip it
        self.outputs: OutputSummary | None = None
        #: motion gating (edgeinfer.pipeline.motion): None runs every frame
        self.motion: MotionGate | None = None
        #: tracking, lines and zones (edgeinfer.pipeline.analytics): detections get track ids here
        self.analytics: StreamAnalytics | None = None
        if options.motion_gate or options.tracking:  # imported only when asked for
            from .analytics import analytics_from_options
            from .motion import motion_gate_from_options

            self.motion = motion_gate_from_options(options)
            self.analytics = analytics_from_options(options)
        #: event rules and their evidence (edgeinfer.pipeline.events): None without rules
        self.events: StreamEvents | None = None
        if options.events:
            from .events import events_from_options

            self.events = events_from_options(options)
            if self.events is not None and self.analytics is not None:
                self.analytics.add_listener(self.events.on_analytics)

    def close_events(self) -> None:
        """The run ended: finish the recordings in progress (their post-roll is what there is)."""
        if self.events is not None:
            self.events.close()

    def abandon(self, started: float) -> bool:
        """Watchdog: give up on the thread whose invoke began at ``started``; False if it returned meanwhile."""
        with self._owner:
            if self.invoke_started != started:
                return False
            self.epoch += 1
            self.invoke_started = 0.0
            return True

    def _returned(self, epoch: int) -> bool:
        """An invoke returned: whether this thread still owns the run (else it was abandoned and must leave)."""
        with self._owner:
            self.invoke_started = 0.0
            return epoch == self.epoch

    def run(self, epoch: int = 0) -> None:
        """The thread's body: infer until the source ends, max_frames, stop() or an error."""
        perf = time.perf_counter
        try:
            self._loop(epoch)
        except BaseException as exc:
            if epoch == self.epoch:
                self._control.error = exc
                log.error("inference stopped: %s", exc)
        if epoch != self.epoch:
            log.warning("an abandoned inference thread returned from its hung invoke and leaves")
            return
        self._control.t_end = perf()
        self._finish()

    def _reuse(self, slot: Slot, result: object, t3: float, stopping: Callable[[], bool]) -> None:
        """Motion gating: deliver ``slot``'s frame with the previous frame's result, marked reused."""
        reused = reused_result(slot, result, t3)
        self._ring.free.put(slot)
        self._control.reused += 1
        self._control.frames += 1
        self._delivery.deliver(reused, stopping)

    def _loop(self, epoch: int) -> None:
        import numpy as np

        perf = time.perf_counter
        ring, binding, control, shared = self._ring, self._binding, self._control, self.shared
        ready, free = ring.ready, ring.free
        record, deliver = self._stats.record, self._delivery.deliver
        options = self._options
        period = 1.0 / options.max_fps if options.max_fps and options.policy == "latest" else 0.0
        next_due = 0.0
        max_frames = options.max_frames
        keep_frames = options.keep_frames
        copyto = np.copyto
        outputs = self.outputs
        gate = self.motion
        analytics = self.analytics
        events = self.events
        check_events = events.check if events is not None and events.wants_results else None
        last_gen, last_result = -1, None  # the result a frame that did not change reuses, and its plan

        def stopping() -> bool:
            return control.stop_requested

        while not control.stop_requested:
            if period:
                next_due = control.pace(next_due, period)
                if next_due < 0:
                    break
            control.infer_idle = ready.empty()
            slot = ready.get()
            control.infer_idle = False
            if slot is END:
                break
            if shared is not None:
                shared.await_decoded(slot)
                if slot.decode_failed:
                    free.put(slot)  # a damaged frame: skipped (the source counts it)
                    continue
            t3 = perf()
            if binding.swap_pending:
                binding.apply_pending_swap()
            frame = slot.frame
            plan = binding.plan_for(frame.shape, slot.native)
            if events is not None:
                events.offer(frame, slot.frame_id, slot.wall_time)
            if gate is not None and not gate.changed(frame) and last_gen == plan.gen:
                self._reuse(slot, last_result, t3, stopping)
                if max_frames is not None and control.frames >= max_frames:
                    break
                continue
            if slot.staged_gen == plan.gen:
                copyto(plan.view, plan.staged[slot.index])
            else:
                plan.pre(frame, plan.view)
            kept = frame.copy() if keep_frames else None
            frame_id, t0, t1, t2, stamp = slot.frame_id, slot.read_start, slot.read_end, slot.staged_end, slot.wall_time
            free.put(slot)
            t4 = self.invoke_started = perf()
            try:
                plan.engine.invoke()
            except InferenceError as exc:
                if not self._returned(epoch):
                    return
                if self.on_failure is None or isinstance(exc, InputMismatch):
                    raise
                self.on_failure(plan.engine, exc)  # the frame is lost; the next one runs on the next delegate
                continue
            if not self._returned(epoch):
                return
            t5 = perf()
            result = plan.decoder(plan.transform)
            if analytics is not None:
                result = analytics.process(result, frame_id, stamp)
            if check_events is not None:
                check_events(result, frame_id, stamp)
            t6 = perf()
            if outputs is not None:
                outputs.observe(result)
            last_gen, last_result = plan.gen, result
            if shared is not None:
                shared.note_inference(t6 - t3)
            timings = StageTimings(
                capture=(t1 - t0) * 1e3, preprocess=((t2 - t1) + (t4 - t3)) * 1e3, infer=(t5 - t4) * 1e3,
                postprocess=(t6 - t5) * 1e3, latency=(t6 - t1) * 1e3, queue=(t3 - t2) * 1e3,
            )
            record(timings)
            control.frames += 1
            deliver(FrameResult(frame_id, stamp, result, timings, kept), stopping)
            if max_frames is not None and control.frames >= max_frames:
                break
