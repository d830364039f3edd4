"""The engines of a run: one :class:`~.engine_worker.EngineWorker` (one inference thread) per engine.

The first engine serves every stream that is not pinned to another (``add_stream(..., engine=...)``);
delegate listeners hear the failovers of each, engines added later included.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from .engine_worker import EngineWorker

if TYPE_CHECKING:
    from ..runtime.engine import Engine
    from .failover import DelegateEvent
    from .labels import Labels
    from .options import PipelineOptions
    from .stats import FrameResult
    from .stream import Stream


class EnginePool:
    """The run's engine workers; ``deliver``, ``on_end`` and ``on_error`` are the run's (see EngineWorker)."""

    def __init__(self, options: PipelineOptions, *, batch: int | None, deliver: Callable[[FrameResult], None],
                 on_end: Callable[[Stream], None], on_error: Callable[[BaseException], None]) -> None:
        #: the run's options (its task decided once the first engine is loaded)
        self.options = options
        self._batch = batch
        self._deliver, self._on_end, self._on_error = deliver, on_end, on_error
        self.workers: list[EngineWorker] = []
        self._listeners: tuple[Callable[[DelegateEvent], Any], ...] = ()
        self._started = False
        #: the labels every engine decodes with (known once the first engine is loaded)
        self.labels: Labels | None = None

    def load(self, model: str | os.PathLike, sources: Sequence[Any] = ()) -> Engine:
        """``model`` on the delegate the options name, else the delegate probe's choice (its judgement frame from a
        file among ``sources``: delegate_probe.py), else the plan's first."""
        from .delegate_probe import load_engine

        return load_engine(model, self.options, threads=self.options.threads, batch=self._batch, sources=sources)

    def worker_for(self, engine: Engine, owns: bool) -> EngineWorker:
        """The worker serving ``engine`` (a new one, started if the run is, for an engine not seen yet)."""
        for worker in self.workers:
            if worker.engine is engine:
                return worker
        worker = EngineWorker(engine, owns, self.options, self.labels, index=len(self.workers),
                              deliver=self._deliver, on_end=self._on_end, on_error=self._on_error)
        for listener in self._listeners:
            worker.failover.add_listener(listener)
        self.workers.append(worker)
        if self._started:
            worker.start()
        return worker

    def start(self) -> None:
        self._started = True
        for worker in self.workers:
            worker.start()

    def end(self) -> None:
        """Serve no more batches (the run is over)."""
        for worker in self.workers:
            worker.end()

    def stop(self) -> None:
        for worker in self.workers:
            worker.stop()

    def close(self) -> None:
        """Close what the workers loaded — never the caller's engine, one abandoned in a hang, nor one whose
        thread still runs."""
        for worker in self.workers:
            if not worker.running:
                worker.failover.close()

    def add_delegate_listener(self, listener: Callable[[DelegateEvent], Any]) -> None:
        self._listeners = (*self._listeners, listener)
        for worker in self.workers:
            worker.failover.add_listener(listener)

    @property
    def busy(self) -> bool:
        """Whether an engine's thread still runs (closing its engine under it could crash the runtime)."""
        return any(worker.running for worker in self.workers)

    @property
    def abandoned_threads(self) -> list[threading.Thread]:
        return [thread for worker in self.workers for thread in worker.abandoned_threads]

    @property
    def invokes(self) -> int:
        return sum(worker.invokes for worker in self.workers)
