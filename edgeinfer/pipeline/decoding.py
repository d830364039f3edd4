"""Frames published still compressed, decoded by whichever pipeline thread gets to them first.

Sources that split reading from decoding (MJPEG files and HTTP streams, ``defers_decode``) hand out
compressed frames. The capture thread publishes each one in order, and then decodes it itself, or
the inference thread does when it would otherwise wait for that frame. A decode-bound run thus
decodes on two cores, still in frame order; under ``latest`` the frames dropped for newer ones are
never decoded at all.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..capture import FrameSource
    from .ring import FrameRing, Slot

#: weight of the newest sample in the moving averages of decode and inference times
SMOOTHING = 0.1


class SharedDecoding:
    """Who decodes which compressed frame, and the moving averages that decide it."""

    def __init__(self, source: FrameSource, ring: FrameRing, *, latest: bool,
                 stage: Callable[[Slot, Any, float], float]) -> None:
        self._source = source
        self._ring = ring
        self._latest = latest
        self._stage = stage  # the capture thread's staged preprocessing
        #: moving averages (s) of decoding one frame and of the inference thread's work on one frame
        self.decode_s = 0.0
        self.infer_s = 0.0
        #: frames the inference thread decoded itself while it would have waited (decode-bound runs)
        self.decoded_by_inference = 0

    def note_inference(self, seconds: float) -> None:
        """Inference thread: it spent ``seconds`` on one frame (preprocess, invoke, decode outputs)."""
        self.infer_s += SMOOTHING * (seconds - self.infer_s)

    def decode_next(self, in_capture: bool) -> bool:
        """Decode the oldest published frame that no thread has taken yet; False when there is none."""
        slot = self._ring.claim_oldest()
        if slot is None:
            return False
        self.decode(slot, in_capture)
        return True

    def claim_for_inference(self, needed: Slot) -> Slot | None:
        """The frame the inference thread should decode while ``needed`` is not ready, or None to wait.

        ``needed`` itself when no thread has taken it yet. A later frame only when decoding is the
        bottleneck (decoding takes longer than inferring, on average): otherwise the capture thread
        keeps ahead by itself, and a decode here would only delay the next inference.
        """
        ring = self._ring
        with ring.claim_lock:
            undecoded = ring.undecoded
            if not undecoded:
                return None
            if undecoded[0] is not needed and (self._latest or self.decode_s <= self.infer_s):
                return None
            return undecoded.popleft()

    def decode(self, slot: Slot, in_capture: bool) -> None:
        """Decode ``slot``'s compressed frame into its buffer (and stage it, in the capture thread)."""
        perf = time.perf_counter
        try:
            started = perf()
            packet, slot.encoded = slot.encoded, None
            buffer = slot.frame
            frame = self._source.decode(packet, buffer)
            t1 = perf()
            self.decode_s += SMOOTHING * ((t1 - started) - self.decode_s)
            slot.decode_failed = frame is None
            if frame is None:
                return
            if frame is not buffer:
                slot.frame = frame
            slot.native = self._source.native_size  # this thread's last decode
            staged_end = self._stage(slot, frame, t1) if in_capture else t1
            # capture time = reading the packet + decoding it, wherever that happened
            slot.read_start = t1 - (slot.read_end - slot.read_start) - (t1 - started)
            slot.read_end = t1
            slot.staged_end = staged_end
            if not in_capture:
                slot.staged_gen = -1
                self.decoded_by_inference += 1
        finally:
            slot.decode_lock.release()

    def await_decoded(self, slot: Slot) -> None:
        """Inference thread: make sure ``slot`` is decoded, decoding it or a later frame meanwhile."""
        lock = slot.decode_lock
        while not lock.acquire(blocking=False):
            claimed = self.claim_for_inference(slot)
            if claimed is None:
                lock.acquire()  # the capture thread is decoding it: wait
                break
            self.decode(claimed, in_capture=False)
        lock.release()
