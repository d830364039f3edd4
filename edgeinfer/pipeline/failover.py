"""Delegate failover and failback at run time: the pipeline outlives its accelerator.

When the delegate running fails (an invoke raises: a Coral unplugged, a GPU lost, an NPU error) or
hangs (the :mod:`.watchdog` sees no return within its bound), :class:`DelegateFailover` loads the
next delegate of the engine's selection plan (``engine.selection``) and the engine's thread goes on
with it from the next batch — every stream it serves goes on, capture never stops. The frames that
were in the failed invoke are lost and counted. While degraded, the wanted delegate is probed with
backoff (loaded, invoked once, in a thread of its own) and swapped back in between two batches.
:class:`WorkerFailover` is what an :class:`~.engine_worker.EngineWorker` does with those decisions.

Nothing fails over when the plan is strict, when ``failover=False``, or when the plan has no other
delegate that can run the model: the run stops with :class:`~edgeinfer.errors.DelegateFailed`.

An engine whose invoke hung is *abandoned*, never closed: its native call may still be running on
the thread that made it (which exits, without touching the pipeline, if the call ever returns).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import DelegateFailed, EdgeInferError

if TYPE_CHECKING:
    from ..errors import InferenceError
    from ..runtime.engine import Engine
    from ..runtime.selection import Plan
    from .options import PipelineOptions

log = logging.getLogger("edgeinfer.pipeline")

FALLBACK = "delegate_fallback"
RESTORED = "delegate_restored"


@dataclass(frozen=True)
class DelegateEvent:
    """A change of the delegate a pipeline runs on: a fallback after a failure, or the wanted one restored."""

    kind: str  # FALLBACK or RESTORED
    delegate: str  # in use from now on
    previous: str
    wanted: str
    reason: str
    cause: str  # "error", "hang" or "probe"
    frames_lost: int  # over the run, so far
    at: float  # time.time()
    #: a hang: how long the invoke had run when the watchdog gave up on it, and the bound it passed
    waited_s: float | None = None
    bound_s: float | None = None

    def to_dict(self) -> dict[str, Any]:
        data = {"kind": self.kind, "delegate": self.delegate, "previous": self.previous, "wanted": self.wanted,
                "reason": self.reason, "cause": self.cause, "frames_lost": self.frames_lost, "at": round(self.at, 3)}
        if self.waited_s is not None:
            data.update(waited_s=round(self.waited_s, 3), bound_s=round(self.bound_s or 0.0, 3))
        return data


@dataclass(frozen=True)
class DelegateStatus:
    """Where a pipeline stands with its delegates."""

    delegate: str
    wanted: str
    degraded: bool
    reason: str | None
    fallbacks: int
    restores: int
    frames_lost: int
    can_fail_over: bool

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _text(exc: BaseException) -> str:
    reason = getattr(exc, "reason", None)
    return reason if isinstance(reason, str) else " ".join(str(exc).split()) or type(exc).__name__


class DelegateFailover:
    """The plan walked at run time: replacements after failures, probes of the wanted delegate."""

    def __init__(self, engine: Engine, options: PipelineOptions, *, check: Callable[[Engine], None],
                 notify: Callable[[DelegateEvent], None]) -> None:
        self._check = check  # ValueError when an engine cannot serve the pipeline's task
        self._notify = notify
        self._threads = options.threads
        self._backoff = options.probe_backoff
        self._enabled = options.failover
        self._lock = threading.Lock()
        self.abandoned: list[Engine] = []  # hung engines: kept referenced, never closed
        self.frames_lost = 0
        self.fallbacks = 0
        self.restores = 0
        self.reset(engine)

    def reset(self, engine: Engine) -> None:
        """``engine`` is the one wanted from now on (the pipeline started, or a model update swapped it in)."""
        with self._lock:
            self.plan: Plan | None = getattr(engine, "selection", None)
            self.wanted_index = self.plan.selected if self.plan is not None else None
            self.wanted = engine.description
            self.current = engine.description
            self.degraded = False
            self.reason: str | None = None
            self._failed: set[int] = set()
            self._probe_attempt = 0
            self._next_probe = 0.0

    # --------------------------------------------------------------------------- state
    @property
    def can_fail_over(self) -> bool:
        """Whether a failure may go on with another delegate (not strict, not turned off, one to go to)."""
        plan = self.plan
        if not self._enabled or plan is None or plan.strict:
            return False
        return sum(c.compatible for c in plan.candidates) > 1

    def status(self) -> DelegateStatus:
        return DelegateStatus(delegate=self.current, wanted=self.wanted, degraded=self.degraded, reason=self.reason,
                              fallbacks=self.fallbacks, restores=self.restores, frames_lost=self.frames_lost,
                              can_fail_over=self.can_fail_over)

    def stats_fields(self) -> dict[str, Any]:
        """``degraded``, ``delegate_wanted`` and ``frames_lost`` for PipelineStats."""
        return {"degraded": self.degraded, "delegate_wanted": self.wanted if self.degraded else None,
                "frames_lost": self.frames_lost}

    def abandon(self, engine: Engine) -> None:
        """``engine`` hung: keep it referenced for ever (its native call may still run) and never close it."""
        self.abandoned.append(engine)

    # ------------------------------------------------------------------------ failures
    def replacement(self, failed: Engine, error: BaseException, *, hang: tuple[float, float] | None = None) -> Engine:
        """The next delegate's engine after ``failed`` failed with ``error``; raises DelegateFailed if there is none.

        ``hang`` is (seconds waited, bound) when the watchdog gave up on an invoke.
        """
        hung = hang is not None
        reason = _text(error)
        self.frames_lost += 1
        if not self.can_fail_over:
            why = ("strict mode: no fallback" if self.plan is not None and self.plan.strict else
                   "failover is off" if not self._enabled else "no other delegate in the plan")
            raise DelegateFailed(failed.description, f"{reason} ({why})", hung=hung) from error
        plan = self.plan
        assert plan is not None
        failed_index = self._index_of(failed)
        if failed_index is not None:
            self._failed.add(failed_index)
        tried: list[str] = []
        for index, candidate in enumerate(plan.candidates):
            if not candidate.compatible or index in self._failed or index == self.wanted_index:
                continue
            engine = self._try_load(index, tried)
            if engine is not None:
                self._fell_back(failed, engine, reason, hang)
                return engine
        listing = "; ".join(tried) or "no other candidate"
        raise DelegateFailed(failed.description, f"{reason}; no fallback works ({listing})", hung=hung) from error

    def _index_of(self, engine: Engine) -> int | None:
        selection = getattr(engine, "selection", None)
        return selection.selected if selection is not None else self.wanted_index

    def _try_load(self, index: int, tried: list[str]) -> Engine | None:
        from ..runtime.delegates.registry import get_delegate
        from ..runtime.selection import load_candidate, unavailable_reason

        plan = self.plan
        assert plan is not None
        candidate = plan.candidates[index]
        try:
            why = unavailable_reason(get_delegate(candidate.name), candidate.device, None)
            if why:
                tried.append(f"{candidate.spec}: {why}")
                return None
            engine = load_candidate(plan, index, threads=self._threads)
        except (EdgeInferError, ValueError, OSError) as exc:
            tried.append(f"{candidate.spec}: {_text(exc)}")
            return None
        try:
            self._check(engine)
        except ValueError as exc:
            engine.close()
            tried.append(f"{candidate.spec}: {exc}")
            return None
        return engine

    def _fell_back(self, failed: Engine, engine: Engine, reason: str, hang: tuple[float, float] | None) -> None:
        with self._lock:
            self.degraded = True
            self.reason = reason
            self.current = engine.description
            self.fallbacks += 1
            self._probe_attempt = 0
            self._next_probe = time.monotonic() + self._backoff.delay(1)
        log.warning("delegate %s failed (%s): going on with %s; %s will be tried again", failed.description, reason,
                    engine.description, self.wanted)
        waited, bound = hang if hang is not None else (None, None)
        self._notify(DelegateEvent(FALLBACK, engine.description, failed.description, self.wanted, reason,
                                   "error" if hang is None else "hang", self.frames_lost, time.time(), waited, bound))

    # -------------------------------------------------------------------------- probes
    def probe_due(self, now: float | None = None) -> bool:
        """Whether the wanted delegate should be tried again now."""
        now = time.monotonic() if now is None else now
        return self.degraded and self.wanted_index is not None and now >= self._next_probe

    def probe(self) -> Engine | None:
        """Load the wanted delegate and invoke it once: its engine when it works again, else None (backoff grows).

        Runs in a thread of its own: an invoke that hangs here hangs only the probe.
        """
        assert self.wanted_index is not None
        tried: list[str] = []
        engine = self._try_load(self.wanted_index, tried)
        if engine is not None:
            try:
                engine.invoke()
            except EdgeInferError as exc:
                engine.close()
                tried.append(f"{engine.description}: {_text(exc)}")
                engine = None
        if engine is None:
            self.probe_failed("; ".join(tried))
        return engine

    def probe_failed(self, why: str) -> None:
        """The probe did not bring the wanted delegate back; the next one waits longer."""
        with self._lock:
            self._probe_attempt += 1
            delay = self._backoff.delay(self._probe_attempt + 1)
            self._next_probe = time.monotonic() + delay
        log.info("delegate %s still fails (%s); next try in %.1f s", self.wanted, why, delay)

    def restored(self, engine: Engine, previous: str) -> None:
        """The wanted delegate runs again (swapped in by the pipeline)."""
        with self._lock:
            reason = f"{self.wanted} answers again"
            self.degraded = False
            self.reason = None
            self.current = engine.description
            self.restores += 1
            self._failed.clear()
        log.warning("delegate %s restored (was running on %s)", engine.description, previous)
        self._notify(DelegateEvent(RESTORED, engine.description, previous, self.wanted, reason, "probe",
                                   self.frames_lost, time.time()))


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
        if self._probed is None and not self.failover.degraded:
            return  # healthy: nothing to do (the common case costs two attribute reads per batch)
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
