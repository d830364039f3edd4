"""OpenCV's process-wide thread count, set while any pipeline runs and restored by the last one out.

The pipeline already spreads work over cores (decode in one thread, the delegate's threads in
another); OpenCV's own worker pool would compete with the delegate for the same cores.
"""

from __future__ import annotations

import threading

_lock = threading.Lock()
_users = 0
_saved: int | None = None


def opencv_threads_acquire(threads: int) -> None:
    """Set OpenCV's thread count to ``threads`` for as long as this caller runs."""
    global _users, _saved
    import cv2

    with _lock:
        if _users == 0:
            _saved = cv2.getNumThreads()
        _users += 1
        cv2.setNumThreads(threads)


def opencv_threads_release() -> None:
    """This caller is done; the last one out restores the thread count OpenCV had before."""
    global _users, _saved
    import cv2

    with _lock:
        _users = max(0, _users - 1)
        if _users == 0 and _saved is not None:
            cv2.setNumThreads(_saved)
            _saved = None


class OpenCVThreads:
    """One run's hold on OpenCV's thread count: ``threads`` set from acquire() to release() (None: left alone)."""

    def __init__(self, threads: int | None) -> None:
        self.threads = threads
        self._held = False

    def acquire(self) -> None:
        if self.threads is not None and not self._held:
            opencv_threads_acquire(self.threads)
            self._held = True

    def release(self) -> None:
        if self._held:
            opencv_threads_release()
            self._held = False
