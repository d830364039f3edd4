"""The form of a pipeline's counting lines and zones, defined once for everything that takes them
(docs/analytics.md): ``PipelineOptions`` (agent.yaml's ``lines`` / ``zones``, ``--line`` / ``--zone``), the
counters themselves (``pipeline/zones.py``), the device's ``set_analytics`` command
(``agent/analytics_command.py``), the fleet manager's ``AnalyticsSpec`` (``fleet/schemas.py``, so the OpenAPI
document carries the pattern and the bounds) and the dashboard's editor (which takes them from that document).

- **which tasks take them**: :data:`BOX_TASKS`, every task whose results are boxes (``pipeline/tasks.py``'s
  ``Task.boxes`` is derived from it); :func:`task_problem` says so in words.
- **a name** (:data:`NAME_PATTERN`, :data:`NAME_FORM`): 1-64 of the letters A-Z a-z, digits, spaces and
  ``. _ -``, no space at either end — a person names a line "front door"; an event rule names it after ``:``
  (``line_crossed:front door/person``), so ``:``, ``/``, ``,`` and ``=`` (agent.yaml's ``NAME=x1,y1,...``) are
  not in it.
- **a line**: four finite numbers ``x1, y1, x2, y2`` in source pixels (0 to :data:`MAX_COORDINATE`), its ends
  at least :data:`MIN_LINE_LENGTH` pixel apart.
- **a zone**: :data:`MIN_ZONE_POINTS` to :data:`MAX_ZONE_POINTS` points ``(x, y)`` (a point may repeat, as in a
  polygon written closed), at least 3 of them distinct, enclosing :data:`MIN_ZONE_AREA` square pixel at least.
- **a stream's set**: at most :data:`MAX_LINES` lines and :data:`MAX_ZONES` zones, every name used once across
  lines and zones (an event names one by its name alone).

Whether a point lies inside the frame is not the form's to say: the frame's size is known only to the device
once it has seen a frame, and to the manager from the last live frame (both check it then).
Plain constants and small functions, standard library only: the fleet manager loads it without numpy.
"""

from __future__ import annotations

import math
import numbers
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

#: the tasks whose results are boxes: the ones that track and take lines and zones
BOX_TASKS = ("detect", "pose", "segment", "obb")
#: a line's or a zone's name (JSON Schema / ECMAScript / Python alike)
NAME_PATTERN = r"^[A-Za-z0-9._-](?:[A-Za-z0-9 ._-]{0,62}[A-Za-z0-9._-])?$"
NAME = re.compile(NAME_PATTERN.replace("$", r"\Z"))
#: the longest name
MAX_NAME = 64
#: what a name is, in words (the API's 400 and the dashboard say this, never the pattern)
NAME_FORM = "a name: 1-64 letters A-Z a-z, digits, spaces and . _ - (no space at either end)"
#: a coordinate is a pixel of the source frame: from 0 to this (the largest frame side edgeinfer takes)
MAX_COORDINATE = 16384
MIN_LINE_LENGTH = 1.0
MIN_ZONE_POINTS = 3
MAX_ZONE_POINTS = 64
MIN_ZONE_AREA = 1.0
#: at most this many lines, and this many zones, on one stream
MAX_LINES = 32
MAX_ZONES = 32

#: named shapes: a mapping, or (name, shape) pairs (agent.yaml's list may name one twice)
Named = Mapping[str, Any] | Iterable[tuple[str, Any]]


def task_problem(task: str | None, what: str = "lines and zones") -> str | None:
    """Why a pipeline of ``task`` takes no lines and zones (None: it does, or its task is not known yet)."""
    if task is None or task in BOX_TASKS:
        return None
    return f"{what} need a task with boxes ({', '.join(BOX_TASKS)}), not {task!r}"


def name_problem(name: Any, kind: str) -> str | None:
    """Why ``name`` cannot name a ``kind`` ("line" / "zone"), in words; None when it can."""
    if isinstance(name, str) and NAME.match(name):
        return None
    return f"{kind} {name!r} is not {NAME_FORM}"


def _coordinate_problem(value: Any, where: str) -> str | None:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return f"{where}: {value!r} is not a number"
    if not 0 <= value <= MAX_COORDINATE:  # NaN fails too
        return f"{where}: coordinates are source pixels from 0 to {MAX_COORDINATE}, not {value!r}"
    return None


def line_problem(name: str, coords: Any) -> str | None:
    """Why ``coords`` (x1, y1, x2, y2) is no line, in words naming it; None when it is one."""
    if isinstance(coords, (str, bytes)) or not isinstance(coords, Sequence) or len(coords) != 4:
        return f"line {name!r} needs four numbers x1, y1, x2, y2, not {coords!r}"
    for value in coords:
        problem = _coordinate_problem(value, f"line {name!r}")
        if problem:
            return problem
    if math.dist(coords[:2], coords[2:]) < MIN_LINE_LENGTH:
        return f"line {name!r} has no length: its ends must be {MIN_LINE_LENGTH:g} pixel apart at least"
    return None


def zone_problem(name: str, points: Any) -> str | None:
    """Why ``points`` ([(x, y), ...]) is no zone, in words naming it; None when it is one."""
    if isinstance(points, (str, bytes)) or not isinstance(points, Sequence):
        return f"zone {name!r} needs a list of points [x, y], not {points!r}"
    if len(points) < MIN_ZONE_POINTS:
        return f"zone {name!r} needs at least {MIN_ZONE_POINTS} points, not {len(points)}"
    if len(points) > MAX_ZONE_POINTS:
        return f"zone {name!r} has at most {MAX_ZONE_POINTS} points, not {len(points)}"
    for index, point in enumerate(points):
        if isinstance(point, (str, bytes)) or not isinstance(point, Sequence) or len(point) != 2:
            return f"zone {name!r}: point {index + 1} is not [x, y] but {point!r}"
        for value in point:
            problem = _coordinate_problem(value, f"zone {name!r}")
            if problem:
                return problem
    if len({(float(x), float(y)) for x, y in points}) < MIN_ZONE_POINTS:
        return f"zone {name!r} needs {MIN_ZONE_POINTS} distinct points"
    if abs(polygon_area(points)) < MIN_ZONE_AREA:
        return f"zone {name!r} encloses no area: its points are on one line"
    return None


def polygon_area(points: Sequence[Sequence[float]]) -> float:
    """The signed area of a polygon (the shoelace formula): > 0 when its points run anticlockwise in y-up axes."""
    closed = [*points[1:], points[0]]
    return 0.5 * sum(a[0] * b[1] - b[0] * a[1] for a, b in zip(points, closed))


def _pairs(named: Named) -> list[tuple[str, Any]]:
    return list(named.items()) if isinstance(named, Mapping) else list(named)


def regions_problem(lines: Named, zones: Named) -> str | None:
    """The first reason these lines (x1, y1, x2, y2) and zones ([(x, y), ...]) cannot be one stream's, in
    words naming the line or zone; None when they can."""
    line_pairs, zone_pairs = _pairs(lines), _pairs(zones)
    for kind, pairs, most in (("line", line_pairs, MAX_LINES), ("zone", zone_pairs, MAX_ZONES)):
        if len(pairs) > most:
            return f"at most {most} {kind}s, not {len(pairs)}"
    seen: set[str] = set()
    for kind, name in [("line", n) for n, _ in line_pairs] + [("zone", n) for n, _ in zone_pairs]:
        problem = name_problem(name, kind)
        if problem:
            return problem
        if name in seen:
            return f"the name {name!r} is used twice: each line and zone needs a name of its own"
        seen.add(name)
    for name, coords in line_pairs:
        problem = line_problem(name, coords)
        if problem:
            return problem
    for name, points in zone_pairs:
        problem = zone_problem(name, points)
        if problem:
            return problem
    return None


def check_regions(lines: Named, zones: Named) -> None:
    """ValueError with :func:`regions_problem`'s words when these lines and zones cannot be one stream's."""
    problem = regions_problem(lines, zones)
    if problem:
        raise ValueError(problem)
