"""Keeping a run going through delegate failures: what the pipeline does with :mod:`.failover`'s decisions.

:class:`DelegateSupervisor` puts a replacement engine in the binding when an invoke raises (on the
inference thread, between two frames), handles the :mod:`.watchdog`'s hangs (the stuck inference
thread is abandoned, a new one goes on with the next delegate), and, while degraded, probes the
wanted delegate in a thread of its own and swaps it back in at a frame boundary. Capture runs
through all of it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..errors import DelegateFailed, EdgeInferError, InferenceError
from .failover import DelegateEvent, DelegateFailover
from .watchdog import InvokeWatchdog

if TYPE_CHECKING:
    from ..runtime.engine import Engine
    from .binding import ModelBinding
    from .control import RunControl
    from .infer_loop import InferenceLoop
    from .options import PipelineOptions
    from .stats import StatsRing

log = logging.getLogger("edgeinfer.pipeline")

#: seconds a restored engine may wait for a frame boundary
SWAP_TIMEOUT_S = 30.0


class DelegateSupervisor:
    """Failover on invoke errors and hangs, probes and failback, for one pipeline."""

    def __init__(self, binding: ModelBinding, infer: InferenceLoop, control: RunControl, stats: StatsRing,
                 options: PipelineOptions, *, user_engine: Engine | None, finish: Callable[[], None],
                 start_infer_thread: Callable[[], None], infer_thread: Callable[[], threading.Thread | None],
                 running: Callable[[], bool]) -> None:
        self._binding = binding
        self._infer = infer
        self._control = control
        self._stats = stats
        self._options = options
        self._user_engine = user_engine  # the caller's engine: never closed here
        self._finish = finish
        self._start_infer_thread = start_infer_thread
        self._infer_thread = infer_thread
        self._running = running
        self.failover = DelegateFailover(binding.engine, options, check=binding.check, notify=self._notify)
        infer.on_failure = self._on_invoke_failure
        self._lock = threading.Lock()  # a hang being handled, a probe being swapped in
        self._listeners: tuple[Callable[[DelegateEvent], None], ...] = ()
        self.watchdog: InvokeWatchdog | None = None
        self._probe_thread: threading.Thread | None = None
        #: inference threads stuck in a hung invoke: never joined
        self.abandoned_threads: list[threading.Thread] = []

    # ------------------------------------------------------------------------- lifetime
    def start(self) -> None:
        """The run started: watch its invokes (unless ``watchdog=False``)."""
        if self._options.watchdog:
            self.watchdog = InvokeWatchdog(self._options, self._stats, started=self._invoke_started,
                                           on_hang=self._on_hang, on_tick=self._tick).start()

    def stop(self, join: bool = True) -> None:
        if self.watchdog is not None:
            self.watchdog.stop(join=join)

    def wait_idle(self) -> None:
        """Return once no hang is being handled and no restored engine is being swapped in."""
        with self._lock:
            pass

    def add_listener(self, listener: Callable[[DelegateEvent], None]) -> None:
        self._listeners = (*self._listeners, listener)

    def may_close(self, engine: Engine) -> bool:
        """Whether the pipeline may close ``engine``: not the caller's, not one abandoned in a hung invoke."""
        return engine is not self._user_engine and engine not in self.failover.abandoned

    def engine_swapped(self, engine: Engine) -> None:
        """A caller swapped ``engine`` in (a model update): it is the one wanted from now on."""
        self.failover.reset(engine)
        self._engine_changed()

    # ------------------------------------------------------------------------- internals
    def _invoke_started(self) -> float:
        return self._infer.invoke_started

    def _engine_changed(self) -> None:
        if self.watchdog is not None:
            self.watchdog.engine_changed()

    def _notify(self, event: DelegateEvent) -> None:
        for listener in self._listeners:
            try:
                listener(event)
            except Exception:
                log.exception("delegate listener failed on %s (the pipeline goes on)", event.kind)

    def _install(self, old: Engine, new: Engine) -> None:
        """``new`` runs from the next frame; ``old`` (failed) is closed unless it is the caller's or hung."""
        owned = self._binding.owns_engine
        self._binding.replace(new)
        self._engine_changed()
        if owned and self.may_close(old):
            old.close()

    def _on_invoke_failure(self, engine: Engine, error: InferenceError) -> None:
        """Inference thread: an invoke raised; go on with the next delegate (DelegateFailed when none)."""
        self._install(engine, self.failover.replacement(engine, error))

    def _on_hang(self, started: float, bound: float) -> None:
        """Watchdog thread: the invoke that began at ``started`` is older than ``bound``."""
        waited = time.perf_counter() - started
        with self._lock:
            engine = self._binding.engine
            if self._control.stop_requested or not self._infer.abandon(started):
                return
            thread = self._infer_thread()
            if thread is not None:
                self.abandoned_threads.append(thread)
            self.failover.abandon(engine)
            hung = DelegateFailed(engine.description, f"an invoke did not return within {bound:.2f} s", hung=True)
            try:
                self._install(engine, self.failover.replacement(engine, hung, hang=(waited, bound)))
            except DelegateFailed as exc:
                self._control.error = exc
                log.error("inference stopped: %s", exc)
            if self._control.error is not None or self._control.stop_requested:
                self._control.t_end = time.perf_counter()
                self._finish()
                return
            self._start_infer_thread()

    def _tick(self) -> None:
        """Watchdog thread, every tick: probe the wanted delegate while degraded (one probe at a time)."""
        probe = self._probe_thread
        if probe is not None and probe.is_alive():
            return  # a probe stuck in a hung invoke blocks later ones: one stuck thread at most
        if self._control.stop_requested or not self.failover.probe_due() or self._binding.swap_pending:
            return
        self._probe_thread = threading.Thread(target=self._probe, name="edgeinfer-probe", daemon=True)
        self._probe_thread.start()

    def _probe(self) -> None:
        engine = self.failover.probe()
        if engine is None:
            return
        previous = self._binding.engine
        try:  # not under the lock: a hang of the engine running now must still be handled meanwhile
            old = self._binding.swap(engine, running=self._running(), timeout=SWAP_TIMEOUT_S)
        except (ValueError, EdgeInferError) as exc:
            engine.close()
            self.failover.probe_failed(str(exc))
            return
        with self._lock:
            self.failover.restored(engine, previous.description)
            self._engine_changed()
            if self.may_close(old):
                old.close()
