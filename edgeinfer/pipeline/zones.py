"""Line crossings with hysteresis and polygon zones, counted per confirmed track (docs/analytics.md).

Both counters see one point per tracked box, its *anchor* (bottom centre by default: where a
person or a car touches the ground), and a *band* around their boundary: a position inside the
band changes nothing. The band is ``max(band_px, band * box height)`` pixels, so it grows with the
object (near objects jitter more in pixels).

A band alone is not enough: a box standing on a line and jittering by more than the band (ordinary
detector noise, issue 29) would cross it on every flip. So a new side only counts once it *holds*:
the anchor (or, with ``trigger="box"``, every corner of the box) stays beyond the band on that side
for ``hold_s`` seconds of the stream's time, seen in every frame meanwhile — a frame back in the band
or on the old side, or one in which the track has no box (``miss``), starts the wait again.
``hold_s=0`` is the bare band.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .._regions import line_problem, name_problem, parse_regions, text_names, zone_problem

#: anchor name → (fraction of the width, fraction of the height) from the box's top-left corner
ANCHORS: dict[str, tuple[float, float]] = {
    "bottom_center": (0.5, 1.0), "center": (0.5, 0.5), "top_center": (0.5, 0.0),
    "left_center": (0.0, 0.5), "right_center": (1.0, 0.5),
    "bottom_left": (0.0, 1.0), "bottom_right": (1.0, 1.0), "top_left": (0.0, 0.0), "top_right": (1.0, 0.0),
}
DEFAULT_ANCHOR = "bottom_center"
#: the band's default share of the box height: wider than ordinary detector jitter (±10-15 % of the
#: box; with 0.1 and the hold, a ±15 % jitterer at 5 fps still counted 14 times in 10 minutes — 0 with 0.15)
DEFAULT_BAND = 0.15
#: seconds a new side must hold before it counts (supervision's minimum_crossing_threshold, Frigate's
#: zone inertia, in time rather than frames so that it means the same at 5 and at 30 fps)
DEFAULT_HOLD_S = 0.3
#: what must be beyond the band: the anchor point, or the whole box (every corner)
TRIGGERS = ("anchor", "box")
#: frame times are sums of floats: 14/10 - 11/10 must hold 0.3 s
_EPS = 1e-6

LINE_CROSSED = "line_crossed"
ZONE_ENTERED = "zone_entered"
ZONE_LEFT = "zone_left"
EVENT_KINDS = (LINE_CROSSED, ZONE_ENTERED, ZONE_LEFT)

Box = tuple[float, float, float, float]


@dataclass(frozen=True, slots=True)
class AnalyticsEvent:
    """A line crossed or a zone entered or left, by one confirmed track.

    ``direction`` is ``"in"`` or ``"out"`` for a line (None for zones); ``dwell_s`` the time the
    track spent inside, on ``zone_left``; ``box`` the track's box in that frame (the last one seen
    when a lost track leaves a zone).

    Two times (docs/events.md): ``timestamp`` is the frame's wall-clock time (``time.time()`` when it was
    captured — read, for a file); ``source_time`` the same frame in its source's own clock, the clock holds and
    dwell are measured in (a file's position, ``frame_id / fps``, however fast it is read; a live source's
    capture time). A counter stamps its events with the one clock it is given, as both;
    :class:`~edgeinfer.pipeline.analytics.StreamAnalytics` then sets ``timestamp`` to the frame's wall-clock time.
    """

    kind: str
    name: str
    track_id: int
    label: str
    frame_id: int
    timestamp: float
    direction: str | None = None
    dwell_s: float | None = None
    box: Box | None = None
    source_time: float | None = None

    def __post_init__(self) -> None:
        if self.source_time is None:  # one clock given: it is both
            object.__setattr__(self, "source_time", self.timestamp)

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"kind": self.kind, "name": self.name, "track_id": self.track_id,
                                "label": self.label, "frame_id": self.frame_id,
                                "timestamp": round(self.timestamp, 6),
                                "source_time": round(float(self.source_time or 0.0), 6)}
        if self.direction is not None:
            data["direction"] = self.direction
        if self.dwell_s is not None:
            data["dwell_s"] = round(self.dwell_s, 3)
        if self.box is not None:
            data["box"] = [round(v, 1) for v in self.box]
        return data


def anchor_point(box: Box, anchor: str = DEFAULT_ANCHOR) -> tuple[float, float]:
    """The anchor of a box (x1, y1, x2, y2) in the same pixels."""
    fx, fy = ANCHORS[anchor]
    x1, y1, x2, y2 = box
    return x1 + fx * (x2 - x1), y1 + fy * (y2 - y1)


def _point(value: Any, what: str) -> tuple[float, float]:
    try:
        x, y = (float(v) for v in value)
    except (TypeError, ValueError):
        raise ValueError(f"{what} must be a point (x, y) of two numbers, not {value!r}") from None
    if not (math.isfinite(x) and math.isfinite(y)):
        raise ValueError(f"{what} must be finite, not {value!r}")
    return x, y


def _check_common(name: str, what: str, anchor: str, band: float, band_px: float, hold_s: float,
                  trigger: str) -> None:
    problem = name_problem(name, what)
    if problem:
        raise ValueError(problem)
    if anchor not in ANCHORS:
        raise ValueError(f"{what} {name!r}: anchor {anchor!r} is not one of {', '.join(ANCHORS)}")
    if trigger not in TRIGGERS:
        raise ValueError(f"{what} {name!r}: trigger {trigger!r} is not one of {', '.join(TRIGGERS)}")
    try:
        numbers = [float(band), float(band_px), float(hold_s)]
    except (TypeError, ValueError):
        numbers = [-1.0]
    if not all(v >= 0 and math.isfinite(v) for v in numbers):
        raise ValueError(f"{what} {name!r}: band ({band!r}), band_px ({band_px!r}) and hold_s ({hold_s!r}) "
                         "must be finite numbers >= 0")


class _Held:
    """One track's side of a boundary (+1 / -1; 0: not known yet) and the flip it is waiting on."""

    __slots__ = ("pending", "side", "since")

    def __init__(self, side: int = 0) -> None:
        self.side = side
        self.pending = 0  # the other side, seen beyond the band since ``since`` without a break
        self.since = 0.0

    def step(self, seen: int, now: float, hold_s: float) -> float | None:
        """The side seen in this frame (0: inside the band); when the side flips, the time the new
        side was first seen (the flip's own time), else None."""
        if seen == 0 or seen == self.side:
            self.pending = 0  # back in the band or on the old side: the wait starts again
            return None
        if self.side == 0:
            self.side = seen  # the first side known: where the track comes from, no crossing
            return None
        if seen != self.pending:
            self.pending, self.since = seen, now
        if now - self.since + _EPS < hold_s:
            return None
        self.side, self.pending = seen, 0
        return self.since


def _side(distance: float, band: float) -> int:
    return 1 if distance > band else -1 if distance < -band else 0


class LineCounter:
    """Counts confirmed tracks crossing a line segment ``start`` → ``end``, in and out.

    Direction: walking from ``start`` to ``end`` as drawn on the image, *in* is a crossing from the
    left-hand side to the right-hand side, *out* the other way (a line drawn left to right across
    the image counts downward moves as in; swap the ends to swap in and out).

    The rule (per track): the track's *side* is the last side on which its anchor was beyond the
    band and held (``hold_s``, see the module). A position inside the band, or a frame with no box,
    changes nothing. When the anchor is seen beyond the band on the other side and stays there for
    ``hold_s``, that is one crossing (reported in the frame where it has held, its event's time),
    and the side flips — so a track counts at most once per direction until it has gone back and
    held on the first side. ``trigger="box"``: every corner of the box must be beyond the band (the
    whole box across). An anchor off the segment's ends (projected outside it) makes the side
    unknown again, so walking round the end of a line never counts. A track whose first position is
    inside the band has no side until it leaves the band.
    """

    def __init__(self, name: str, start: Sequence[float], end: Sequence[float], *, band: float = DEFAULT_BAND,
                 band_px: float = 0.0, anchor: str = DEFAULT_ANCHOR, hold_s: float = DEFAULT_HOLD_S,
                 trigger: str = "anchor") -> None:
        _check_common(name, "line", anchor, band, band_px, hold_s, trigger)
        self.name = name
        self.start = _point(start, f"line {name!r}: start")
        self.end = _point(end, f"line {name!r}: end")
        problem = line_problem(name, (*self.start, *self.end))
        if problem:
            raise ValueError(problem)
        self.length = math.dist(self.start, self.end)
        self.band, self.band_px, self.anchor = float(band), float(band_px), anchor
        self.hold_s, self.trigger = float(hold_s), trigger
        self.crossed_in = 0
        self.crossed_out = 0
        self._held: dict[int, _Held] = {}

    @classmethod
    def from_coords(cls, name: str, coords: Sequence[float], **options: Any) -> LineCounter:
        """A line from ``(x1, y1, x2, y2)`` (what ``--line x1,y1,x2,y2`` gives)."""
        if len(coords) != 4:
            raise ValueError(f"line {name!r} needs four numbers x1,y1,x2,y2, not {list(coords)!r}")
        return cls(name, coords[:2], coords[2:], **options)

    def signed_distance(self, point: tuple[float, float]) -> tuple[float, float]:
        """(distance from the line, > 0 on the right-hand side; position along it, 0 at start, 1 at end)."""
        (x1, y1), (x2, y2) = self.start, self.end
        dx, dy = x2 - x1, y2 - y1
        px, py = point[0] - x1, point[1] - y1
        return (dx * py - dy * px) / self.length, (dx * px + dy * py) / (self.length * self.length)

    def update(self, track_id: int, label: str, box: Box, frame_id: int, timestamp: float) -> AnalyticsEvent | None:
        """One confirmed track's box in one frame; the crossing it makes, if any."""
        distance, along = self.signed_distance(anchor_point(box, self.anchor))
        if not 0.0 <= along <= 1.0:
            self._held.pop(track_id, None)
            return None
        band = max(self.band_px, self.band * (box[3] - box[1]))
        side = _side(distance, band) if self.trigger == "anchor" else self._box_side(box, band)
        held = self._held.get(track_id)
        if held is None:
            if side == 0:
                return None
            held = self._held[track_id] = _Held()
        if held.step(side, timestamp, self.hold_s) is None:
            return None
        if held.side > 0:
            self.crossed_in += 1
            direction = "in"
        else:
            self.crossed_out += 1
            direction = "out"
        return AnalyticsEvent(LINE_CROSSED, self.name, track_id, label, frame_id, timestamp,
                              direction=direction, box=tuple(box))

    def _box_side(self, box: Box, band: float) -> int:
        x1, y1, x2, y2 = box
        distances = [self.signed_distance(corner)[0] for corner in ((x1, y1), (x2, y1), (x1, y2), (x2, y2))]
        return 1 if min(distances) > band else -1 if max(distances) < -band else 0

    def miss(self, track_id: int) -> None:
        """A frame without the track's box: a side it was waiting on has not held."""
        held = self._held.get(track_id)
        if held is not None:
            held.pending = 0

    def forget(self, track_id: int) -> None:
        """The track is gone for good: drop its state."""
        self._held.pop(track_id, None)

    def counts(self) -> dict[str, int]:
        return {"in": self.crossed_in, "out": self.crossed_out}


class ZoneCounter:
    """Confirmed tracks in a polygon zone: how many are inside now, entries in all, time inside.

    A track *enters* when its anchor is inside the polygon by more than the band and stays so for
    ``hold_s`` (the event comes in the frame where it has held), and *leaves* when it is outside by
    more than the band for ``hold_s`` or its track is lost (``forget``); in between nothing changes,
    so an anchor jittering on the edge enters once. A track first seen inside enters once it has
    held there. ``trigger="box"``: the whole box must be inside (or outside) by the band. Time inside
    is measured with the frames' timestamps, from the first frame of the entry's hold to the first
    frame of the exit's (or the last frame seen of a lost track).
    """

    def __init__(self, name: str, polygon: Sequence[Sequence[float]], *, band: float = DEFAULT_BAND,
                 band_px: float = 0.0, anchor: str = DEFAULT_ANCHOR, hold_s: float = DEFAULT_HOLD_S,
                 trigger: str = "anchor") -> None:
        _check_common(name, "zone", anchor, band, band_px, hold_s, trigger)
        self.name = name
        try:
            points = list(polygon)
        except TypeError:
            raise ValueError(f"zone {name!r}: the polygon must be a list of points, not {polygon!r}") from None
        self.polygon = tuple(_point(p, f"zone {name!r}: point {i + 1}") for i, p in enumerate(points))
        problem = zone_problem(name, self.polygon)
        if problem:
            raise ValueError(problem)
        self.band, self.band_px, self.anchor = float(band), float(band_px), anchor
        self.hold_s, self.trigger = float(hold_s), trigger
        self.entries = 0
        self._held: dict[int, _Held] = {}  # every track seen, its side: +1 inside, -1 outside
        self._entered: dict[int, float] = {}  # track id → timestamp of its entry, while inside
        self._visits: list[float] = []  # durations of finished visits (the last 1000)
        self._now = 0.0

    def depth(self, point: tuple[float, float]) -> float:
        """Distance from the polygon's boundary: > 0 inside, < 0 outside."""
        distance = min(_segment_distance(point, a, b) for a, b in self._edges())
        return distance if _inside(point, self.polygon) else -distance

    def _edges(self):
        return zip(self.polygon, self.polygon[1:] + self.polygon[:1])

    def update(self, track_id: int, label: str, box: Box, frame_id: int, timestamp: float) -> AnalyticsEvent | None:
        """One confirmed track's box in one frame; the entry or exit it makes, if any."""
        self._now = max(self._now, timestamp)
        band = max(self.band_px, self.band * (box[3] - box[1]))
        if self.trigger == "anchor":
            side = _side(self.depth(anchor_point(box, self.anchor)), band)
        else:
            side = self._box_side(box, band)
        held = self._held.get(track_id)
        if held is None:
            held = self._held[track_id] = _Held(-1)  # every track comes from outside
        since = held.step(side, timestamp, self.hold_s)
        if since is None:
            return None
        if held.side > 0:
            self._entered[track_id] = since
            self.entries += 1
            return AnalyticsEvent(ZONE_ENTERED, self.name, track_id, label, frame_id, timestamp, box=tuple(box))
        return self._leave(track_id, label, frame_id, timestamp, box, since)

    def _box_side(self, box: Box, band: float) -> int:
        x1, y1, x2, y2 = box
        depths = [self.depth(corner) for corner in ((x1, y1), (x2, y1), (x1, y2), (x2, y2))]
        return 1 if min(depths) > band else -1 if max(depths) < -band else 0

    def miss(self, track_id: int) -> None:
        """A frame without the track's box: an entry or exit it was waiting on has not held."""
        held = self._held.get(track_id)
        if held is not None:
            held.pending = 0

    def forget(self, track_id: int, label: str, frame_id: int, timestamp: float,
               box: Box | None = None) -> AnalyticsEvent | None:
        """The track is lost: it leaves the zone (an event) if it was inside."""
        self._held.pop(track_id, None)
        if track_id in self._entered:
            return self._leave(track_id, label, frame_id, timestamp, box, timestamp)
        return None

    def _leave(self, track_id: int, label: str, frame_id: int, timestamp: float, box: Box | None,
               left_at: float) -> AnalyticsEvent:
        dwell = max(0.0, left_at - self._entered.pop(track_id))
        self._visits = [*self._visits[-999:], dwell]
        return AnalyticsEvent(ZONE_LEFT, self.name, track_id, label, frame_id, timestamp, dwell_s=dwell,
                              box=None if box is None else tuple(box))

    def dwell(self, track_id: int) -> float | None:
        """Seconds the track has been inside so far (None when it is not inside)."""
        entered = self._entered.get(track_id)
        return None if entered is None else max(0.0, self._now - entered)

    def counts(self) -> dict[str, Any]:
        visits = self._visits
        return {"inside": len(self._entered), "entries": self.entries,
                "dwell_s": {str(t): round(max(0.0, self._now - e), 3) for t, e in self._entered.items()},
                "mean_visit_s": round(sum(visits) / len(visits), 3) if visits else None}


def _inside(point: tuple[float, float], polygon: Sequence[tuple[float, float]]) -> bool:
    x, y = point
    inside = False
    for (x1, y1), (x2, y2) in zip(polygon, [*polygon[1:], polygon[0]]):
        if (y1 > y) != (y2 > y) and x < x1 + (y - y1) * (x2 - x1) / (y2 - y1):
            inside = not inside
    return inside


def _segment_distance(p: tuple[float, float], a: tuple[float, float], b: tuple[float, float]) -> float:
    ax, ay = a
    dx, dy = b[0] - ax, b[1] - ay
    length2 = dx * dx + dy * dy
    t = 0.0 if length2 == 0 else max(0.0, min(1.0, ((p[0] - ax) * dx + (p[1] - ay) * dy) / length2))
    return math.hypot(p[0] - ax - t * dx, p[1] - ay - t * dy)


def counter_names(texts: Sequence[str], prefix: str) -> list[str]:
    """The names of ``lines`` / ``zones`` option entries (``prefix`` ``line`` / ``zone`` names the unnamed)."""
    return text_names(texts, prefix)


def named_regions(lines: Sequence[str], zones: Sequence[str]) -> tuple[dict[str, tuple[float, float, float, float]],
                                                                       dict[str, list[tuple[float, float]]]]:
    """The ``lines`` and ``zones`` options (``"[NAME=]x1,y1,x2,y2"``, ``"[NAME=]x1,y1,x2,y2,x3,y3,..."``) by name,
    read and checked as every line and zone is (``_regions.parse_regions``): ValueError in its words, naming the line
    or zone."""
    line_pairs, zone_pairs = parse_regions(lines, zones)
    return dict(line_pairs), dict(zone_pairs)
