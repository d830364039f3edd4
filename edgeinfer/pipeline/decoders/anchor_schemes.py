"""MediaPipe's SSD anchors, generated as its ``SsdAnchorsCalculator`` generates them — never looked up.

The calculator takes a list of ``strides`` (one per layer). Consecutive layers of one stride share a feature
map of ``ceil(input / stride)`` cells, each layer adding ``len(aspect_ratios)`` anchors a cell, plus one when
``interpolated_scale_aspect_ratio`` > 0 (its default, 1.0), or 3 in the first layer with
``reduce_boxes_in_lowest_layer``. A cell's anchors sit at ``(column + anchor_offset_x) / columns`` of the input
(and the same down the rows), in the order feature map, row, column, anchor. MediaPipe's detectors all set
``fixed_anchor_size`` (every anchor 1 x 1: the model regresses sizes in input pixels), so a scheme is its
feature maps and how many anchors each cell has.

A model does not carry its scheme, but its anchor count and input size narrow it down. :func:`derive_scheme`
generates the schemes of the shape every MediaPipe detector graph has — each stride double the one before,
the coarsest repeated (1 to :data:`MAX_LAYERS` layers), one aspect ratio with or without the interpolated
scale — and keeps those that give the model's count: BlazeFace short range and the palm detector (8, 16, 16,
16), full range (4, no interpolated scale), the pose detector (8, 16, 32, 32, 32) and the back-camera
BlazeFace (16, 32, 32, 32) each come out of their input size alone. Schemes that place the same anchors are
one scheme; when different placements give the count (2304 at 192x192 is also a 24x24 map of four anchors a
cell) the one with the fewest feature maps and then the fewest anchors a cell is taken, and the others are
said in a warning. Anything else is stated in the model's metadata (``metadata.yaml``) under ``anchors:``,
with the calculator's own option names (:func:`scheme_from_options`): a wrong key or value there is an
:class:`~edgeinfer.errors.AnchorOptionsError` naming it.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from ...errors import AnchorOptionsError

if TYPE_CHECKING:
    import numpy as np

log = logging.getLogger(__name__)

#: the most layers a derived scheme has (the calculator's own SSD example has 6; MediaPipe's detectors 1-5)
MAX_LAYERS = 6
#: where a model states its scheme
OPTIONS_KEY = "anchors"


@dataclass(frozen=True)
class AnchorScheme:
    """SsdAnchorsCalculator's options as far as fixed-size anchors need them."""

    #: one per layer, as the calculator's ``strides``
    strides: tuple[int, ...]
    #: anchors each layer adds to a cell of its map (``len(aspect_ratios)`` + 1 with an interpolated scale)
    per_layer: tuple[int, ...]
    #: ``anchor_offset_x``, ``anchor_offset_y``: where in its cell an anchor sits
    offset: tuple[float, float] = (0.5, 0.5)
    #: ``input_size_width``, ``input_size_height`` when stated (else the model's input)
    input_size: tuple[int, int] | None = None

    def maps(self, width: int, height: int) -> list[tuple[int, int, int, int]]:
        """(stride, columns, rows, anchors a cell) of each feature map, finest first as the calculator goes."""
        width, height = self.input_size or (width, height)
        found: list[tuple[int, int, int, int]] = []
        for layer, stride in enumerate(self.strides):
            if layer and stride == self.strides[layer - 1]:  # consecutive equal strides share one map
                s, columns, rows, per_cell = found[-1]
                found[-1] = (s, columns, rows, per_cell + self.per_layer[layer])
            else:
                found.append((stride, math.ceil(width / stride), math.ceil(height / stride), self.per_layer[layer]))
        return found

    def count(self, width: int, height: int) -> int:
        return sum(columns * rows * per_cell for _, columns, rows, per_cell in self.maps(width, height))

    def placement(self, width: int, height: int) -> tuple[tuple[int, int, int], ...]:
        """What decides where the anchors are: schemes with the same placement give the same anchors."""
        return tuple((columns, rows, per_cell) for _, columns, rows, per_cell in self.maps(width, height))

    def centres(self, width: int, height: int) -> np.ndarray:
        """(N, 2) anchor centres in input pixels (the calculator's normalised centres times the model's input:
        its detector graphs decode with ``x_scale`` = ``y_scale`` = the input size)."""
        import numpy as np

        ox, oy = self.offset
        parts = []
        for _, columns, rows, per_cell in self.maps(width, height):
            ys, xs = np.meshgrid((np.arange(rows) + oy) / rows, (np.arange(columns) + ox) / columns, indexing="ij")
            grid = np.stack([xs * width, ys * height], axis=-1).reshape(-1, 1, 2)
            parts.append(np.repeat(grid, per_cell, axis=1).reshape(-1, 2))
        return np.concatenate(parts).astype(np.float32)

    def describe(self) -> str:
        """``strides 8/16/16/16, 2 anchors a layer`` (the words MediaPipe's options say it in)."""
        strides = "/".join(str(s) for s in self.strides)
        counts = sorted(set(self.per_layer))
        each = f"{counts[0]} anchor{'s' if counts[0] != 1 else ''} a layer" if len(counts) == 1 else \
            f"{'/'.join(str(n) for n in self.per_layer)} anchors a layer"
        offset = "" if self.offset == (0.5, 0.5) else f", offset {self.offset[0]:g}, {self.offset[1]:g}"
        return f"strides {strides}, {each}{offset}"


def mediapipe_schemes(width: int, height: int) -> list[AnchorScheme]:
    """Every scheme of the shape MediaPipe's detector graphs have, for an input of this size: doubling strides
    from 2 up to the input's longer side, the last one repeated, at most :data:`MAX_LAYERS` layers, one aspect
    ratio (1.0) with the interpolated scale (2 anchors a layer, the calculator's default) or without (1)."""
    schemes = []
    first = 2
    while first <= max(width, height):
        for layers in range(1, MAX_LAYERS + 1):
            for distinct in range(1, layers + 1):
                strides = tuple(first << i for i in range(distinct)) + (first << (distinct - 1),) * (layers - distinct)
                for per_layer in (1, 2):
                    schemes.append(AnchorScheme(strides, (per_layer,) * layers))
        first *= 2
    return schemes


def _preference(scheme: AnchorScheme, width: int, height: int) -> tuple[int, int, int]:
    """Fewest feature maps, then fewest anchors a cell in the finest, then fewest layers."""
    maps = scheme.maps(width, height)
    return len(maps), maps[0][3], len(scheme.strides)


@lru_cache(maxsize=64)
def derive_scheme(width: int, height: int, count: int) -> AnchorScheme:
    """The MediaPipe scheme that gives ``count`` anchors for a ``width`` x ``height`` input (LayoutMismatch
    when none does; a warning naming the others when several placements do, the preferred one taken)."""
    from .base import LayoutMismatch

    fitting: dict[tuple, AnchorScheme] = {}
    for scheme in mediapipe_schemes(width, height):
        if scheme.count(width, height) == count:
            key = scheme.placement(width, height)
            best = fitting.get(key)
            if best is None or _preference(scheme, width, height) < _preference(best, width, height):
                fitting[key] = scheme
    if not fitting:
        raise LayoutMismatch(
            f"{count} anchors is no MediaPipe anchor scheme of a {width}x{height} input (doubling strides, the "
            f"last repeated, up to {MAX_LAYERS} layers, 1 or 2 anchors a layer); state it under "
            f"'{OPTIONS_KEY}:' in the model's metadata.yaml (SsdAnchorsCalculator's options: strides, ...)")
    ranked = sorted(fitting.values(), key=lambda s: _preference(s, width, height))
    if len(ranked) > 1:
        log.warning("%d anchors of a %dx%d input fit %d MediaPipe anchor schemes: %s (taken), %s; if the "
                    "detections are wrong, state the model's under '%s:' in its metadata.yaml",
                    count, width, height, len(ranked), ranked[0].describe(),
                    "; ".join(s.describe() for s in ranked[1:]), OPTIONS_KEY)
    return ranked[0]


# ------------------------------------------------------------------------------------------ options

#: SsdAnchorsCalculatorOptions keys read, and those that only size anchors (fixed-size anchors ignore them)
_READ = {"strides", "num_layers", "aspect_ratios", "interpolated_scale_aspect_ratio", "anchor_offset_x",
         "anchor_offset_y", "reduce_boxes_in_lowest_layer", "fixed_anchor_size", "input_size_width",
         "input_size_height"}
_SIZING = {"min_scale", "max_scale"}
_UNSUPPORTED = {"feature_map_width", "feature_map_height", "multiscale_anchor_generation", "min_level",
                "max_level", "anchor_scale", "scales_per_octave", "normalize_coordinates", "fixed_anchors"}


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _option(options: Mapping[str, Any], key: str, default: Any, valid: Any, meaning: str) -> Any:
    value = options.get(key, default)
    if not valid(value):
        raise AnchorOptionsError(f"{OPTIONS_KEY}.{key} must be {meaning}, not {value!r:.80}", f"{OPTIONS_KEY}.{key}")
    return value


def scheme_from_options(options: Any) -> AnchorScheme:
    """A scheme from SsdAnchorsCalculator's options as a model's metadata states them (the mapping under
    ``anchors:``; keys as in MediaPipe's graph files). AnchorOptionsError names the key that is wrong."""
    if not isinstance(options, Mapping):
        raise AnchorOptionsError(f"{OPTIONS_KEY} must be a mapping of SsdAnchorsCalculator options "
                                 f"(strides: [8, 16, 16, 16], ...), not {options!r:.80}", OPTIONS_KEY)
    for key in options:
        if key in _UNSUPPORTED:
            raise AnchorOptionsError(f"{OPTIONS_KEY}.{key} is not supported: edgeinfer generates MediaPipe's "
                                     "fixed-size grid anchors from strides", f"{OPTIONS_KEY}.{key}")
        if key not in _READ | _SIZING:
            raise AnchorOptionsError(f"{OPTIONS_KEY}.{key} is no SsdAnchorsCalculator option edgeinfer reads "
                                     f"({', '.join(sorted(_READ | _SIZING))})", f"{OPTIONS_KEY}.{key}")
    strides = _option(options, "strides", None, lambda v: isinstance(v, (list, tuple)) and 0 < len(v) <= 64
                      and all(isinstance(s, int) and not isinstance(s, bool) and 0 < s <= 16384 for s in v),
                      "a list of 1 to 64 positive integers, one per layer")
    _option(options, "num_layers", len(strides), lambda v: v == len(strides),
            f"the number of strides ({len(strides)})")
    ratios = _option(options, "aspect_ratios", [1.0], lambda v: isinstance(v, (list, tuple)) and 0 < len(v) <= 64
                     and all(_number(r) and r > 0 for r in v), "a list of positive numbers")
    interpolated = _option(options, "interpolated_scale_aspect_ratio", 1.0, lambda v: _number(v) and v >= 0,
                           "a number >= 0 (0: no interpolated anchor)")
    offsets = tuple(_option(options, key, 0.5, lambda v: _number(v) and 0 <= v <= 1, "a number in 0..1")
                    for key in ("anchor_offset_x", "anchor_offset_y"))
    reduce = _option(options, "reduce_boxes_in_lowest_layer", False, lambda v: isinstance(v, bool), "true or false")
    _option(options, "fixed_anchor_size", True, lambda v: v is True,
            "true (the model regresses sizes in input pixels, as MediaPipe's detectors do)")
    sizes = [_option(options, key, None, lambda v: v is None or (isinstance(v, int) and not isinstance(v, bool)
                                                                  and 0 < v <= 16384), "a positive integer")
             for key in ("input_size_width", "input_size_height")]
    if (sizes[0] is None) != (sizes[1] is None):
        missing = "input_size_height" if sizes[1] is None else "input_size_width"
        raise AnchorOptionsError(f"{OPTIONS_KEY}.{missing} must be given with the other input size",
                                 f"{OPTIONS_KEY}.{missing}")
    for key in _SIZING & set(options):
        _option(options, key, None, _number, "a number")
    per_layer = len(ratios) + (1 if interpolated > 0 else 0)
    counts = tuple(3 if layer == 0 and reduce else per_layer for layer in range(len(strides)))
    return AnchorScheme(tuple(strides), counts, (float(offsets[0]), float(offsets[1])),
                        (sizes[0], sizes[1]) if sizes[0] is not None else None)
