"""Delegate failover for an engine serving several streams (:class:`~edgeinfer.pipeline.multi.MultiPipeline`).

The same walk of the selection plan as a single pipeline's (:class:`~.failover.DelegateFailover`): an
invoke that raises makes the worker load the plan's next delegate and go on with it from the next
batch — every stream of the engine goes on, capture never stops; the frames of the failed batch are
lost and counted. An invoke that hangs is given up by the worker's watchdog (:mod:`.watchdog`, the same
bound as a single pipeline's): the engine is abandoned, never closed, and a new worker thread goes on
with the next delegate (:meth:`WorkerFailover.hung`). While degraded, the wanted delegate is probed with
backoff in a thread of its own and swapped back in between two batches.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .failover import DelegateEvent, DelegateFailover

if TYPE_CHECKING:
    from ..errors import InferenceError
    from ..runtime.engine import Engine
    from .options import PipelineOptions

log = logging.getLogger("edgeinfer.pipeline")


class WorkerFailover:
    """One engine worker's failovers and failbacks; ``install(engine)`` puts an engine to work (the worker's)."""

    def __init__(self, engine: Engine, options: PipelineOptions, *, check: Callable[[Engine], None],
                 install: Callable[[Engine], None]) -> None:
        self._install = install
        self._listeners: tuple[Callable[[DelegateEvent], Any], ...] = ()
        self.failover = DelegateFailover(engine, options, check=check, notify=self._notify)
        self._probe_thread: threading.Thread | None = None
        self._probed: Engine | None = None
        self._lock = threading.Lock()
        #: engines this worker loaded (it closes them); the caller's own engine is never closed here
        self.loaded: list[Engine] = []

    def add_listener(self, listener: Callable[[DelegateEvent], Any]) -> None:
        self._listeners = (*self._listeners, listener)

    def _notify(self, event: DelegateEvent) -> None:
        for listener in self._listeners:
            try:
                listener(event)
            except Exception:
                log.exception("delegate listener failed on %s (the streams go on)", event.kind)

    def failed(self, engine: Engine, error: InferenceError, frames: int) -> None:
        """Worker thread: an invoke of ``frames`` frames raised; go on with the next delegate, or raise
        DelegateFailed (the worker stops) when there is none."""
        self.failover.frames_lost += max(frames - 1, 0)  # replacement() counts one
        replacement = self.failover.replacement(engine, error)
        self.loaded.append(replacement)
        self._install(replacement)
        self._retire(engine)

    def hung(self, engine: Engine, error: InferenceError, frames: int, waited: float, bound: float) -> None:
        """Watchdog thread: an invoke of ``frames`` frames on ``engine`` has run ``waited`` s, past ``bound``.
        ``engine`` is abandoned — kept, never closed: its native call may still be running — and the next
        delegate installed (DelegateFailed when there is none)."""
        self.failover.frames_lost += max(frames - 1, 0)
        self.failover.abandon(engine)
        if engine in self.loaded:
            self.loaded.remove(engine)
        replacement = self.failover.replacement(engine, error, hang=(waited, bound))
        self.loaded.append(replacement)
        self._install(replacement)

    def swapped(self, old: Engine, new: Engine) -> None:
        """A model update put ``new`` in place of ``old``: ``new`` is the one wanted from now on and this
        worker's to close; ``old`` is the caller's now."""
        if old in self.loaded:
            self.loaded.remove(old)
        self.loaded.append(new)
        self.failover.reset(new)

    def between_batches(self, engine: Engine, stopping: bool) -> None:
        """Worker thread, between two batches: swap in a probed engine; start a probe when one is due."""
        with self._lock:
            probed, self._probed = self._probed, None
        if probed is not None:
            self.loaded.append(probed)
            self._install(probed)
            self.failover.restored(probed, engine.description)
            self._retire(engine)
            return
        thread = self._probe_thread
        if stopping or (thread is not None and thread.is_alive()) or not self.failover.probe_due():
            return
        self._probe_thread = threading.Thread(target=self._probe, name="edgeinfer-probe", daemon=True)
        self._probe_thread.start()

    def _probe(self) -> None:
        engine = self.failover.probe()
        if engine is not None:
            with self._lock:
                self._probed = engine

    def _retire(self, engine: Engine) -> None:
        """Close an engine that failed or was replaced, if this worker loaded it."""
        if engine in self.loaded:
            self.loaded.remove(engine)
            try:
                engine.close()
            except Exception:
                log.debug("closing %s failed", engine.description, exc_info=True)

    def close(self) -> None:
        """The run is over: close what the worker loaded (a probe's engine too)."""
        thread = self._probe_thread
        if thread is not None:
            thread.join(5.0)
        with self._lock:
            probed, self._probed = self._probed, None
        for engine in [*self.loaded, *([probed] if probed is not None else [])]:
            try:
                engine.close()
            except Exception:
                log.debug("closing %s failed", engine.description, exc_info=True)
        self.loaded.clear()
