"""The form of a pipeline's counting lines and zones, defined once for everything that takes them
(docs/analytics.md): ``PipelineOptions`` (agent.yaml's ``lines`` / ``zones``, ``--line`` / ``--zone``), the
counters themselves (``pipeline/zones.py``), the device's ``set_analytics`` command
(``agent/analytics_command.py``), the fleet manager's ``AnalyticsSpec`` (``fleet/schemas.py``, so the OpenAPI
document carries the pattern and the bounds), the dashboard's editor (which takes them from that document) and the
check of a device's configuration document (``link/config_document.py``, its schema ``link/config_schema.py``),
which the fleet manager, agent.yaml's reader and a device's configuration revision run.

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

- **the text form** (agent.yaml's ``lines`` / ``zones``, ``--line`` / ``--zone``): ``"[NAME=]x1,y1,x2,y2"`` and
  ``"[NAME=]x1,y1,x2,y2,x3,y3,..."``, numbers separated by ``,`` or ``;``; :func:`parse_regions` reads a list of
  them (an unnamed one is ``line1``, ``zone2``, ... by its place) and checks them as above.
  :data:`LINE_TEXT_PATTERN` / :data:`ZONE_TEXT_PATTERN` are that form as patterns, and :func:`text_rule` gives them
  with the bounds and the words as ``PipelineOptions`` field metadata, from which the configuration document's
  schema (``link/config_schema.py``) states them.

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
#: a line read from text (x1, y1, x2, y2), a zone's points
LineCoords = tuple[float, float, float, float]
ZonePoints = list[tuple[float, float]]

# The text form. Its patterns accept exactly what parse_regions reads (a test holds them to it): each part between
# "," / ";" one NUMBER (empty parts skipped), an optional NAME= in front; the bounds and shapes are checked after.
#: a number of the text form (its value's bounds are checked once read)
NUMBER_PATTERN = r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?"
_NUMBER = re.compile(NUMBER_PATTERN)
_SEPARATOR = r"(?:\s*[,;])+\s*"
_TEXT_START = rf"^\s*(?:{NAME_PATTERN[1:-1]}\s*=)?[\s,;]*"
_POINT = rf"{NUMBER_PATTERN}{_SEPARATOR}{NUMBER_PATTERN}"
#: a line as text: ``"[NAME=]x1,y1,x2,y2"``
LINE_TEXT_PATTERN = rf"{_TEXT_START}{NUMBER_PATTERN}(?:{_SEPARATOR}{NUMBER_PATTERN}){{3}}[\s,;]*$"
#: a zone as text: ``"[NAME=]x1,y1,x2,y2,x3,y3[,...]"``, MIN_ZONE_POINTS to MAX_ZONE_POINTS points
ZONE_TEXT_PATTERN = (rf"{_TEXT_START}{_POINT}(?:{_SEPARATOR}{_POINT}){{{MIN_ZONE_POINTS - 1},{MAX_ZONE_POINTS - 1}}}"
                     r"[\s,;]*$")
_OPTIONAL_NAME = f"NAME= optional, {NAME_FORM}"
#: the text forms in words (what a document's check says of a text that is not one)
LINE_TEXT_FORM = f'"NAME=x1,y1,x2,y2": four numbers, source pixels 0 to {MAX_COORDINATE}; {_OPTIONAL_NAME}'
ZONE_TEXT_FORM = (f'"NAME=x1,y1,x2,y2,x3,y3,...": {MIN_ZONE_POINTS} to {MAX_ZONE_POINTS} points x,y, source pixels '
                  f"0 to {MAX_COORDINATE}; {_OPTIONAL_NAME}")


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


# ------------------------------------------------------------------------------------------------ the text form

def text_rule(kind: str) -> dict[str, Any]:
    """The ``lines`` (``kind`` "line") or ``zones`` ("zone") option's form as field metadata: the most entries, an
    entry's pattern and the form in words (``PipelineOptions``; the configuration document's schema states them)."""
    if kind == "line":
        return {"maxItems": MAX_LINES, "pattern": LINE_TEXT_PATTERN, "form": LINE_TEXT_FORM, "item": "line"}
    return {"maxItems": MAX_ZONES, "pattern": ZONE_TEXT_PATTERN, "form": ZONE_TEXT_FORM, "item": "zone"}


def named_text(text: str, default: str) -> tuple[str, str]:
    """``"NAME=1,2,3,4"`` -> ("NAME", "1,2,3,4") (the name's spaces at either end dropped); an unnamed entry gets
    ``default``."""
    name, sep, rest = text.partition("=")
    return (name.strip(), rest) if sep and name.strip() else (default, text)


def text_names(texts: Sequence[str], prefix: str) -> list[str]:
    """The names of ``lines`` / ``zones`` entries (``prefix`` ``line`` / ``zone`` names the unnamed by place)."""
    return [named_text(text, f"{prefix}{i + 1}")[0] for i, text in enumerate(texts)]


def _numbers(text: str, what: str) -> list[float]:
    parts = [part.strip() for part in text.replace(";", ",").split(",")]
    if not all(_NUMBER.fullmatch(part) for part in parts if part):
        raise ValueError(f"{what}: {text!r} is not a list of numbers")
    return [float(part) for part in parts if part]


def parse_line(text: str) -> LineCoords:
    """``"x1,y1,x2,y2"`` (``--line``) -> four numbers."""
    values = _numbers(text, "a line")
    if len(values) != 4:
        raise ValueError(f"a line is x1,y1,x2,y2 (four numbers), not {text!r}")
    return values[0], values[1], values[2], values[3]


def parse_zone(text: str) -> ZonePoints:
    """``"x1,y1,x2,y2,x3,y3,..."`` (``--zone``; ``;`` may separate points) -> the polygon's points."""
    values = _numbers(text, "a zone")
    if len(values) % 2 or len(values) < 2 * MIN_ZONE_POINTS:
        raise ValueError(f"a zone is x1,y1,x2,y2,x3,y3[,...] (at least {MIN_ZONE_POINTS} points), not {text!r}")
    return list(zip(values[0::2], values[1::2]))


def parse_regions(lines: Sequence[str], zones: Sequence[str]) -> tuple[list[tuple[str, LineCoords]],
                                                                       list[tuple[str, ZonePoints]]]:
    """The ``lines`` and ``zones`` options' texts as (name, shape) pairs, checked as every line and zone is
    (:func:`check_regions`): ValueError in its words, naming the line or zone."""
    line_pairs = [(name, parse_line(text)) for name, text in
                  (named_text(t, f"line{i + 1}") for i, t in enumerate(lines))]
    zone_pairs = [(name, parse_zone(text)) for name, text in
                  (named_text(t, f"zone{i + 1}") for i, t in enumerate(zones))]
    check_regions(line_pairs, zone_pairs)
    return line_pairs, zone_pairs
