"""One source of a run: its frame ring, its capture thread, and everything a run keeps per source.

A :class:`Stream` is what :class:`~.multi.MultiPipeline` (and so :class:`~.core.Pipeline`, a run of
one stream) holds for each source: the source, the ring of preallocated slots, the
``edgeinfer-capture`` thread (:class:`~.capture_loop.CaptureLoop`) that reads frames into the ring and
stages their model inputs, the :class:`~.binding.ModelBinding` that builds the plan for its frame
size, and what the engine's thread (:class:`~.engine_worker.EngineWorker`) does per frame of this
stream: motion gating, shared decoding of frames published compressed, tracking, lines and zones,
event rules and their evidence, the output summary, kept frames, counters and stage timings.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Any

from .binding import ModelBinding
from .capture_loop import CaptureLoop
from .control import RunControl
from .decoding import SharedDecoding
from .outputs import OutputSummary
from .ring import FrameRing
from .stats import FrameResult, PipelineStats, StageTimings, StatsRing, StatsWindow, window_stats
from .stream_parts import analytics_part, events_part, sampler_part, wire

if TYPE_CHECKING:
    from collections.abc import Callable

    from ..capture import FrameSource
    from ..runtime.engine import Engine
    from .analytics import StreamAnalytics
    from .binding import InferencePlan
    from .events import StreamEvents
    from .labels import Labels
    from .motion import MotionGate
    from .options import PipelineOptions
    from .record import RecordSource
    from .ring import Slot
    from .sampling import StreamSampler
    from .tasks import Task

log = logging.getLogger("edgeinfer.pipeline")

#: seconds stop() waits for the capture thread
JOIN_TIMEOUT_S = 30.0


class Stream:
    """One source of a run, served by an engine's thread: ring, capture thread, per-stream state and stats."""

    def __init__(self, name: str, source: FrameSource, owns_source: bool, *, row: Engine, task: Task,
                 options: PipelineOptions, labels: Labels | None, wake: Callable[[], None],
                 callback_errors: Callable[[], int]) -> None:
        self.name = name
        self.source = source
        self.owns_source = owns_source
        self.ring = FrameRing(options.queue_size)
        self.control = RunControl()
        self.stats_ring = StatsRing(options.stats_window)
        self.window = StatsWindow()
        #: the plans for this stream's frames, against row 0 of the engine serving it
        self.binding = ModelBinding(row, task=task, options=options, labels=labels, source=source,
                                    slots=len(self.ring.slots))
        self.binding.check(row)
        self.binding.offer_input_size(row)
        self.capture = CaptureLoop(source, self.ring, self.binding, self.control, options, wake=wake)
        #: frames published still compressed are decoded by whichever thread gets to them first
        self.shared: SharedDecoding | None = None
        if source.defers_decode:
            self.shared = SharedDecoding(source, self.ring, latest=options.policy == "latest",
                                         stage=self.capture.stage)
            self.capture.shared = self.shared
        self.keep_frames = options.keep_frames
        #: a live view (pipeline/live.py) waits for a frame: the next result carries a copy (set by the view,
        #: cleared once it has one), so a stream nobody watches copies nothing
        self.frame_wanted = False
        self.outputs = OutputSummary()
        self.gate: MotionGate | None = None
        self.analytics: StreamAnalytics | None = None
        self.events: StreamEvents | None = None
        #: the capture rules (options.capture with a capture_dir): frames kept with the model's output
        self.sampler: StreamSampler | None = None
        #: where the evidence's frames come from when not this stream's source (options.record_source)
        self.record: RecordSource | None = None
        #: frames per second of a file's own time (frame_id / fps is a frame's time in it); None: live, wall time
        self.file_fps = source.fps if not source.live and source.fps else None
        self._add_parts(options)
        self.thread: threading.Thread | None = None
        #: the engine's thread has taken this stream's end (its source ended, failed, or the stream stopped)
        self.ended = False
        self.next_due = 0.0  # max_fps with ``latest``: when the engine's thread serves this stream next
        self.last: tuple[int, Any] = (-1, None)  # (plan generation, result) a frame that did not change reuses
        self.callback_errors = callback_errors  # the run's callback failures (its delivery), for the stats

    @classmethod
    def open(cls, name: str, source: Any, options: PipelineOptions, **parts: Any) -> Stream:
        """Open ``source`` (anything :func:`~edgeinfer.capture.open_source` takes; a FrameSource stays the
        caller's) as a stream (``parts``: the constructor's keywords); the source is closed again when the model
        cannot take its frames."""
        from ..capture import FrameSource, open_source

        owns = not isinstance(source, FrameSource)
        opened = open_source(source, size=options.size, fps=options.fps, fourcc=options.fourcc, loop=options.loop,
                             backoff=options.backoff, reduced=options.decode_reduced)
        try:
            return cls(name, opened, owns, options=options, **parts)
        except BaseException:
            if owns:
                opened.close()
            raise

    def _add_parts(self, options: PipelineOptions) -> None:
        """Motion gating, tracking, events, capture rules: imported only when asked for (pipeline/stream_parts.py)."""
        if options.motion_gate:
            from .motion import motion_gate_from_options

            self.gate = motion_gate_from_options(options)
        self.analytics = analytics_part(self.source, options)
        self.events = events_part(self.name, options)
        if options.record_source is not None and self.events is not None and self.events.recorder is not None:
            from .record import RecordSource

            if self.name:  # one option, one camera: the several streams of a run would share it
                raise ValueError("record_source goes with a run of one stream (source:, not sources:)")
            self.record = self.events.record = RecordSource.open(options.record_source, options, self.name)
        self.sampler = sampler_part(self.name, options)
        wire(self.analytics, self.events, self.sampler)

    @property
    def holds_frames(self) -> bool:
        """Whether the engine's thread keeps a frame's buffer until its result is answered: an event's
        snapshot is the frame it was decided on (the buffer is only copied when one fires)."""
        return (self.events is not None and self.events.recorder is not None) or self.sampler is not None

    def source_time(self, frame_id: int, wall_time: float) -> float:
        """A frame's time in the source's own clock: its place in a file (read at any speed), the capture
        time of a live source's frame. The evidence's pre- and post-roll are measured in it."""
        fps = self.file_fps
        return frame_id / fps if fps else wall_time

    # ------------------------------------------------------------------------ in the engine's thread
    def take(self, slot: Slot, deliver: Callable[[FrameResult], None]) -> tuple[InferencePlan, float] | None:
        """A ready frame of this stream: decoded (if it came compressed), offered to the event rules, gated.
        Its plan and when it was taken (perf_counter); None when it needs no invoke — a damaged frame
        (skipped), or an unchanged one (the previous result delivered for it, marked reused)."""
        shared = self.shared
        if shared is not None:
            shared.await_decoded(slot)
            if slot.decode_failed:
                self.ring.free.put(slot)  # a damaged frame: skipped (the source counts it)
                return None
        taken_at = time.perf_counter()
        frame = slot.frame
        plan = self.binding.plan_for(frame.shape, slot.native)
        if self.events is not None:
            self.events.offer(frame, slot.frame_id, self.source_time(slot.frame_id, slot.wall_time))
        gate = self.gate
        if gate is not None and not gate.changed(frame) and self.last[0] == plan.gen:
            reused = reused_result(slot, self.last[1], taken_at, stream=self.name)
            self.ring.free.put(slot)
            self.control.reused += 1
            self.control.frames += 1
            deliver(reused)
            return None
        return plan, taken_at

    def answer(self, result: Any, plan: InferencePlan, frame_id: int, stamp: float,
               times: tuple[float, float, float, float, float, float, float], kept: Any,
               frame: Any = None) -> FrameResult:
        """A frame's decoded ``result`` through tracking, lines and zones and the event rules, counted in the
        output summary and the stage timings: its FrameResult. ``times`` (perf_counter): reading began, the
        frame was read, staged, taken, put into the engine; the invoke began, ended. ``frame``: the frame itself
        while its buffer is held (:attr:`holds_frames`), for the snapshot of an event it fires."""
        t0, t1, t2, t3, t3b, t4, t5 = times
        events = self.events
        if events is not None and frame is not None:
            events.hold(frame, frame_id, self.source_time(frame_id, stamp))
        if self.analytics is not None:
            result = self.analytics.process(result, frame_id, stamp)
        if events is not None:
            if events.wants_results:
                events.check(result, frame_id, stamp, source_time=self.source_time(frame_id, stamp))
            events.release(result)
        if self.sampler is not None:  # a few comparisons; a copy only for a frame a rule keeps
            self.sampler.check(result, frame, frame_id, self.source_time(frame_id, stamp))
        t6 = time.perf_counter()
        self.outputs.observe(result)
        self.last = (plan.gen, result)
        if self.shared is not None:
            self.shared.note_inference(t6 - t3)
        timings = StageTimings(capture=(t1 - t0) * 1e3, preprocess=((t2 - t1) + (t3b - t3)) * 1e3,
                               infer=(t5 - t4) * 1e3, postprocess=(t6 - t5) * 1e3, latency=(t6 - t1) * 1e3,
                               queue=(t3 - t2) * 1e3)
        self.stats_ring.record(timings)
        self.control.frames += 1
        return FrameResult(frame_id, stamp, result, timings, kept, self.name)

    # ------------------------------------------------------------------------ lifetime
    @property
    def thread_name(self) -> str:
        return f"edgeinfer-capture-{self.name}" if self.name else "edgeinfer-capture"

    def start(self) -> None:
        self.control.begin()
        self.window.start(self.control.t_start)
        self.source.resume()
        if self.record is not None:
            self.record.start()
        self.thread = threading.Thread(target=self.capture.run, name=self.thread_name, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        """Stop capturing and wait for the capture thread."""
        self.control.request_stop()
        self.source.interrupt()
        self.ring.end()  # wake a capture thread waiting for a slot
        thread = self.thread
        if thread is not None and thread is not threading.current_thread() and thread.is_alive():
            thread.join(JOIN_TIMEOUT_S)
            if thread.is_alive():
                log.warning("thread %s did not stop within %g s (blocked in a device read?)", thread.name,
                            JOIN_TIMEOUT_S)

    def finish(self) -> None:
        """The engine's thread has taken the stream's last frame: the run of this stream is over."""
        self.control.t_end = time.perf_counter()
        self.control.finished.set()
        self.close_events()

    def close_events(self) -> None:
        """Finish the recordings in progress (their post-roll is what there is)."""
        if self.events is not None:
            self.events.close()
        if self.sampler is not None:
            self.sampler.close()

    def close_source(self) -> None:
        """Close the source if the stream opened it — not under a capture thread still blocked in a read."""
        thread = self.thread
        if thread is not None and thread.is_alive():
            # releasing a device under a thread still blocked in its read() can crash the driver: leak it
            log.warning("not closing %s: the capture thread is still blocked in it", self.source.description)
        elif self.owns_source:
            self.source.close()
        if self.record is not None:
            self.record.close()

    @property
    def error(self) -> BaseException | None:
        """What stopped this stream's capture; None when it ended normally or still runs."""
        return self.control.error

    # ------------------------------------------------------------------------ statistics
    def stats(self, engine: Engine, delegate_fields: dict[str, Any]) -> PipelineStats:
        """Since the stream started."""
        control = self.control
        return self._stats_of(0, self.stats_ring.count, control.dropped, control.reused,
                              control.elapsed(control.t_start > 0), None, engine, delegate_fields)

    def take_window(self, engine: Engine, delegate_fields: dict[str, Any]) -> PipelineStats:
        """Since the previous call (or the start), with the window's output summary: for telemetry."""
        control = self.control
        first, last, dropped, reused, elapsed = self.window.take(self.stats_ring.count, control.dropped,
                                                                 control.reused, control.now())
        return self._stats_of(first, last, dropped, reused, elapsed if control.t_start > 0 else 0.0,
                              self.outputs.take(), engine, delegate_fields)

    def _stats_of(self, first: int, last: int, dropped: int, reused: int, elapsed: float,
                  outputs: dict[str, Any] | None, engine: Engine, delegate_fields: dict[str, Any]) -> PipelineStats:
        analytics = self.analytics
        return window_stats(self.stats_ring, first, last, dropped=dropped, reused=reused, elapsed=elapsed,
                            source=self.source, delegate=engine.description, callback_errors=self.callback_errors(),
                            outputs=outputs, analytics=analytics.counts() if analytics is not None else None,
                            **delegate_fields)


def reused_result(slot: Slot, result: object, taken_at: float, stream: str = "") -> FrameResult:
    """Motion gating: ``slot``'s frame answered with a previous ``result``, marked reused (its own frame id,
    times and capture stage; no preprocess, infer or postprocess). Read before the slot goes back to the ring."""
    t0, t1, t2 = slot.read_start, slot.read_end, slot.staged_end
    timings = StageTimings(capture=(t1 - t0) * 1e3, preprocess=0.0, infer=0.0, postprocess=0.0,
                           latency=(time.perf_counter() - t1) * 1e3, queue=(taken_at - t2) * 1e3)
    return FrameResult(slot.frame_id, slot.wall_time, result, timings, stream=stream, reused=True)
