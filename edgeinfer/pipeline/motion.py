"""Motion gating: a cheap change detector that lets the pipeline skip inference on unchanged frames.

A :class:`MotionGate` looks at each frame before preprocessing. ``changed(frame)`` answers True
(run inference) or False (the frame looks like the one whose result the pipeline last computed:
reuse that result, marked reused). It works on a small grayscale copy of the frame:

1. ``cv2.resize`` (``INTER_AREA``, i.e. block means) to about ``width`` pixels wide (an exact
   divisor of the frame's size where there is one, :func:`downscaled_size`: OpenCV's fast integer
   path), reading only every n-th row, about four rows per block (:func:`row_step`: a strided
   view, no copy), then to gray, into preallocated buffers. 1280x720 becomes 80x45 from 180 of
   its rows, each small pixel the mean of 16x4 samples: per-pixel sensor noise and JPEG ringing
   shrink by the square root of that (8x); ``threshold`` filters what is left.
2. Against the **reference**: the small frame of the last frame that went through (inference ran
   on it). Comparing with the frame whose result is reused — not with the previous frame, not
   with a running average — makes the answer mean what the pipeline needs: "this frame looks
   like the frame the current result belongs to". Slow changes (a creeping object, drifting
   light) accumulate against it and eventually go through; they cannot leak past frame by frame.
3. With ``gain`` (default), the frame is scaled by ``mean(reference) / mean(frame)`` first, so a
   global brightness change — auto exposure, dusk, a cloud — is not motion. Saturated pixels do not
   scale, so a strong brightening of a scene with clipped highlights still goes through.
4. Pixels whose absolute difference exceeds ``threshold`` (gray levels) are counted; the frame
   changed when at least ``min_area`` (a fraction of the frame) changed.

Always True: the first frame, the first after :meth:`reset`, the first of a new frame size, and a
frame after ``max_skip`` consecutive skipped ones (a bound on how stale a reused result gets).
After the first frame of a size, ``changed()`` allocates nothing but a few Python scalars.
"""

from __future__ import annotations

import math
from numbers import Real
from typing import TYPE_CHECKING, Any

from ..errors import InputMismatch

if TYPE_CHECKING:
    import numpy as np

DEFAULT_THRESHOLD = 20
DEFAULT_MIN_AREA = 0.002
DEFAULT_MAX_SKIP = 30
DEFAULT_WIDTH = 96
MIN_WIDTH, MAX_WIDTH = 8, 1024
#: rows of each block of the downscaled copy that are read (row_step)
ROWS_PER_BLOCK = 4


def _check_settings(threshold: object, min_area: object, max_skip: object, width: object) -> None:
    if isinstance(threshold, bool) or not isinstance(threshold, Real) or not 0 < threshold < 255:
        raise ValueError(f"motion threshold must be a number of gray levels in (0, 255), not {threshold!r}")
    if isinstance(min_area, bool) or not isinstance(min_area, Real) or not 0 <= min_area <= 1:
        raise ValueError(f"motion min_area must be a fraction of the frame in [0, 1], not {min_area!r}")
    if isinstance(max_skip, bool) or not isinstance(max_skip, int) or max_skip < 0:
        raise ValueError(f"motion max_skip must be a whole number of frames >= 0, not {max_skip!r}")
    if isinstance(width, bool) or not isinstance(width, int) or not MIN_WIDTH <= width <= MAX_WIDTH:
        raise ValueError(f"motion width must be a whole number of pixels in [{MIN_WIDTH}, {MAX_WIDTH}], not {width!r}")


def _nearest_divisor(n: int, factor: float) -> int:
    """The divisor of ``n`` nearest to ``factor`` (by ratio)."""
    best = 1
    for d in range(1, n + 1):
        if n % d == 0 and abs(math.log(d / factor)) < abs(math.log(best / factor)):
            best = d
        if d > 2 * factor:
            break
    return best


def downscaled_size(width: int, height: int, target_width: int) -> tuple[int, int]:
    """(width, height) of the gate's small copy of a ``width`` x ``height`` frame: about
    ``target_width`` wide, the aspect kept, each side an exact divisor of the frame's so that
    ``INTER_AREA`` takes OpenCV's integer block-mean path (about 4x faster than a fractional scale;
    1280x720 -> 128x72). A frame narrower than ``target_width`` is used at its own size."""
    if width <= target_width:
        return width, height
    factor = width / target_width
    kx = _nearest_divisor(width, factor)
    if abs(math.log(kx / factor)) > math.log(1.5):  # no divisor near: a fractional block mean
        return target_width, max(1, round(height / factor))
    ky = _nearest_divisor(height, kx)
    if abs(math.log(ky / kx)) > math.log(1.25):  # keep blocks roughly square
        return width // kx, max(1, round(height / kx))
    return width // kx, height // ky


def row_step(height: int, small_height: int) -> int:
    """Read every n-th row of the frame: about ``ROWS_PER_BLOCK`` rows of each block of an exact
    integer block mean (a row-strided view costs no copy, and the resize reads that much less);
    1 where the block height is fractional."""
    if height % small_height:
        return 1
    block = height // small_height
    return max(d for d in range(1, block + 1) if block % d == 0 and d * ROWS_PER_BLOCK <= max(block, ROWS_PER_BLOCK))


class MotionGate:
    """Says whether a frame changed enough since the last frame inference ran on.

    ``threshold``: per-pixel difference, in gray levels of the downscaled frame, that counts as a
    change. ``min_area``: fraction of the frame (0..1) that must change. ``max_skip``: at most this
    many consecutive frames are skipped (0: none ever is). ``width``: width of the downscaled copy
    (frames narrower than that are used at their own size). ``gain``: cancel global brightness
    changes. Not thread-safe: one gate per stream, called from one thread.
    """

    def __init__(self, threshold: float = DEFAULT_THRESHOLD, min_area: float = DEFAULT_MIN_AREA,
                 max_skip: int = DEFAULT_MAX_SKIP, width: int = DEFAULT_WIDTH, *, gain: bool = True) -> None:
        import cv2

        _check_settings(threshold, min_area, max_skip, width)
        self.threshold = float(threshold)
        self.min_area = float(min_area)
        self.max_skip = max_skip
        self.width = width
        self.gain = bool(gain)
        self._cv2 = cv2
        #: frames seen, frames skipped (``changed()`` said False), frames forced through by ``max_skip``
        self.frames = 0
        self.skipped = 0
        self.forced = 0
        #: fraction of the downscaled frame that changed at the last compared frame (1.0 when it was
        #: not compared: first frame, new size, after reset, forced)
        self.changed_area = 1.0
        self._shape: tuple[int, ...] | None = None
        self._have_reference = False
        self._run = 0  # consecutive frames skipped since the last that went through

    # -- counters ------------------------------------------------------------------------
    @property
    def skipped_fraction(self) -> float:
        """Fraction of the frames seen whose inference was skipped (0.0 before any frame)."""
        return self.skipped / self.frames if self.frames else 0.0

    @property
    def size(self) -> tuple[int, int] | None:
        """(width, height) of the downscaled copy for the current frame size; None before a frame."""
        return None if self._shape is None else (self._gray.shape[1], self._gray.shape[0])

    def reset(self, *, counters: bool = False) -> None:
        """Forget the reference: the next frame goes through (call it after an engine swap, a failed
        invoke, or whenever the last result cannot be reused). ``counters=True`` zeroes the counters."""
        self._have_reference = False
        self._run = 0
        if counters:
            self.frames = self.skipped = self.forced = 0

    # -- per frame -----------------------------------------------------------------------
    def changed(self, frame: np.ndarray) -> bool:
        """True: run inference on ``frame`` (HxWx3 BGR or HxW gray, uint8). False: it looks like the
        frame inference last ran on; reuse that result."""
        if frame.shape != self._shape:
            self._plan(frame)
        elif frame.dtype.itemsize != 1 or frame.dtype.kind != "u":
            raise InputMismatch(f"the motion gate takes uint8 frames, not {frame.dtype}")
        cv2 = self._cv2
        self.frames += 1
        rows = frame[::self._row_step] if self._row_step > 1 else frame  # a view: no copy
        if self._small is not None:
            cv2.resize(rows, self._dsize, dst=self._small, interpolation=cv2.INTER_AREA)
            cv2.cvtColor(self._small, cv2.COLOR_BGR2GRAY, dst=self._gray)
        else:
            cv2.resize(rows, self._dsize, dst=self._gray, interpolation=cv2.INTER_AREA)
        if not self._have_reference:
            self.changed_area = 1.0
            return self._take_reference()
        if self._run >= self.max_skip:
            self.forced += 1
            self.changed_area = 1.0
            return self._take_reference()
        compared = self._gray
        if self.gain:
            mean = cv2.mean(compared)[0]
            if mean >= 1.0 and self._reference_mean >= 1.0:
                cv2.convertScaleAbs(compared, dst=self._scaled, alpha=self._reference_mean / mean)
                compared = self._scaled
        cv2.absdiff(compared, self._reference, dst=self._diff)
        cv2.threshold(self._diff, self.threshold, 255, cv2.THRESH_BINARY, dst=self._diff)
        count = cv2.countNonZero(self._diff)
        self.changed_area = count / self._pixels
        if count >= self._min_pixels:
            return self._take_reference()
        self._run += 1
        self.skipped += 1
        return False

    def _take_reference(self) -> bool:
        self._reference, self._gray = self._gray, self._reference  # swap buffers: no copy
        if self.gain:
            self._reference_mean = self._cv2.mean(self._reference)[0]
        self._have_reference = True
        self._run = 0
        return True

    def _plan(self, frame: np.ndarray) -> None:
        """Buffers for a new frame size (the reference is dropped: the next frame goes through)."""
        import numpy as np

        if frame.dtype != np.uint8:
            raise InputMismatch(f"the motion gate takes uint8 frames, not {frame.dtype}")
        if not (frame.ndim == 2 or (frame.ndim == 3 and frame.shape[2] == 3)) or 0 in frame.shape:
            raise InputMismatch(f"the motion gate takes HxWx3 BGR or HxW gray frames, not shape {frame.shape}")
        height, width = frame.shape[:2]
        small_w, small_h = downscaled_size(width, height, self.width)
        self._dsize = (small_w, small_h)
        self._row_step = row_step(height, small_h)
        self._small = np.empty((small_h, small_w, 3), np.uint8) if frame.ndim == 3 else None
        self._gray = np.empty((small_h, small_w), np.uint8)
        self._reference = np.empty((small_h, small_w), np.uint8)
        self._scaled = np.empty((small_h, small_w), np.uint8)
        self._diff = np.empty((small_h, small_w), np.uint8)
        self._reference_mean = 0.0
        self._pixels = small_w * small_h
        self._min_pixels = max(1, math.ceil(self.min_area * self._pixels - 1e-9))
        self._shape = frame.shape
        self.reset()

    def __repr__(self) -> str:
        return (f"MotionGate(threshold={self.threshold:g}, min_area={self.min_area:g}, max_skip={self.max_skip}, "
                f"width={self.width}, gain={self.gain}; frames={self.frames}, skipped={self.skipped})")


def motion_gate_from_options(options: Any) -> MotionGate | None:
    """The gate a pipeline's options ask for (``motion_gate``, ``motion_threshold``, ``motion_min_area``,
    ``motion_max_skip``), or None when gating is off."""
    if not options.motion_gate:
        return None
    return MotionGate(options.motion_threshold, options.motion_min_area, options.motion_max_skip)
