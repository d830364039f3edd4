"""A generated clip with known ground truth for tracking, line and zone counting (tests/pipeline/test_tracking.py).

Faces cut out of the shared photos (Grace Hopper; two of the four in ``face.jpg``) are pasted onto
``kite_and_cold.jpg`` (no face in it, by Ultraface) and moved along scripted paths, each in its own
lane so that no two boxes overlap. One vertical line at x = 320 (drawn bottom to top, so moving
right is *in*) and one zone on the right of the two upper lanes:

* **A** (lane 0, Grace Hopper): left → right across the line (in), into the zone, waits, back
  right → left (out), out of the zone: a real back-and-forth.
* **B** (lane 1, face.jpg): waits on the left, walks up to the line, *flickers on it* — its box
  jumps to and fro across the line inside the band and is missing from three frames — then goes on
  to the right (in) and into the zone, where the clip ends.
* **C** (lane 2, face.jpg): stands on the line all clip long, jittering a few pixels across it.
* **ghosts**: a face that blinks — two frames on one side of the line, one frame missing, one frame
  on the other side — the way detector noise looks, not an object (lane 1 while B waits on the
  left: in; lane 0 while A is back on the left: out). A tentative track dies on its first miss, so
  with ``min_hits=3`` they never become tracks; counting tentative tracks counts them.

Ground truth (``SCENE_TRUTH``): in 2 (A, B), out 1 (A); zone entries 2 (A, B), inside at the end 1
(B); A's time in the zone ~1.8 s (``A_ZONE_FRAMES``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

import numpy as np

from .assets import IMAGES

SIZE = (640, 480)
FPS = 30.0
FRAMES = 150
#: the counting line (x1, y1, x2, y2): vertical at x = 320, drawn upwards, so left → right is "in"
LINE = (320.0, 470.0, 320.0, 10.0)
#: the zone: the right part of lanes 0 and 1
ZONE = [(420.0, 10.0), (630.0, 10.0), (630.0, 330.0), (420.0, 330.0)]
#: the lanes' centre heights
LANES = (90, 240, 390)
#: the band the scene is built around: 0.1 of a ~110 px face box = 11 px; jitters stay within ±7 px
BAND = 0.1
SCENE_TRUTH = {"in": 2, "out": 1, "zone_entries": 2, "zone_inside_at_end": 1}
#: first frame A is inside the zone by more than the band, and first frame it is outside again (approx.)
A_ZONE_FRAMES = (40, 94)

# the face patches: (photo, crop box with a margin round the face, scale)
_PATCHES = {
    "hopper": ("grace_hopper.bmp", (140, 85, 385, 355), 0.5),
    "face_left": ("face.jpg", (110, 50, 250, 230), 0.8),
    "face_right": ("face.jpg", (235, 25, 375, 195), 0.8),
}

Position = tuple[float, float] | None


def _lerp(keys: list[tuple[int, float]], frame: int) -> float:
    """Piecewise-linear x through (frame, x) keys, held before the first and after the last."""
    if frame <= keys[0][0]:
        return keys[0][1]
    for (f0, x0), (f1, x1) in pairwise(keys):
        if f0 <= frame <= f1:
            return x0 + (x1 - x0) * (frame - f0) / (f1 - f0)
    return keys[-1][1]


def _path_a(frame: int) -> Position:
    return _lerp([(0, 100), (50, 520), (80, 520), (130, 100)], frame), LANES[0]


# B's flicker on the line: patch centre x per frame (None: not in the frame); Ultraface's box centre for
# these faces sits ~3 px left of the patch's, so the anchors stay within ±7 px of x = 320
_B_FLICKER = {75: 317, 76: 324, 77: 329, 78: 317, 79: 328, 80: 320, 81: 327, 82: None, 83: None, 84: 316,
              85: 329, 86: 318, 87: 328, 88: None, 89: 319, 90: 329}


def _path_b(frame: int) -> Position:
    if frame in _B_FLICKER:
        x = _B_FLICKER[frame]
        return None if x is None else (x, LANES[1])
    return _lerp([(0, 100), (60, 100), (75, 300), (90, 330), (120, 540)], frame), LANES[1]


def _path_c(frame: int) -> Position:
    jitter = (-6, 4, -3, 6, -5, 2, 5, -6, 3, -2)
    return 323 + jitter[frame % len(jitter)], LANES[2] + (frame % 3) - 1  # anchors ~320 ± 6


def _ghost(frames: dict[int, float], lane: int) -> Callable[[int], Position]:
    def path(frame: int) -> Position:
        x = frames.get(frame)
        return None if x is None else (x, LANES[lane])
    return path


@dataclass(frozen=True)
class Actor:
    name: str
    patch: str
    path: Callable[[int], Position]


ACTORS = (
    Actor("A", "hopper", _path_a),
    Actor("B", "face_left", _path_b),
    Actor("C", "face_right", _path_c),
    Actor("ghost_in", "face_right", _ghost({20: 296, 21: 299, 23: 343}, 1)),
    Actor("ghost_out", "face_left", _ghost({140: 343, 141: 340, 143: 297}, 0)),
)


def _patches() -> dict[str, np.ndarray]:
    import cv2

    out = {}
    for key, (photo, (x1, y1, x2, y2), scale) in _PATCHES.items():
        crop = cv2.imread(str(IMAGES / photo))[y1:y2, x1:x2]
        out[key] = cv2.resize(crop, None, fx=scale, fy=scale, interpolation=cv2.INTER_AREA)
    return out


def _paste(frame: np.ndarray, patch: np.ndarray, centre: tuple[float, float]) -> None:
    h, w = patch.shape[:2]
    x = round(centre[0] - w / 2)
    y = round(centre[1] - h / 2)
    frame[y:y + h, x:x + w] = patch


def render_frames() -> list[np.ndarray]:
    """The scene's frames (BGR, SIZE)."""
    import cv2

    background = cv2.resize(cv2.imread(str(IMAGES / "kite_and_cold.jpg")), SIZE, interpolation=cv2.INTER_AREA)
    patches = _patches()
    frames = []
    for index in range(FRAMES):
        frame = background.copy()
        for actor in ACTORS:
            position = actor.path(index)
            if position is not None:
                _paste(frame, patches[actor.patch], position)
        frames.append(frame)
    return frames


def make_scene_clip(path: Path, quality: int = 92, *, size: tuple[int, int] = SIZE, frames: int = FRAMES) -> Path:
    """Write the scene as an MJPEG ``.avi`` (what ``make_test_clip`` writes) and return its path: its first
    ``frames`` frames, enlarged to ``size`` (the same camera's main stream, for a record source)."""
    import cv2

    rendered = render_frames()[:frames]
    if size != SIZE:
        rendered = [cv2.resize(frame, size, interpolation=cv2.INTER_LINEAR) for frame in rendered]
    return _write_clip(path, rendered, quality, size)


def _write_clip(path: Path, frames: list[np.ndarray], quality: int, size: tuple[int, int] = SIZE) -> Path:
    import cv2

    writer = cv2.VideoWriter(str(path), cv2.CAP_OPENCV_MJPEG, cv2.VideoWriter_fourcc(*"MJPG"), FPS, size)
    if not writer.isOpened():
        raise RuntimeError(f"cannot write {path}")
    try:
        writer.set(cv2.VIDEOWRITER_PROP_QUALITY, quality)
        for frame in frames:
            writer.write(frame)
    finally:
        writer.release()
    return path


# ---------------------------------------------------------------------------------------------
# People walking across a line, for a YOLO person detector (tests/pipeline/test_detector_references.py)
# ---------------------------------------------------------------------------------------------

#: the person in squat.bmp with a margin round its box (Ultralytics finds it at 104,134-368,602)
_PERSON = ("squat.bmp", (90, 120, 385, 612), 0.55)
PEOPLE_FRAMES = 56
#: the counting line for the people clip: vertical at x = 320, drawn upwards (left → right is "in")
PEOPLE_LINE = LINE
#: one person walks left → right (in), then, mirrored, one walks right → left (out)
PEOPLE_TRUTH = {"in": 1, "out": 1}


def render_people_frames() -> list[np.ndarray]:
    """The people clip's frames (BGR, SIZE): a plain wall, one walker at a time, a few frames apart."""
    import cv2

    photo, (x1, y1, x2, y2), scale = _PERSON
    person = cv2.imread(str(IMAGES / photo))[y1:y2, x1:x2]
    person = cv2.resize(person, None, fx=scale, fy=scale, interpolation=cv2.INTER_AREA)
    mirrored = np.ascontiguousarray(person[:, ::-1])
    background = np.full((SIZE[1], SIZE[0], 3), (172, 180, 186), np.uint8)
    half = PEOPLE_FRAMES // 2
    frames = []
    for index in range(PEOPLE_FRAMES):
        frame = background.copy()
        if index < half - 2:  # walking right
            _paste(frame, person, (_lerp([(0, 100.0), (half - 3, 540.0)], index), 240.0))
        elif index >= half + 2:  # walking left
            _paste(frame, mirrored, (_lerp([(half + 2, 540.0), (PEOPLE_FRAMES - 1, 100.0)], index), 240.0))
        frames.append(frame)
    return frames


def make_people_clip(path: Path, quality: int = 92) -> Path:
    """Write the people clip as an MJPEG ``.avi`` and return its path."""
    return _write_clip(path, render_people_frames(), quality)
