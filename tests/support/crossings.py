"""Synthetic tracks for line and zone counting (issue 29): boxes per frame, no model, no image.

Every object is a square box of ``size`` pixels in its own lane (lanes are two boxes apart, so the
tracker never confuses two objects); the counting line is vertical at ``X``, drawn upwards, so a
move to the right is *in*. Positions are the anchor's (bottom centre) x in box sizes from the
line. Randomness is seeded: a clip is the same on every run.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator, Sequence

from edgeinfer.pipeline.postprocess import Detection, Detections

X = 1000.0
#: a path: time in seconds → anchor x offset from the line in box sizes (None: no box that frame)
Path = Callable[[float], float | None]


def line(size: float, lanes: int) -> tuple[float, float, float, float]:
    """The counting line (x1, y1, x2, y2) long enough for ``lanes`` lanes of boxes of ``size``."""
    return X, 2.0 * size * (lanes + 1), X, 0.0


def lane_y(size: float, lane: int) -> float:
    """The bottom of the boxes in ``lane``."""
    return 2.0 * size * (lane + 1) - 0.5 * size


def box(offset: float, size: float, lane: int) -> tuple[float, float, float, float]:
    """A box whose anchor is ``offset`` box sizes right of the line, in ``lane``."""
    x, y = X + offset * size, lane_y(size, lane)
    return x - size / 2, y - size, x + size / 2, y


def jitterer(amplitude: float, seed: int) -> Path:
    """Standing on the line, the box jumping uniformly within ±``amplitude`` of its size each frame."""
    rng = random.Random(seed)
    return lambda t: rng.uniform(-amplitude, amplitude)


def flickerer(missing: float, seed: int, amplitude: float = 0.25) -> Path:
    """Hovering on the line (±5 % of its size) and missing from a share ``missing`` of the frames; each
    time it reappears it is first seen on the other side, up to ``amplitude`` box sizes from the line,
    for one or two frames (a detector losing the object and re-finding it displaced)."""
    rng = random.Random(seed)
    state = {"side": 1.0, "displaced": 0}

    def path(t: float) -> float | None:
        if rng.random() < missing:
            state["side"], state["displaced"] = -state["side"], rng.choice((1, 2))
            return None
        if state["displaced"]:
            state["displaced"] -= 1
            return state["side"] * rng.uniform(0.5 * amplitude, amplitude)
        return rng.uniform(-0.05, 0.05)
    return path


def walker(start_s: float, speed: float, direction: int = 1, reach: float = 3.0, jitter: float = 0.03,
           seed: int = 0) -> Path:
    """Walks from ``reach`` box sizes on one side to ``reach`` on the other at ``speed`` box sizes a
    second, starting at ``start_s`` (in view only meanwhile), its box jittering ±``jitter``."""
    rng = random.Random(seed)
    duration = 2 * reach / speed

    def path(t: float) -> float | None:
        if not start_s <= t <= start_s + duration:
            return None
        return direction * (-reach + speed * (t - start_s)) + rng.uniform(-jitter, jitter)
    return path


def frames(paths: Sequence[Path], size: float, fps: float, seconds: float) -> Iterator[tuple[int, Detections]]:
    """(frame id, detections) for each frame: path ``i`` in lane ``i``."""
    for frame_id in range(round(seconds * fps)):
        t = frame_id / fps
        boxes = [(lane, path(t)) for lane, path in enumerate(paths)]
        yield frame_id, Detections(tuple(Detection(box(offset, size, lane), 0.9, 0, "person")
                                         for lane, offset in boxes if offset is not None))


def doorway(seed: int = 29) -> list[Path]:
    """Issue 29's clip: someone standing in a doorway on the line, the box jittering by about a tenth
    of its size across it, while four people walk through (two in, two out) in lanes of their own."""
    return [jitterer(0.12, seed),
            walker(1.0, 1.2, 1, seed=seed + 1), walker(4.0, 1.2, -1, seed=seed + 2),
            walker(9.0, 1.5, 1, seed=seed + 3), walker(13.0, 1.0, -1, seed=seed + 4)]
