"""The manager's polling threads (the change feed's, the live view's): :class:`Loop`, a daemon thread
from ``start`` until ``close``."""

from __future__ import annotations

import threading
from typing import TypeVar


class Loop:
    """A daemon thread running ``_run`` from :meth:`start` until :meth:`close`: ``_wake`` hurries it (set it to
    have it look now), ``_stop`` ends it. The manager's polling threads are such loops."""

    thread_name = "edgeinfer-fleet-loop"

    def __init__(self) -> None:
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self: LoopT) -> LoopT:
        self._thread = threading.Thread(target=self._run, name=self.thread_name, daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(5)

    def _run(self) -> None:
        raise NotImplementedError


LoopT = TypeVar("LoopT", bound=Loop)
