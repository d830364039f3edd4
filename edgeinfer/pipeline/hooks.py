"""What a running pipeline lets its caller listen to: delegate changes, results, analytics, events.

A mixin of :class:`~edgeinfer.pipeline.core.Pipeline`, kept apart so the run's own machinery stays
readable there; it reads the pipeline's ``_infer``, ``_supervisor`` and ``_delivery``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .analytics import StreamAnalytics
    from .delivery import Observer
    from .events import StreamEvents
    from .failover import DelegateEvent, DelegateStatus


class PipelineHooks:
    """Listeners and observers of a pipeline (see :class:`~edgeinfer.pipeline.core.Pipeline`)."""

    _infer: Any
    _supervisor: Any
    _delivery: Any

    @property
    def delegate_status(self) -> DelegateStatus:
        """The delegate in use, the one wanted, whether the run is degraded, failovers and frames lost."""
        return self._supervisor.failover.status()

    def add_delegate_listener(self, listener: Callable[[DelegateEvent], None]) -> None:
        """Call ``listener(event)`` on each ``delegate_fallback`` / ``delegate_restored`` (keep it short)."""
        self._supervisor.add_listener(listener)

    def add_observer(self, observer: Observer) -> None:
        """Also hand every result to ``observer`` (guarded like a callback): health checks, recorders."""
        self._delivery.add_observer(observer)

    def remove_observer(self, observer: Observer) -> None:
        """Stop handing results to ``observer`` (no error if it was not added)."""
        self._delivery.remove_observer(observer)

    @property
    def analytics(self) -> StreamAnalytics | None:
        """Tracking, lines and zones (options ``track``, ``lines``, ``zones``): counts, listeners; else None."""
        return self._infer.analytics

    @property
    def events(self) -> StreamEvents | None:
        """The event rules (option ``events``) and their evidence: ``add_listener``, ``counts()``; else None."""
        return self._infer.events

    def add_event_listener(self, listener: Callable[[dict], Any]) -> None:
        """Call ``listener(event)`` for each event a rule fires, once its snapshot and clip are written
        (docs/events.md). ValueError when the pipeline has no ``events`` rules."""
        events = self._infer.events
        if events is None:
            raise ValueError("this pipeline has no event rules (option events)")
        events.add_listener(listener)
