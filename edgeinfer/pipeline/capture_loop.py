"""The ``edgeinfer-capture`` thread of a stream: frames from the source into the ring, staged, published in order.

Each published frame (and the end) also wakes the engine's thread serving the stream (``wake``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from ..errors import CaptureError
from .ring import END

if TYPE_CHECKING:
    from ..capture import FrameSource
    from .binding import ModelBinding
    from .control import RunControl
    from .decoding import SharedDecoding
    from .options import PipelineOptions
    from .ring import FrameRing, Slot

log = logging.getLogger("edgeinfer.pipeline")


class CaptureLoop:
    """Reads each frame into a free slot and, unless the engine's thread waits for it, preprocesses
    it into the slot's staged model input ("staged" preprocessing) before publishing it."""

    def __init__(self, source: FrameSource, ring: FrameRing, binding: ModelBinding, control: RunControl,
                 options: PipelineOptions, *, wake: Callable[[], None]) -> None:
        self._source = source
        self._ring = ring
        self._binding = binding
        self._control = control
        self._options = options
        self._latest = options.policy == "latest"
        self._wake = wake  # the engine's thread: a frame (or the end) is ready
        #: set for sources that hand out compressed frames (see edgeinfer.pipeline.decoding)
        self.shared: SharedDecoding | None = None

    def use_options(self, options: PipelineOptions) -> None:
        """Pace with ``options``' max_fps from the next frame on (a run's options changed: pipeline/live_options.py)."""
        self._options = options

    def run(self) -> None:
        """The thread's body: capture until the source ends, stop() or an error."""
        try:
            if self.shared is not None:
                self._capture_encoded(self.shared)
            else:
                self._capture_decoded()
        except CaptureError as exc:
            self._control.error = exc
            log.error("capture stopped: %s", exc)
        except BaseException as exc:
            self._control.error = exc
            log.exception("capture thread failed")
        finally:
            self._ring.ready.put(END)
            self._wake()

    def _free_slots(self) -> Iterator[Slot]:
        """Free ring slots, one at a time, until stop() or the ring is closed.

        max_fps with `every` (files) paces the reading here, so frames do not wait in the ring and
        the latency figure stays honest. With `latest` (live sources) the inference thread paces and
        the newest frame wins.
        """
        control = self._control
        next_due = 0.0
        free = self._ring.free
        while not control.stop_requested:
            max_fps = self._options.max_fps  # read each frame: the run's options may change (pipeline/live_options.py)
            period = 1.0 / max_fps if max_fps and not self._latest else 0.0
            if period:
                next_due = control.pace(next_due, period)
                if next_due < 0:
                    return
            slot = free.get()
            if slot is END:
                return
            yield slot

    def stage(self, slot: Slot, frame: Any, now: float) -> float:
        """Preprocess ``frame`` into the slot's staged input when this thread should; the time after.

        Greedy balance: preprocess in the capture thread unless the inference thread sits waiting
        for this frame (then it has the time, and the frame reaches it sooner). Decode-bound runs
        thus preprocess in the inference thread, inference-bound runs here, balanced ones mix.
        """
        plan = self._binding.plan
        place = self._options.preprocess_in
        if (plan is not None and plan.fits(frame.shape, slot.native) and place != "inference"
                and (place == "capture" or not self._control.infer_idle)):
            plan.pre_staged(frame, plan.staged[slot.index])
            slot.staged_gen = plan.gen
            return time.perf_counter()
        slot.staged_gen = -1
        return now

    def _publish(self, slot: Slot) -> None:
        if self._latest:
            self._control.dropped += self._ring.drop_stale()
        self._ring.ready.put(slot)
        self._wake()

    def _capture_decoded(self) -> None:
        """Sources that deliver decoded frames: read into the ring, stage, publish."""
        perf = time.perf_counter
        wall = time.time
        source = self._source
        for frame_id, slot in enumerate(self._free_slots()):
            t0 = perf()
            buffer = slot.frame
            frame = source.read(buffer)
            if frame is None:
                self._ring.free.put(slot)
                break
            t1 = perf()
            if frame is not buffer:  # first pass through the ring, or the frame size changed
                slot.frame = frame
            slot.native = source.native_size
            slot.staged_end = self.stage(slot, frame, t1)
            slot.frame_id, slot.read_start, slot.read_end, slot.wall_time = frame_id, t0, t1, wall()
            self._publish(slot)

    def _capture_encoded(self, shared: SharedDecoding) -> None:
        """Sources that hand out frames still compressed (MJPEG files and HTTP streams).

        Each frame is published in order as soon as it is read, and decoded by whichever thread
        gets to it first: this one, right after publishing, or the inference thread when it would
        otherwise wait for it. Under ``every`` a decode-bound run thus decodes on two cores, still
        in frame order, and an inference-bound one decodes here, ahead of the inference thread.
        Under ``latest`` this thread decodes only while the inference thread waits for a frame;
        otherwise frames wait compressed, and the ones dropped for newer ones are never decoded.
        """
        perf = time.perf_counter
        wall = time.time
        source = self._source
        ring = self._ring
        control = self._control
        for frame_id, slot in enumerate(self._free_slots()):
            t0 = perf()
            packet = source.read_encoded()
            if packet is None:
                ring.free.put(slot)
                break
            slot.frame_id, slot.read_start, slot.read_end, slot.staged_end, slot.wall_time = (
                frame_id, t0, perf(), 0.0, wall())
            ring.publish_compressed(slot, packet)
            self._publish(slot)
            if self._latest:
                if control.infer_idle:  # it waits for this very frame: decode it now
                    shared.decode_next(in_capture=True)
                continue
            # keep one more frame published ahead, for an idle inference thread to decode meanwhile
            if len(ring.undecoded) < 2 and ring.free.qsize():
                continue
            shared.decode_next(in_capture=True)
