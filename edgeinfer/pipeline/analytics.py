"""Per-stream analytics: tracking, line crossings and zones over a pipeline's detections (docs/analytics.md).

:class:`StreamAnalytics` is a pipeline observer (``pipeline.add_observer(analytics)``) or is called
directly (``analytics.process(detections, frame_id, timestamp)``). It runs the :class:`Tracker`,
feeds each confirmed track's box to every :class:`LineCounter` and :class:`ZoneCounter`, hands the
events they make to its listeners, and gives a JSON-able snapshot of the counts (``counts()``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from .._regions import parse_line, parse_zone
from .postprocess import Detections
from .tracking import Tracker
from .zones import (
    DEFAULT_ANCHOR,
    DEFAULT_BAND,
    DEFAULT_HOLD_S,
    EVENT_KINDS,
    LINE_CROSSED,
    ZONE_ENTERED,
    ZONE_LEFT,
    AnalyticsEvent,
    LineCounter,
    ZoneCounter,
    named_regions,
)

if TYPE_CHECKING:
    from .stats import FrameResult

__all__ = ["EVENT_KINDS", "LINE_CROSSED", "ZONE_ENTERED", "ZONE_LEFT", "AnalyticsEvent", "LineCounter",
           "StreamAnalytics", "Tracker", "ZoneCounter", "build_analytics", "parse_line", "parse_zone"]

log = logging.getLogger(__name__)

Listener = Callable[[AnalyticsEvent], Any]


@dataclass(slots=True)
class _Seen:
    frame_id: int
    timestamp: float  # the stream's own clock (source time)
    label: str
    box: tuple[float, float, float, float]
    wall: float  # the frame's wall-clock time


class StreamAnalytics:
    """Tracks, lines and zones of one stream.

    ``fps``: when given, a frame's time is ``frame_id / fps`` (the clip's own time: right for files
    read faster or slower than real time); otherwise the frame's capture timestamp. Holds and dwell are
    measured in that time, and it is each event's ``source_time``; an event's ``timestamp`` is always the
    frame's wall-clock time (docs/events.md). A track unseen
    for more than ``forget_after`` frames (default: the tracker's ``lost_frames`` + 1) is forgotten:
    it leaves the zones it was in (``zone_left``, with the time it was last seen) and its line state
    is dropped. Thread-safe: the pipeline's inference thread calls it while another reads ``counts()``.
    """

    def __init__(self, tracker: Tracker | None = None, lines: Sequence[LineCounter] = (),
                 zones: Sequence[ZoneCounter] = (), *, fps: float | None = None,
                 forget_after: int | None = None) -> None:
        self.tracker = tracker if tracker is not None else Tracker()
        self.lines = tuple(lines)
        self.zones = tuple(zones)
        _unique_names(self.lines, self.zones)
        if fps is not None and not fps > 0:
            raise ValueError(f"fps must be > 0, not {fps!r}")
        self.fps = fps
        self.forget_after = self.tracker.lost_frames + 1 if forget_after is None else int(forget_after)
        if self.forget_after < 1:
            raise ValueError(f"forget_after must be >= 1, not {forget_after!r}")
        self._lock = threading.Lock()
        self._listeners: tuple[Listener, ...] = ()
        self._seen: dict[int, _Seen] = {}
        self._warned_task = False
        self.frames = 0
        self.last_frame_id: int | None = None
        #: the last frame's detections with their track ids
        self.last: Detections = Detections()

    # -- listeners -----------------------------------------------------------------------------
    def add_listener(self, listener: Listener) -> None:
        """Call ``listener(event)`` for every :class:`AnalyticsEvent` (in the thread that processes frames)."""
        self._listeners = (*self._listeners, listener)

    def remove_listener(self, listener: Listener) -> None:
        self._listeners = tuple(fn for fn in self._listeners if fn is not listener)

    # -- frames --------------------------------------------------------------------------------
    def __call__(self, result: FrameResult) -> None:
        """The pipeline observer: a ``FrameResult`` of a pipeline whose task gives boxes."""
        if not isinstance(result.result, Detections):
            if not self._warned_task:
                self._warned_task = True
                log.warning("stream analytics need detections (a task with boxes); got %s — ignored",
                            type(result.result).__name__)
            return
        self.process(result.result, result.frame_id, result.timestamp)

    def process(self, detections: Detections, frame_id: int, timestamp: float | None = None) -> Detections:
        """Track one frame's detections and count them; the detections with their track ids. ``timestamp``: the
        frame's wall-clock capture time (default: now)."""
        events: list[AnalyticsEvent] = []
        with self._lock:
            wall = time.time() if timestamp is None else float(timestamp)
            now = frame_id / self.fps if self.fps is not None else wall
            tracked = self.tracker.update(detections, frame_id)
            for detection in tracked:
                track_id = detection.track_id
                if track_id is None:
                    continue
                box = detection.box
                self._seen[track_id] = _Seen(frame_id, now, detection.label, box, wall)
                for counter in (*self.lines, *self.zones):
                    event = counter.update(track_id, detection.label, box, frame_id, now)
                    if event is not None:
                        events.append(_on_the_wall(event, wall))
            self._forget_lost(frame_id, events)
            self.frames += 1
            self.last_frame_id = frame_id
            self.last = tracked
        for event in events:
            for listener in self._listeners:
                try:
                    listener(event)
                except Exception:  # a listener's bug must not stop the counting
                    log.exception("analytics listener failed on %s (counting goes on)", event.kind)
        return tracked

    def _forget_lost(self, frame_id: int, events: list[AnalyticsEvent]) -> None:
        for track_id, seen in list(self._seen.items()):
            if seen.frame_id == frame_id:
                continue
            if frame_id - seen.frame_id <= self.forget_after:
                for counter in (*self.lines, *self.zones):  # missing from this frame: a hold is broken
                    counter.miss(track_id)
                continue
            del self._seen[track_id]
            for line in self.lines:
                line.forget(track_id)
            for zone in self.zones:
                event = zone.forget(track_id, seen.label, seen.frame_id, seen.timestamp, seen.box)
                if event is not None:
                    events.append(_on_the_wall(event, seen.wall))

    def replace_geometry(self, lines: Sequence[LineCounter], zones: Sequence[ZoneCounter]) -> None:
        """Count with ``lines`` and ``zones`` from the next frame on; the tracks carry on. A line or zone whose
        name and geometry stay is kept as it is (its counts and the tracks' state in it); one whose name stays
        but moved carries its counts over to the new one (a track inside it is judged afresh)."""
        new_lines, new_zones = tuple(lines), tuple(zones)
        _unique_names(new_lines, new_zones)
        with self._lock:
            old_lines = {line.name: line for line in self.lines}
            old_zones = {zone.name: zone for zone in self.zones}
            self.lines = tuple(_carried(line, old_lines.get(line.name), ("start", "end"), ("crossed_in", "crossed_out"))
                               for line in new_lines)
            self.zones = tuple(_carried(zone, old_zones.get(zone.name), ("polygon",), ("entries",))
                               for zone in new_zones)

    def counts(self) -> dict[str, Any]:
        """A JSON-able snapshot: per line in/out, per zone inside/entries/time, tracks confirmed and active."""
        with self._lock:
            return {"frame_id": self.last_frame_id, "frames": self.frames,
                    "tracks": {"confirmed": len(self.tracker.confirmed_ids), "active": len(self._seen)},
                    "lines": {line.name: line.counts() for line in self.lines},
                    "zones": {zone.name: zone.counts() for zone in self.zones}}


def _on_the_wall(event: AnalyticsEvent, wall: float) -> AnalyticsEvent:
    """A counter's event (stamped in the stream's clock) with its frame's wall-clock time as its ``timestamp``."""
    return replace(event, timestamp=wall, source_time=event.timestamp)
def _unique_names(lines: Sequence[LineCounter], zones: Sequence[ZoneCounter]) -> None:
    """ValueError when two lines or zones share a name (an event names one by its name alone: _regions)."""
    names = [item.name for item in (*lines, *zones)]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError(f"line and zone names must be unique; repeated: {', '.join(duplicates)}")


def _carried(new: Any, old: Any, shape: tuple[str, ...], totals: tuple[str, ...]) -> Any:
    """``old`` when it has ``new``'s shape (nothing changed); else ``new`` with ``old``'s running totals."""
    if old is None:
        return new
    if all(getattr(new, key) == getattr(old, key) for key in (*shape, "band", "band_px", "anchor")):
        return old
    for key in totals:
        setattr(new, key, getattr(old, key))
    return new


# ------------------------------------------------------------------------------------------
# Configuration: what a CLI flag or an agent.yaml entry gives (parsed in zones.py, checked by _regions)
# ------------------------------------------------------------------------------------------

def build_analytics(*, lines: Mapping[str, Sequence[float]] | Sequence[Sequence[float]] = (),
                    zones: Mapping[str, Sequence[Sequence[float]]] | Sequence[Sequence[Sequence[float]]] = (),
                    min_hits: int = 3, band: float = DEFAULT_BAND, band_px: float = 0.0,
                    anchor: str = DEFAULT_ANCHOR, hold_s: float = DEFAULT_HOLD_S, trigger: str = "anchor",
                    lost_frames: int = 30, frame_rate: float = 30.0, fps: float | None = None) -> StreamAnalytics:
    """:class:`StreamAnalytics` from plain data: lines as ``(x1, y1, x2, y2)``, zones as point lists.

    A list gives names ``line1``, ``line2`` … / ``zone1`` …; a mapping names them itself.
    """
    line_items = lines.items() if isinstance(lines, Mapping) else ((f"line{i + 1}", c) for i, c in enumerate(lines))
    zone_items = zones.items() if isinstance(zones, Mapping) else ((f"zone{i + 1}", p) for i, p in enumerate(zones))
    shared = {"band": band, "band_px": band_px, "anchor": anchor, "hold_s": hold_s, "trigger": trigger}
    return StreamAnalytics(
        Tracker(min_hits=min_hits, lost_frames=lost_frames, frame_rate=frame_rate),
        [LineCounter.from_coords(name, list(coords), **shared) for name, coords in line_items],
        [ZoneCounter(name, polygon, **shared) for name, polygon in zone_items],
        fps=fps)


def analytics_from_options(options: Any, fps: float | None = None) -> StreamAnalytics | None:
    """The pipeline's :class:`StreamAnalytics` from its options (``lines``, ``zones``, ``track_min_hits``,
    ``line_band``, ``line_hold_s``, ``line_trigger``): what ``Pipeline(..., lines=["door=320,470,320,10"])``,
    ``--line`` and agent.yaml give; None when the pipeline does not track. ``fps``: a file's own frame
    rate — its frames are then timed ``frame_id / fps`` (the clip's time, however fast it is read); a
    live source's (None) by their capture time."""
    if not options.tracking:
        return None
    lines, zones = named_regions(options.lines, options.zones)
    return analytics_for(options, lines, zones, fps=fps)


def analytics_for(options: Any, lines: Mapping[str, Sequence[float]],
                  zones: Mapping[str, Sequence[Sequence[float]]], *, fps: float | None = None) -> StreamAnalytics:
    """A pipeline's :class:`StreamAnalytics` (its tracker settings, band, hold and trigger) with these lines and
    zones; ``fps`` as :func:`analytics_from_options` takes it."""
    frame_rate = float(fps or options.fps or options.max_fps or 30.0)
    return build_analytics(lines=lines, zones=zones, min_hits=options.track_min_hits, band=options.line_band,
                           hold_s=options.line_hold_s, trigger=options.line_trigger, frame_rate=frame_rate, fps=fps)
