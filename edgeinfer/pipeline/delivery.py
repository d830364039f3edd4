"""Handing results out: to observers, to a callback, or to an iterating consumer with back-pressure."""

from __future__ import annotations

import logging
import queue
from collections.abc import Callable, Iterator

from .stats import FrameResult

log = logging.getLogger("edgeinfer.pipeline")

#: in the result queue: no more results
_STOP = object()
#: results that may wait for an iterating consumer, at least
MIN_CREDITS = 4

Observer = Callable[[FrameResult], None]


class ResultDelivery:
    """Results go to every observer, then to the callback, or else into a bounded queue for the iterator.

    Observers and the callback are guarded: an exception is logged with the frame id and the
    pipeline goes on (callback failures are counted). An iterating consumer holds "credits": at
    most a few results wait for it, after which the inference thread waits too.
    """

    def __init__(self, queue_size: int) -> None:
        self.callback: Observer | None = None
        self.observers: tuple[Observer, ...] = ()
        self.iterating = False
        self.callback_errors = 0
        self._results: queue.SimpleQueue = queue.SimpleQueue()
        self._credits: queue.SimpleQueue = queue.SimpleQueue()
        for _ in range(max(MIN_CREDITS, queue_size * 2)):
            self._credits.put(True)

    def add_observer(self, observer: Observer) -> None:
        """Also hand every result to ``observer``."""
        self.observers = (*self.observers, observer)

    def remove_observer(self, observer: Observer) -> None:
        """Stop handing results to ``observer`` (no error if it was not added)."""
        self.observers = tuple(o for o in self.observers if o is not observer)

    def deliver(self, result: FrameResult, stopping: Callable[[], bool]) -> None:
        """Inference thread: hand out one result (``stopping`` says whether the consumer is gone)."""
        for observer in self.observers:  # a tuple swapped whole, so no lock is needed
            try:
                observer(result)
            except Exception:
                log.exception("pipeline observer failed on frame %d (the pipeline goes on)", result.frame_id)
        callback = self.callback
        if callback is not None:
            try:
                callback(result)
            except Exception:
                self.callback_errors += 1
                log.exception("pipeline callback failed on frame %d (the pipeline goes on)", result.frame_id)
            return
        if self.iterating:
            self._credits.get()  # back-pressure: at most a few results wait for the consumer
            if not stopping():
                self._results.put(result)

    def results(self) -> Iterator[FrameResult]:
        """Consumer: results until the run ends."""
        while True:
            item = self._results.get()
            if item is _STOP:
                self._results.put(_STOP)  # a later iteration ends at once too
                return
            self._credits.put(True)
            yield item

    def wake_producer(self) -> None:
        """Wake an inference thread waiting for the consumer to take a result."""
        self._credits.put(True)

    def end(self) -> None:
        """No more results: the consumer's iteration ends."""
        self._results.put(_STOP)
