"""The ring of preallocated frame slots and the queues that hand them between the two threads.

A :class:`Slot` is one frame buffer plus everything known about the frame in it. Slots move
between the capture and the inference thread through two ``queue.SimpleQueue`` (``free`` and
``ready``), which block without polling and allocate nothing per frame; ``None`` in a queue means
"the run ends". Frames published still compressed wait in ``undecoded`` until a thread claims them.
"""

from __future__ import annotations

import queue
import threading
from collections import deque
from typing import Any

#: in a slot queue: the source ended or the pipeline stops
END = None


class Slot:
    """One frame buffer of the ring and what is known about the frame in it."""

    __slots__ = ("decode_failed", "decode_lock", "encoded", "frame", "frame_id", "index", "native", "read_end",
                 "read_start", "staged_end", "staged_gen", "wall_time")

    def __init__(self, index: int) -> None:
        #: the slot's place in the ring (plans keep one staged model input per slot)
        self.index = index
        #: the decoded frame (the buffer is reused from one frame to the next)
        self.frame: Any = None
        #: the plan generation whose input was staged for this frame, -1 when none was
        self.staged_gen = -1
        self.frame_id = 0
        # perf_counter times: reading began, the frame was read (decoded), staged preprocessing ended
        self.read_start = 0.0
        self.read_end = 0.0
        self.staged_end = 0.0
        #: time.time() when the frame was read
        self.wall_time = 0.0
        #: the compressed frame, while it waits for a thread to decode it
        self.encoded: Any = None
        #: the source's own frame size when the frame was decoded reduced, else None
        self.native: tuple[int, int] | None = None
        self.decode_failed = False
        #: held from publishing a compressed frame until it is decoded
        self.decode_lock = threading.Lock()


class FrameRing:
    """``queue_size`` frames waiting, plus one being filled and one being read into the engine."""

    def __init__(self, queue_size: int) -> None:
        self.queue_size = queue_size
        self.slots = [Slot(index) for index in range(queue_size + 2)]
        self.free: queue.SimpleQueue[Slot | None] = queue.SimpleQueue()
        self.ready: queue.SimpleQueue[Slot | None] = queue.SimpleQueue()
        for slot in self.slots:
            self.free.put(slot)
        #: published frames still compressed that no thread has claimed for decoding, oldest first
        self.undecoded: deque[Slot] = deque()
        self.claim_lock = threading.Lock()

    def end(self) -> None:
        """Wake both threads: a capture thread waiting for a slot, an inference thread waiting for a frame."""
        self.free.put(END)
        self.ready.put(END)

    def publish_compressed(self, slot: Slot, encoded: Any) -> None:
        """Hold ``slot``'s compressed frame for whichever thread decodes it first."""
        slot.encoded = encoded
        slot.decode_lock.acquire()  # released by whichever thread decodes the frame
        with self.claim_lock:
            self.undecoded.append(slot)

    def claim_oldest(self) -> Slot | None:
        """The oldest compressed frame no thread has claimed yet, now claimed; None when there is none."""
        with self.claim_lock:
            return self.undecoded.popleft() if self.undecoded else None

    def drop_stale(self) -> int:
        """``latest``: drop the oldest waiting frames until there is room for one more; how many were dropped.

        Frames still compressed, that no thread has decoded, are dropped as they are: their slot
        locks released, never decoded.
        """
        ready, free = self.ready, self.free
        dropped = 0
        while ready.qsize() >= self.queue_size:
            try:
                old = ready.get_nowait()
            except queue.Empty:
                break
            if old is END:
                ready.put(END)
                break
            with self.claim_lock:
                waiting = old in self.undecoded
                if waiting:
                    self.undecoded.remove(old)
            if waiting:
                old.encoded = None
                old.decode_lock.release()
            free.put(old)
            dropped += 1
        return dropped
