"""Ultralytics YOLO (v5, v8, v11 and later), as its exporters leave it: detect, pose, segment, oriented boxes.

* ``yolo``: ``[1, 4+nc, N]`` (or its transpose): cx, cy, w, h, one score per class; no objectness, no NMS.
* ``yolo-pose``: ``[1, 4+nc+K*D, N]``: the same, then K keypoints of (x, y[, visibility]) — K and D from the
  metadata's ``kpt_shape`` (17 x 3 when it says nothing).
* ``yolo-seg``: ``[1, 4+nc+nm, N]`` and prototype masks ``[1, nm, mh, mw]`` (TFLite: ``[1, mh, mw, nm]``): each
  kept box's coefficients times the prototypes, cropped to the box, at source resolution.
* ``yolo-obb``: ``[1, 4+nc+1, N]``: the same, then the angle (radians); NMS on the rotated boxes.
* ``yolov5``: ``[1, N, 5+nc]``: cx, cy, w, h, objectness, class probabilities (score = objectness x class).
* ``yolo-end2end``: ``[1, K, 6(+extra)]``: x1, y1, x2, y2, score, class — the graph selected its own boxes
  (YOLOv10, YOLO26, ``nms=True`` exports); extra columns are mask coefficients (with the prototypes as a
  second output), keypoints, or the angle (an oriented box's row is cx, cy, w, h, score, class, angle).

N is a grid's candidate count (one a cell at strides 8, 16, 32 — and 64, or 4 — of the input; YOLOv5: three a
cell). The metadata's ``end2end`` sends a model to ``yolo-end2end`` or keeps it away from it. NMS is per class,
in input pixels, as Ultralytics does it.

Coordinates are input pixels, or normalised to the input (Ultralytics' TFLite exports): told apart per
frame from the kept boxes themselves (no box of a real object fits in 2 pixels). Quantised outputs are
dequantised (the score threshold is compared in the quantised steps, so nothing the size of the candidate table
is allocated per frame). Rows with NaN or inf are never a box; a class past the names keeps its number as its
label; an end-to-end row whose class is not a whole number >= 0 is skipped.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from ..postprocess import KEYPOINT_NAMES, InstanceMask
from .base import (
    DecoderInput,
    Layout,
    LayoutMismatch,
    Preprocessing,
    centre_to_corners,
    detections,
    finite_rows,
    nms,
    to_source_boxes,
    to_source_points,
)

if TYPE_CHECKING:
    import numpy as np

    from ..postprocess import Detections
    from ..preprocess import Transform

#: Ultralytics' preprocessing (its LetterBox): RGB in [0, 1], letterboxed in the middle of a grey 114 border
ULTRALYTICS = Preprocessing(resize="letterbox", mean=0.0, std=255.0, channels="rgb", pad="centre", pad_value=114)
#: the anchor-free heads' strides: P3-P5, P3-P6 (``-p6`` models), P2-P5 (``-p2`` models)
STRIDES = ((8, 16, 32), (8, 16, 32, 64), (4, 8, 16, 32))
#: boxes whose every coordinate is at most this are normalised to the input
NORMALISED_MAX = 2.0
#: an end-to-end output with more rows than this is a candidate table, unless the metadata says end2end
END2END_MAX_ROWS = 1000
#: an end-to-end row's class (a float) at or past this is not a class
MAX_CLASS = 1 << 24
#: Ultralytics' prototype masks are at stride 4 of the input
PROTO_STRIDE = 4


def grid_sizes(width: int, height: int) -> set[int]:
    """The candidate counts an anchor-free head has for this input (P3-P5, P3-P6 and P2-P5)."""
    return {sum(math.ceil(width / s) * math.ceil(height / s) for s in strides) for strides in STRIDES}


def _classes(source: DecoderInput) -> int | None:
    """Class count the model states (metadata names, else the labels given), None when unknown."""
    if source.metadata.names:
        return len(source.metadata.names)
    return len(source.labels) if source.labels else None


def _kpt_shape(source: DecoderInput) -> tuple[int, int]:
    k, d = source.metadata.kpt_shape or (len(KEYPOINT_NAMES), 3)
    if d not in (2, 3):
        raise LayoutMismatch(f"keypoints of {d} values are neither (x, y) nor (x, y, visibility)")
    return k, d


def _keypoint_names(count: int) -> tuple[str, ...]:
    return KEYPOINT_NAMES if count == len(KEYPOINT_NAMES) else tuple(f"kp{i}" for i in range(count))


def _table(source: DecoderInput, index: int, *, min_columns: int) -> tuple[np.ndarray, bool]:
    """Output ``index`` as an (N, C) view of candidates (a transposed view of ``[1, C, N]``), and whether it
    was transposed. The candidate axis is the one of a grid size, else the longer one."""
    output = source.outputs[index]
    squeezed = list(output.shape)
    while len(squeezed) > 2 and squeezed[0] == 1:
        squeezed.pop(0)
    if len(squeezed) != 2:
        raise LayoutMismatch(f"needs a [1, C, N] or [1, N, C] table, not {list(output.shape)}")
    first, second = squeezed
    grids = grid_sizes(*source.input_size)
    transposed = second in grids or (first not in grids and second > first)  # [C, N]: candidates on axis 1
    view = output.reshape(first, second)
    table = view.T if transposed else view
    if table.shape[1] < min_columns:
        raise LayoutMismatch(f"a candidate row holds {table.shape[1]} values; this layout needs at least {min_columns}")
    return table, transposed


# -------------------------------------------------------------------------- shared parts

class Prototypes:
    """A segmentation model's prototype masks; a box's mask is its coefficients times them, in its box."""

    def __init__(self, source: DecoderInput, index: int) -> None:
        output, self._spec = source.outputs[index], source.specs[index]
        view = output.reshape(output.shape[-3:])
        width, height = source.input_size
        self._view = view.transpose(2, 0, 1) if _channels_last(view.shape, width, height) else view
        self.count, mh, mw = self._view.shape
        self._fx, self._fy = mw / width, mh / height

    def mask(self, coefficients: np.ndarray, box: np.ndarray, transform: Transform) -> InstanceMask:
        """The mask of ``box`` (x1, y1, x2, y2 source pixels): the logits of the prototype cells under the box
        only, sampled bilinearly at each source pixel's centre (Ultralytics' upsampling), > 0 (sigmoid > 0.5)."""
        import cv2
        import numpy as np

        _, mh, mw = self._view.shape
        x0, y0 = math.floor(box[0]), math.floor(box[1])
        width, height = max(1, math.ceil(box[2]) - x0), max(1, math.ceil(box[3]) - y0)
        # source pixel centre u + 0.5 -> input (u + 0.5) * scale + pad -> prototype cell (input * f) - 0.5
        ax, ay = transform.scale_x * self._fx, transform.scale_y * self._fy
        tx = (x0 + 0.5) * ax + transform.pad_x * self._fx - 0.5
        ty = (y0 + 0.5) * ay + transform.pad_y * self._fy - 0.5
        cx0, cx1 = _cells(tx, tx + (width - 1) * ax, mw)
        cy0, cy1 = _cells(ty, ty + (height - 1) * ay, mh)
        region = self._spec.dequantize(self._view[:, cy0:cy1, cx0:cx1])
        logits = np.tensordot(np.asarray(coefficients, np.float32), region, axes=1)
        matrix = np.array([[ax, 0.0, tx - cx0], [0.0, ay, ty - cy0]], np.float64)
        # the cells past the map's edge repeat its edge, as align_corners=False upsampling does
        crop = cv2.warpAffine(logits, matrix, (width, height), flags=cv2.INTER_LINEAR | cv2.WARP_INVERSE_MAP,
                              borderMode=cv2.BORDER_REPLICATE)
        return InstanceMask(x0, y0, crop > 0.0)


def _cells(first: float, last: float, size: int) -> tuple[int, int]:
    """The prototype cells bilinear sampling from ``first`` to ``last`` reads, within the map."""
    start = min(max(math.floor(first), 0), size - 1)
    return start, min(max(math.floor(last) + 2, start + 1), size)


def _channels_last(shape: tuple[int, ...], width: int, height: int) -> bool:
    """Whether prototypes are H x W x nm (TFLite) rather than nm x H x W: the axes that are the input's size at
    stride 4 say, else the smaller axis is the masks'."""
    sizes = {(height // PROTO_STRIDE, width // PROTO_STRIDE),
             (math.ceil(height / PROTO_STRIDE), math.ceil(width / PROTO_STRIDE))}
    if tuple(shape[1:]) in sizes:
        return False
    return tuple(shape[:2]) in sizes or shape[2] < shape[0]


def _split_protos(source: DecoderInput) -> tuple[int, Prototypes]:
    """The index of the table and the prototypes of a segmentation model's two outputs."""
    if len(source.outputs) != 2:
        raise LayoutMismatch(f"needs 2 outputs (candidates and prototype masks), not {len(source.outputs)}")
    ranks = [len([d for d in o.shape if d > 1]) for o in source.outputs]
    if sorted(ranks) != [2, 3] or source.outputs[ranks.index(3)].ndim < 3:
        raise LayoutMismatch("needs a table and a 1 x nm x H x W prototype output, not "
                             f"{' and '.join(str(list(o.shape)) for o in source.outputs)}")
    proto = ranks.index(3)
    return 1 - proto, Prototypes(source, proto)


def _keypoints(raw: np.ndarray, shape: tuple[int, int], normalised: bool, source: DecoderInput,
               transform: Transform) -> np.ndarray:
    """(n, K*D) keypoint values (input pixels, or normalised) -> (n, K, 3) x, y, visibility in source pixels
    (visibility 1.0 when the model gives none)."""
    import numpy as np

    k, d = shape
    points = np.ones((raw.shape[0], k, 3), np.float32)
    points[..., :d] = raw.reshape(-1, k, d)
    if normalised:
        points[..., 0] *= source.input_size[0]
        points[..., 1] *= source.input_size[1]
    to_source_points(points[..., :2], transform)
    return points


def _oriented(rows: np.ndarray, angles: np.ndarray, transform: Transform) -> tuple[np.ndarray, np.ndarray]:
    """(cx, cy, w, h) input-pixel rows and their angles -> the rotated boxes (cx, cy, w, h, angle) in source
    pixels and the upright boxes that hold them."""
    import numpy as np

    rotated = np.empty((rows.shape[0], 5), np.float32)
    rotated[:, :2] = rows[:, :2]
    to_source_points(rotated[:, :2], transform)
    rotated[:, 2] = rows[:, 2] / transform.scale_x
    rotated[:, 3] = rows[:, 3] / transform.scale_y
    rotated[:, 4] = angles
    return rotated, upright_boxes(rotated, transform)


def upright_boxes(rotated: np.ndarray, transform: Transform) -> np.ndarray:
    """The upright (x1, y1, x2, y2) box that holds each rotated (cx, cy, w, h, angle) row, clipped."""
    import numpy as np

    cos, sin = np.abs(np.cos(rotated[:, 4])), np.abs(np.sin(rotated[:, 4]))
    half_w = (rotated[:, 2] * cos + rotated[:, 3] * sin) / 2
    half_h = (rotated[:, 2] * sin + rotated[:, 3] * cos) / 2
    boxes = np.stack([rotated[:, 0] - half_w, rotated[:, 1] - half_h, rotated[:, 0] + half_w,
                      rotated[:, 1] + half_h], axis=1).astype(np.float32)
    np.clip(boxes[:, 0::2], 0.0, transform.source_width, out=boxes[:, 0::2])
    np.clip(boxes[:, 1::2], 0.0, transform.source_height, out=boxes[:, 1::2])
    return boxes


def rotated_nms(rows: np.ndarray, angles: np.ndarray, scores: np.ndarray, classes: np.ndarray,
                iou_threshold: float, max_detections: int) -> list[int]:
    """Greedy per-class NMS on rotated boxes ((cx, cy, w, h) rows, angles in radians), by OpenCV's exact
    intersection of the two rectangles."""
    import cv2
    import numpy as np

    order = np.argsort(-scores, kind="stable").tolist()
    rects = [((float(r[0]), float(r[1])), (float(r[2]), float(r[3])), math.degrees(float(a)))
             for r, a in zip(rows, angles)]
    areas = [max(r[1][0], 0.0) * max(r[1][1], 0.0) for r in rects]
    kept: list[int] = []
    while order and len(kept) < max_detections:
        best = order.pop(0)
        kept.append(best)
        rest = []
        for other in order:
            if classes[other] == classes[best]:
                kind, points = cv2.rotatedRectangleIntersection(rects[best], rects[other])
                inter = cv2.contourArea(points) if kind != cv2.INTERSECT_NONE and points is not None else 0.0
                union = areas[best] + areas[other] - inter
                if union > 0 and inter / union > iou_threshold:
                    continue
            rest.append(other)
        order = rest
    return kept


# ---------------------------------------------------------------------------- decoders

class YoloDecoder:
    """Candidates → thresholded, NMS'd detections (and their keypoints, masks or angles)."""

    def __init__(self, source: DecoderInput, *, kind: str) -> None:
        import numpy as np

        if source.metadata.end2end:
            raise LayoutMismatch("the model's metadata says its graph selects its own boxes (end2end)")
        self.source, self.kind = source, kind
        main, self._protos = 0, None
        if kind == "segment":
            main, self._protos = _split_protos(source)
        elif len(source.outputs) != 1:
            raise LayoutMismatch(f"needs one output, not {len(source.outputs)}")
        self._table, transposed = _table(source, main, min_columns=5)
        self._spec = source.specs[main]
        n, columns = self._table.shape
        grids = grid_sizes(*source.input_size)
        size = f"a {source.input_size[0]}x{source.input_size[1]} input"
        if kind == "yolov5":
            if n not in {3 * g for g in grids}:
                raise LayoutMismatch(f"{n} candidates is not 3 anchors a cell of {size}'s grid")
        elif n not in grids and not (source.metadata.producer and transposed):
            raise LayoutMismatch(f"{n} candidates is not an anchor-free grid of {size} "
                                 f"({', '.join(map(str, sorted(grids)))})")
        self._kpt_shape = _kpt_shape(source) if kind == "pose" else (0, 0)
        extra = {"pose": self._kpt_shape[0] * self._kpt_shape[1], "obb": 1,
                 "segment": self._protos.count if self._protos is not None else 0}.get(kind, 0)
        first = 5 if kind == "yolov5" else 4
        self.classes = columns - first - extra
        stated = _classes(source)
        if self.classes < 1 or (stated is not None and stated != self.classes):
            raise LayoutMismatch(f"{columns} values a candidate do not split into {first} box values, "
                                 f"{stated if stated is not None else 'some'} class scores and {extra} {kind} values")
        self._scores = self._table[:, first:first + self.classes]
        self._extra = self._table[:, first + self.classes:]
        self._best = np.empty(n, self._table.dtype)  # quantised steps, or the output's own floats
        self._over = np.empty(n, bool)
        self._input_scale = np.array(source.input_size * 2, np.float32)

    def _threshold(self, threshold: float) -> float:
        """The score threshold in the output's own values (quantised steps are monotonic in the score)."""
        spec = self._spec
        return threshold / float(spec.scale or 1.0) + (spec.zero_point or 0) if spec.quantized else threshold

    # ------------------------------------------------------------------------------ per frame
    def __call__(self, transform: Transform) -> Detections:
        import numpy as np

        settings, spec = self.source.settings, self._spec
        threshold = self._threshold(settings.score_threshold)
        if self.kind == "yolov5":  # score = objectness x class: no score passes unless its objectness does
            np.greater(self._table[:, 4], threshold, out=self._over)  # NaN compares False
            keep = np.flatnonzero(self._over)
            scores = spec.dequantize(self._scores[keep]) * spec.dequantize(self._table[keep, 4])[:, None]
        else:
            np.max(self._scores, axis=1, out=self._best)
            np.greater(self._best, threshold, out=self._over)  # a NaN score makes the max NaN: False
            keep = np.flatnonzero(self._over)
            scores = spec.dequantize(self._scores[keep])
        classes = scores.argmax(axis=1)
        best = scores[np.arange(keep.size), classes]
        rows = spec.dequantize(self._table[keep, :4])
        ok = (best > settings.score_threshold) & finite_rows(rows, scores, self._extra[keep])
        keep, best, classes, rows = keep[ok], best[ok], classes[ok], rows[ok]
        normalised = bool(rows.size) and float(np.abs(rows).max()) <= NORMALISED_MAX
        if normalised:
            rows *= self._input_scale
        if self.kind == "obb":
            angles = spec.dequantize(self._extra[keep, 0])
            chosen = np.asarray(rotated_nms(rows, angles, best, classes, settings.iou_threshold,
                                            settings.max_detections), np.intp)
            rotated, boxes = _oriented(rows[chosen], angles[chosen], transform)
            return detections(boxes, best[chosen], classes[chosen], range(chosen.size), self.source, rotated=rotated)
        corners = centre_to_corners(rows)
        chosen = np.asarray(nms(corners, best, classes, settings.iou_threshold, settings.max_detections), np.intp)
        boxes, keep = to_source_boxes(corners[chosen], transform), keep[chosen]
        extra: dict[str, Any] = {}
        if self.kind == "pose":
            extra = {"keypoints": _keypoints(spec.dequantize(self._extra[keep]), self._kpt_shape, normalised,
                                             self.source, transform),
                     "keypoint_names": _keypoint_names(self._kpt_shape[0])}
        elif self._protos is not None:
            extra = {"masks": [self._protos.mask(spec.dequantize(self._extra[row]), box, transform)
                               for row, box in zip(keep, boxes)]}
        return detections(boxes, best[chosen], classes[chosen], range(chosen.size), self.source, **extra)


class EndToEndDecoder:
    """``[1, K, 6(+extra)]`` rows of x1, y1, x2, y2, score, class: the graph chose them (no NMS here). The kind
    of rows is the metadata's task; a second output of prototypes makes them a segmentation model's."""

    def __init__(self, source: DecoderInput) -> None:
        import numpy as np

        metadata = source.metadata
        if metadata.end2end is False:
            raise LayoutMismatch("the model's metadata says its graph leaves the candidates to NMS (end2end False)")
        self.source = source
        main, self._protos = 0, None
        kind = metadata.task or "detect"
        if len(source.outputs) == 2:
            if metadata.task not in (None, "segment"):
                raise LayoutMismatch(f"a {kind} model's selected boxes are one output, not 2")
            kind, (main, self._protos) = "segment", _split_protos(source)
        elif len(source.outputs) != 1:
            raise LayoutMismatch(f"needs one output of selected boxes, not {len(source.outputs)}")
        elif kind == "segment":
            raise LayoutMismatch("a segmentation model's selected boxes need their prototype masks: a second output")
        output = source.outputs[main]
        shape = list(output.shape)
        if len(shape) != 3 or shape[0] != 1 or shape[2] < 6:
            raise LayoutMismatch(f"needs [1, K, 6+] rows (x1, y1, x2, y2, score, class), not {shape}")
        rows, columns = shape[1], shape[2]
        grids = grid_sizes(*source.input_size)
        if rows in grids or rows in {3 * g for g in grids} or (rows > END2END_MAX_ROWS and not metadata.end2end):
            raise LayoutMismatch(f"{rows} rows is a candidate grid, not selected boxes")
        self._kpt_shape = _kpt_shape(source) if kind == "pose" else (0, 0)
        extra = {"obb": 1, "pose": self._kpt_shape[0] * self._kpt_shape[1],
                 "segment": self._protos.count if self._protos is not None else 0}.get(kind, 0)
        if columns != 6 + extra:
            raise LayoutMismatch(f"{columns} values a row; a selected {kind} box has 6 (x1, y1, x2, y2, score, "
                                 f"class){f' + {extra}' if extra else ''}")
        self.kind = kind
        self._spec = source.specs[main]
        self._view = output.reshape(rows, columns)
        self._real = np.empty((rows, columns), np.float32) if self._spec.quantized else None
        self._input_scale = np.array(source.input_size * 2, np.float32)

    def _rows(self) -> np.ndarray:
        """This frame's rows as real values (a quantised output dequantised into a preallocated buffer)."""
        import numpy as np

        spec, real = self._spec, self._real
        if real is None:
            return self._view
        np.subtract(self._view, spec.zero_point or 0, out=real, casting="unsafe")
        np.multiply(real, spec.scale, out=real)
        return real

    def __call__(self, transform: Transform) -> Detections:
        import numpy as np

        settings = self.source.settings
        rows = self._rows()
        scores, classes = rows[:, 4], rows[:, 5]
        valid = (scores > settings.score_threshold) & finite_rows(rows)
        valid &= (classes >= 0) & (classes < MAX_CLASS) & (classes == np.floor(classes))  # a class is a whole number
        keep = np.flatnonzero(valid)
        keep = keep[np.argsort(-scores[keep], kind="stable")][: settings.max_detections]
        selected = rows[keep].astype(np.float32)  # a copy: scaled in place
        boxes = selected[:, :4]
        normalised = bool(boxes.size) and float(np.abs(boxes).max()) <= NORMALISED_MAX
        if normalised:
            boxes *= self._input_scale
        extra: dict[str, Any] = {}
        if self.kind == "obb":  # cx, cy, w, h, score, class, angle
            extra["rotated"], boxes = _oriented(boxes, selected[:, 6], transform)
        else:
            boxes = to_source_boxes(boxes, transform)
        if self.kind == "pose":
            extra = {"keypoints": _keypoints(selected[:, 6:], self._kpt_shape, normalised, self.source, transform),
                     "keypoint_names": _keypoint_names(self._kpt_shape[0])}
        elif self._protos is not None:
            extra = {"masks": [self._protos.mask(row[6:], box, transform) for row, box in zip(selected, boxes)]}
        return detections(boxes, selected[:, 4], selected[:, 5].astype(np.int64), range(keep.size), self.source,
                          **extra)


def _layout(name: str, task: str, summary: str, kind: str, *, guessed: bool) -> Layout:
    return Layout(name, task, summary, lambda source: YoloDecoder(source, kind=kind), ULTRALYTICS, guessed=guessed)


YOLO_LAYOUTS = (
    _layout("yolo-seg", "segment", "Ultralytics instance segmentation: [1, 4+nc+nm, N] + prototypes [1, nm, H, W]",
            "segment", guessed=True),
    Layout("yolo-end2end", "detect", "boxes the graph selected: [1, K, 6+] x1, y1, x2, y2, score, class "
           "(YOLOv10, YOLO26, nms=True)", EndToEndDecoder, ULTRALYTICS, guessed=True,
           also=("pose", "segment", "obb")),
    _layout("yolo", "detect", "Ultralytics YOLOv8/11 detection: [1, 4+nc, N] (or transposed), no NMS", "detect",
            guessed=True),
    _layout("yolo-pose", "pose", "Ultralytics pose: [1, 4+nc+K*3, N], K keypoints a person", "pose", guessed=False),
    _layout("yolo-obb", "obb", "Ultralytics oriented boxes: [1, 4+nc+1, N], the angle last (radians)", "obb",
            guessed=False),
    _layout("yolov5", "detect", "YOLOv5 with objectness: [1, N, 5+nc], 3 anchors a cell", "yolov5", guessed=True),
)
