"""Line crossings with hysteresis and polygon zones, counted per confirmed track (docs/analytics.md).

Both counters see one point per tracked box, its *anchor* (bottom centre by default: where a
person or a car touches the ground), and a *band* around their boundary: a position inside the
band changes nothing, so a box jittering or flickering on a line or a zone's edge is never a
crossing; only a move from beyond the band on one side to beyond it on the other is.
The band is ``max(band_px, band * box height)`` pixels, so it grows with the object (near objects
jitter more in pixels).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

#: anchor name → (fraction of the width, fraction of the height) from the box's top-left corner
ANCHORS: dict[str, tuple[float, float]] = {
    "bottom_center": (0.5, 1.0), "center": (0.5, 0.5), "top_center": (0.5, 0.0),
    "left_center": (0.0, 0.5), "right_center": (1.0, 0.5),
    "bottom_left": (0.0, 1.0), "bottom_right": (1.0, 1.0), "top_left": (0.0, 0.0), "top_right": (1.0, 0.0),
}
DEFAULT_ANCHOR = "bottom_center"
#: the band's default share of the box height
DEFAULT_BAND = 0.1

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

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"kind": self.kind, "name": self.name, "track_id": self.track_id,
                                "label": self.label, "frame_id": self.frame_id,
                                "timestamp": round(self.timestamp, 6)}
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


def _check_common(name: str, what: str, anchor: str, band: float, band_px: float) -> None:
    if not isinstance(name, str) or not name:
        raise ValueError(f"a {what} needs a non-empty name, not {name!r}")
    if anchor not in ANCHORS:
        raise ValueError(f"{what} {name!r}: anchor {anchor!r} is not one of {', '.join(ANCHORS)}")
    if not (band >= 0 and band_px >= 0 and math.isfinite(band) and math.isfinite(band_px)):
        raise ValueError(f"{what} {name!r}: band ({band!r}) and band_px ({band_px!r}) must be finite and >= 0")


class LineCounter:
    """Counts confirmed tracks crossing a line segment ``start`` → ``end``, in and out.

    Direction: walking from ``start`` to ``end`` as drawn on the image, *in* is a crossing from the
    left-hand side to the right-hand side, *out* the other way (a line drawn left to right across
    the image counts downward moves as in; swap the ends to swap in and out).

    The rule (per track): the track's *side* is the last side on which its anchor was beyond the
    band. A position inside the band, or a frame with no box, changes nothing. When the anchor is
    next seen beyond the band on the other side, that is one crossing, and the side flips — so a
    track counts at most once per direction until it has gone back beyond the band on the first
    side. An anchor off the segment's ends (projected outside it) makes the side unknown again, so
    walking round the end of a line never counts. A track whose first position is inside the band
    has no side until it leaves the band.
    """

    def __init__(self, name: str, start: Sequence[float], end: Sequence[float], *, band: float = DEFAULT_BAND,
                 band_px: float = 0.0, anchor: str = DEFAULT_ANCHOR) -> None:
        _check_common(name, "line", anchor, band, band_px)
        self.name = name
        self.start = _point(start, f"line {name!r}: start")
        self.end = _point(end, f"line {name!r}: end")
        self.length = math.dist(self.start, self.end)
        if self.length < 1.0:
            raise ValueError(f"line {name!r}: start {self.start} and end {self.end} are less than one pixel "
                             "apart — a line needs two distinct points")
        self.band, self.band_px, self.anchor = float(band), float(band_px), anchor
        self.crossed_in = 0
        self.crossed_out = 0
        self._side: dict[int, int] = {}

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
            self._side.pop(track_id, None)
            return None
        band = max(self.band_px, self.band * (box[3] - box[1]))
        side = 1 if distance > band else -1 if distance < -band else 0
        if side == 0:
            return None
        previous = self._side.get(track_id)
        self._side[track_id] = side
        if previous is None or previous == side:
            return None
        if side > 0:
            self.crossed_in += 1
            direction = "in"
        else:
            self.crossed_out += 1
            direction = "out"
        return AnalyticsEvent(LINE_CROSSED, self.name, track_id, label, frame_id, timestamp,
                              direction=direction, box=tuple(box))

    def forget(self, track_id: int) -> None:
        """The track is gone for good: drop its state."""
        self._side.pop(track_id, None)

    def counts(self) -> dict[str, int]:
        return {"in": self.crossed_in, "out": self.crossed_out}


class ZoneCounter:
    """Confirmed tracks in a polygon zone: how many are inside now, entries in all, time inside.

    A track *enters* when its anchor is inside the polygon by more than the band, and *leaves* when
    it is outside by more than the band or its track is lost (``forget``); in between nothing
    changes, so an anchor jittering on the edge enters once. A track first seen inside enters then.
    Time inside is measured with the frames' timestamps.
    """

    def __init__(self, name: str, polygon: Sequence[Sequence[float]], *, band: float = DEFAULT_BAND,
                 band_px: float = 0.0, anchor: str = DEFAULT_ANCHOR) -> None:
        _check_common(name, "zone", anchor, band, band_px)
        self.name = name
        try:
            points = list(polygon)
        except TypeError:
            raise ValueError(f"zone {name!r}: the polygon must be a list of points, not {polygon!r}") from None
        if len(points) < 3:
            raise ValueError(f"zone {name!r}: a polygon needs at least 3 points, not {len(points)}")
        self.polygon = tuple(_point(p, f"zone {name!r}: point {i}") for i, p in enumerate(points))
        if abs(_area(self.polygon)) < 1.0:
            raise ValueError(f"zone {name!r}: the polygon {self.polygon} encloses no area (its points are on a line)")
        self.band, self.band_px, self.anchor = float(band), float(band_px), anchor
        self.entries = 0
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
        depth = self.depth(anchor_point(box, self.anchor))
        band = max(self.band_px, self.band * (box[3] - box[1]))
        if depth > band and track_id not in self._entered:
            self._entered[track_id] = timestamp
            self.entries += 1
            return AnalyticsEvent(ZONE_ENTERED, self.name, track_id, label, frame_id, timestamp, box=tuple(box))
        if depth < -band and track_id in self._entered:
            return self._leave(track_id, label, frame_id, timestamp, box)
        return None

    def forget(self, track_id: int, label: str, frame_id: int, timestamp: float,
               box: Box | None = None) -> AnalyticsEvent | None:
        """The track is lost: it leaves the zone (an event) if it was inside."""
        if track_id in self._entered:
            return self._leave(track_id, label, frame_id, timestamp, box)
        return None

    def _leave(self, track_id: int, label: str, frame_id: int, timestamp: float, box: Box | None) -> AnalyticsEvent:
        dwell = max(0.0, timestamp - self._entered.pop(track_id))
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


def _area(polygon: Sequence[tuple[float, float]]) -> float:
    return 0.5 * sum(x1 * y2 - x2 * y1 for (x1, y1), (x2, y2) in zip(polygon, [*polygon[1:], polygon[0]]))


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
    return [_named(text, f"{prefix}{i + 1}")[0] for i, text in enumerate(texts)]


def _named(text: str, default: str) -> tuple[str, str]:
    """``"NAME=1,2,3,4"`` -> ("NAME", "1,2,3,4"); an unnamed entry gets ``default``."""
    name, sep, rest = text.partition("=")
    return (name.strip(), rest) if sep and name.strip() else (default, text)
