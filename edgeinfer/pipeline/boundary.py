"""Changes an engine's thread makes between two batches: :class:`BatchBoundary`.

What a frame's answer reads — the decoders, the event and capture rules, the lines and zones — belongs to the engine's
thread while it answers a batch. A change of the run's options (pipeline/live_options.py) is handed to that thread,
which makes it before it takes its next batch: no frame is answered half with the old parts and half with the new.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from ..errors import EdgeInferError


class BatchBoundary:
    """Calls waiting for an engine's thread to reach a batch boundary. ``wake`` wakes the thread (idle, waiting for a
    frame); ``serving`` says whether a thread serves the streams (else a call runs at once, in the caller's)."""

    def __init__(self, *, wake: Callable[[], None], serving: Callable[[], bool]) -> None:
        self._wake, self._serving = wake, serving
        self._lock = threading.Lock()
        self._calls: list[_Call] = []

    @property
    def pending(self) -> bool:
        return bool(self._calls)

    def call(self, change: Callable[[], None], timeout: float) -> None:
        """Run ``change`` in the engine's thread between two batches and wait for it; what it raises is raised here.
        EdgeInferError when the thread does not reach a boundary within ``timeout`` (the change is then not made)."""
        if not self._serving():
            change()
            return
        call = _Call(change)
        with self._lock:
            self._calls.append(call)
        self._wake()
        if not call.done.wait(timeout):
            with self._lock:
                if call in self._calls:
                    self._calls.remove(call)
                    raise EdgeInferError(f"the engine's thread did not reach a batch boundary within {timeout:g} s")
            call.done.wait()  # taken meanwhile: it is being made
        if call.error is not None:
            raise call.error

    def run(self) -> None:
        """The engine's thread, between two batches (or as it leaves): the calls waiting. What one raises goes to its
        caller; the run goes on."""
        with self._lock:
            calls, self._calls = self._calls, []
        for call in calls:
            try:
                call.change()
            except Exception as exc:  # the caller's to handle
                call.error = exc
            finally:
                call.done.set()


class _Call:
    """One change waiting for a boundary, and what it raised."""

    def __init__(self, change: Callable[[], None]) -> None:
        self.change = change
        self.done = threading.Event()
        self.error: Exception | None = None
