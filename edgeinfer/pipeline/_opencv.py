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
