"""What the model sees, drawn on the frame: the one drawing the live view, ``run --preview`` and evidence use.

:func:`annotate` draws a frame's result — boxes with label, score and track id, keypoints (COCO's 17 joined by
COCO's 19 limbs, other counts as points; a keypoint under ``KEYPOINT_VISIBLE`` is not drawn, nor its limbs),
instance masks, oriented boxes, the top classes of a classifier — and the stream's counting lines and zones with
their counts, on a copy of the frame (scaled to ``width`` at most first, so drawing costs what the output size
costs).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .._samples import COCO_SKELETON, KEYPOINT_VISIBLE, skeleton_for

if TYPE_CHECKING:
    import numpy as np

#: BGR colours: one per class id (cycled), lines and zones in their own
_PALETTE = ((56, 56, 255), (151, 157, 255), (31, 112, 255), (29, 178, 255), (49, 210, 207), (10, 249, 72),
            (23, 204, 146), (134, 219, 61), (52, 147, 26), (187, 212, 0), (168, 153, 44), (255, 194, 0),
            (147, 69, 52), (255, 115, 100), (236, 24, 0), (255, 56, 132), (133, 0, 82), (255, 56, 203))
LINE_COLOUR = (0, 215, 255)
ZONE_COLOUR = (255, 160, 40)
TEXT_COLOUR = (255, 255, 255)
#: BGR colours of COCO's limbs by body part, in ``COCO_SKELETON``'s order (Ultralytics' pose colours): legs,
#: torso, arms, face
LEG_COLOUR, TORSO_COLOUR, ARM_COLOUR, FACE_COLOUR = (255, 153, 51), (255, 51, 255), (0, 128, 255), (0, 255, 0)
COCO_LIMB_COLOURS = (LEG_COLOUR,) * 4 + (TORSO_COLOUR,) * 3 + (ARM_COLOUR,) * 5 + (FACE_COLOUR,) * 7


@dataclass(frozen=True)
class Geometry:
    """A stream's counting lines ``name -> (x1, y1, x2, y2)`` and zones ``name -> [(x, y), ...]``, source pixels."""

    lines: Mapping[str, tuple[float, float, float, float]]
    zones: Mapping[str, Sequence[tuple[float, float]]]

    @classmethod
    def of(cls, analytics: Any) -> Geometry:
        """The lines and zones of a :class:`~.analytics.StreamAnalytics` (an empty geometry for None)."""
        if analytics is None:
            return cls({}, {})
        return cls({line.name: (*line.start, *line.end) for line in analytics.lines},
                   {zone.name: tuple(zone.polygon) for zone in analytics.zones})


def colour(class_id: int) -> tuple[int, int, int]:
    return _PALETTE[class_id % len(_PALETTE)]


def annotate(frame: np.ndarray, result: Any, *, geometry: Geometry | None = None,
             counts: Mapping[str, Any] | None = None, width: int | None = None,
             highlight: str | None = None, source_width: int | None = None) -> np.ndarray:
    """A new BGR image: ``frame`` (scaled down to ``width`` at most) with ``result`` drawn on it, and the
    ``geometry``'s lines and zones with their ``counts`` (StreamAnalytics.counts()); ``highlight`` names a
    line or zone drawn thicker (the one an event is about). ``source_width``: the width of the frames the
    result and geometry are in, when ``frame`` is the same view at another size (a record stream, or a frame
    decoded at a reduced scale: no need to enlarge it first)."""
    import cv2

    scale = 1.0
    if width is not None and frame.shape[1] > width:
        scale = width / frame.shape[1]
        canvas = cv2.resize(frame, (width, max(1, round(frame.shape[0] * scale))), interpolation=cv2.INTER_AREA)
    else:
        canvas = frame.copy()
    if source_width:
        scale = canvas.shape[1] / source_width
    thickness = max(1, round(canvas.shape[1] / 400))
    if geometry is not None:
        _geometry(canvas, geometry, counts or {}, scale, thickness, highlight)
    if isinstance(result, list):
        _classes(canvas, result, thickness)
    elif result is not None and hasattr(result, "items"):
        for detection in result:
            _detection(canvas, detection, scale, thickness)
    return canvas


def _text_size(text: str, thickness: int) -> tuple[int, int, int]:
    """(width, height, baseline) of ``text`` as :func:`_text` draws it."""
    import cv2

    (w, h), base = cv2.getTextSize(text, cv2.FONT_HERSHEY_SIMPLEX, 0.45 * thickness, thickness)
    return w, h, base


def _text(canvas: np.ndarray, text: str, origin: tuple[int, int], background: tuple[int, int, int],
          thickness: int) -> None:
    """``text`` on its background, its bottom-left corner at ``origin``, moved as little as it takes to lie wholly
    inside the canvas."""
    import cv2

    w, h, base = _text_size(text, thickness)
    x = min(max(0, origin[0]), max(0, canvas.shape[1] - w - 2))
    y = min(max(h + base + 2, origin[1]), canvas.shape[0])
    cv2.rectangle(canvas, (x, y - h - base - 2), (x + w + 2, y), background, -1)
    cv2.putText(canvas, text, (x + 1, y - base), cv2.FONT_HERSHEY_SIMPLEX, 0.45 * thickness, TEXT_COLOUR, thickness,
                cv2.LINE_AA)


def _pt(x: float, y: float, scale: float) -> tuple[int, int]:
    return round(x * scale), round(y * scale)


def _detection(canvas: np.ndarray, detection: Any, scale: float, thickness: int) -> None:
    import cv2
    import numpy as np

    tint = colour(detection.class_id)
    if detection.mask is not None:
        _mask(canvas, detection.mask, scale, tint)
    if detection.rotated is not None:
        cx, cy, w, h, angle = detection.rotated
        corners = cv2.boxPoints(((cx * scale, cy * scale), (w * scale, h * scale), math.degrees(angle)))
        cv2.polylines(canvas, [np.round(corners).astype(np.int32)], True, tint, thickness, cv2.LINE_AA)
    else:
        x1, y1, x2, y2 = detection.box
        cv2.rectangle(canvas, _pt(x1, y1, scale), _pt(x2, y2, scale), tint, thickness, cv2.LINE_AA)
    if detection.keypoints:
        _keypoints(canvas, detection.keypoints, scale, thickness, tint)
    track = f"#{detection.track_id} " if detection.track_id is not None else ""
    x1, y1 = detection.box[:2]
    _text(canvas, f"{track}{detection.label} {detection.score:.2f}", _pt(x1, y1, scale), tint, thickness)


def _keypoints(canvas: np.ndarray, keypoints: Sequence[Any], scale: float, thickness: int,
               tint: tuple[int, int, int]) -> None:
    """The seen keypoints as points, and the limbs between two seen ones (COCO's 17: COCO's skeleton)."""
    import cv2

    seen = [_pt(k.x, k.y, scale) if k.score >= KEYPOINT_VISIBLE else None for k in keypoints]
    skeleton = skeleton_for(len(keypoints))
    for index, (a, b) in enumerate(skeleton):
        start, end = seen[a], seen[b]
        if start is not None and end is not None:
            limb = COCO_LIMB_COLOURS[index] if skeleton is COCO_SKELETON else tint
            cv2.line(canvas, start, end, limb, thickness + 1, cv2.LINE_AA)
    for point in seen:
        if point is not None:
            cv2.circle(canvas, point, thickness + 2, tint, -1, cv2.LINE_AA)


def _mask(canvas: np.ndarray, mask: Any, scale: float, tint: tuple[int, int, int]) -> None:
    import cv2
    import numpy as np

    h, w = mask.pixels.shape
    x0, y0 = round(mask.x * scale), round(mask.y * scale)
    size = (max(1, round(w * scale)), max(1, round(h * scale)))
    pixels = cv2.resize(mask.pixels.astype(np.uint8), size, interpolation=cv2.INTER_NEAREST).astype(bool)
    region = canvas[y0:y0 + size[1], x0:x0 + size[0]]
    pixels = pixels[:region.shape[0], :region.shape[1]]
    region[pixels] = (region[pixels] * 0.5 + np.array(tint) * 0.5).astype(np.uint8)


def _classes(canvas: np.ndarray, classes: list[Any], thickness: int) -> None:
    y = 0
    for item in classes[:3]:
        y += round(18 * thickness)
        _text(canvas, f"{item.label} {item.score:.2f}", (4, y), (40, 40, 40), thickness)


def _geometry(canvas: np.ndarray, geometry: Geometry, counts: Mapping[str, Any], scale: float, thickness: int,
              highlight: str | None) -> None:
    import cv2
    import numpy as np

    line_counts, zone_counts = counts.get("lines", {}), counts.get("zones", {})
    for name, polygon in geometry.zones.items():
        points = np.array([_pt(x, y, scale) for x, y in polygon], np.int32)
        width = thickness * (3 if name == highlight else 1)
        cv2.polylines(canvas, [points], True, ZONE_COLOUR, width, cv2.LINE_AA)
        zone = zone_counts.get(name, {})
        label = f"{name}: {zone.get('inside', 0)} in, {zone.get('entries', 0)} entries" if zone else name
        w, h, base = _text_size(label, thickness)
        cx, cy = _centroid([(x * scale, y * scale) for x, y in polygon])
        _text(canvas, label, (round(cx - w / 2), round(cy + (h + base) / 2)), ZONE_COLOUR, thickness)
    for name, (x1, y1, x2, y2) in geometry.lines.items():
        start, end = _pt(x1, y1, scale), _pt(x2, y2, scale)
        cv2.line(canvas, start, end, LINE_COLOUR, thickness * (3 if name == highlight else 2), cv2.LINE_AA)
        line = line_counts.get(name, {})
        label = f"{name}: in {line.get('in', 0)} / out {line.get('out', 0)}" if line else name
        _text(canvas, label, _beside(start, end, _text_size(label, thickness), 4 * thickness), LINE_COLOUR, thickness)


# Labels sit inside the frame, clear of the ends and corners where the editor's handles are (``_text`` keeps them
# inside): a zone's at its middle, a line's beside its middle.
def _centroid(polygon: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """The polygon's centre of area (the mean of its points when it has none)."""
    closed = [*polygon[1:], polygon[0]]
    cross = [ax * by - bx * ay for (ax, ay), (bx, by) in zip(polygon, closed)]
    area = sum(cross) / 2
    if abs(area) < 1e-9:
        return sum(x for x, _ in polygon) / len(polygon), sum(y for _, y in polygon) / len(polygon)
    cx = sum((ax + bx) * c for (ax, _), (bx, _), c in zip(polygon, closed, cross)) / (6 * area)
    cy = sum((ay + by) * c for (_, ay), (_, by), c in zip(polygon, closed, cross)) / (6 * area)
    return cx, cy


def _beside(start: tuple[int, int], end: tuple[int, int], size: tuple[int, int, int], gap: int) -> tuple[int, int]:
    """Where a line's label goes (its bottom-left corner): above the middle of a line that runs across, right of
    the middle of one that runs up or down."""
    w, h, base = size
    mx, my = (start[0] + end[0]) / 2, (start[1] + end[1]) / 2
    if abs(end[0] - start[0]) >= abs(end[1] - start[1]):
        return round(mx - w / 2), round(my - gap)
    return round(mx + gap), round(my + (h + base) / 2)
