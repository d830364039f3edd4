"""Ultralytics YOLO (v5, v8, v11 and later), as its exporters leave it: detect, pose, segment, oriented boxes.

* ``yolo``: ``[1, 4+nc, N]`` (or its transpose): cx, cy, w, h, one score per class; no objectness, no NMS.
* ``yolo-pose``: ``[1, 4+nc+K*D, N]``: the same, then K keypoints of (x, y[, visibility]) — K and D from the
  metadata's ``kpt_shape`` (17 x 3 when it says nothing).
* ``yolo-seg``: ``[1, 4+nc+nm, N]`` and prototype masks ``[1, nm, mh, mw]``: each kept box's coefficients
  times the prototypes, cropped to the box, at source resolution.
* ``yolo-obb``: ``[1, 4+nc+1, N]``: the same, then the angle (radians); NMS on the rotated boxes.
* ``yolov5``: ``[1, N, 5+nc]``: cx, cy, w, h, objectness, class probabilities (score = objectness x class).
* ``yolo-end2end``: ``[1, K, 6(+extra)]``: x1, y1, x2, y2, score, class — the graph selected its own boxes
  (YOLOv10, YOLO26, ``nms=True`` exports); extra columns are mask coefficients, keypoints or the angle.

Coordinates are input pixels, or normalised to the input (Ultralytics' TFLite exports): told apart per
frame from the kept boxes themselves (no box of a real object fits in 2 pixels). Quantised outputs are
dequantised. Rows with NaN or inf are never a box; a class past the names keeps its number as its label.
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

#: Ultralytics' preprocessing: RGB in [0, 1], letterboxed (its pad grey, 114, is the preprocessor's own)
ULTRALYTICS = Preprocessing(resize="letterbox", mean=0.0, std=255.0)
#: the anchor-free heads' strides (P3-P5; P6 models add 64)
STRIDES = ((8, 16, 32), (8, 16, 32, 64))
#: boxes whose every coordinate is at most this are normalised to the input
NORMALISED_MAX = 2.0


def grid_sizes(width: int, height: int) -> set[int]:
    """The candidate counts an anchor-free head has for this input (P3-P5 and P3-P6)."""
    return {sum(math.ceil(width / s) * math.ceil(height / s) for s in strides) for strides in STRIDES}


def _classes(source: DecoderInput) -> int | None:
    """Class count the model states (metadata names, else the labels given), None when unknown."""
    if source.metadata.names:
        return len(source.metadata.names)
    return len(source.labels) if source.labels else None


def _table(source: DecoderInput, index: int, *, min_columns: int) -> tuple[np.ndarray, bool]:
    """Output ``index`` as an (N, C) view of candidates (a transposed view of ``[1, C, N]``), and whether it
    was transposed. The candidate axis is the one of a grid size, else the longer one."""
    output = source.outputs[index]
    shape = tuple(output.shape)
    squeezed = [d for d in shape]
    while len(squeezed) > 2 and squeezed[0] == 1:
        squeezed.pop(0)
    if len(squeezed) != 2:
        raise LayoutMismatch(f"needs a [1, C, N] or [1, N, C] table, not {list(shape)}")
    first, second = squeezed
    grids = grid_sizes(*source.input_size)
    transposed = second in grids or (first not in grids and second > first)  # [C, N]: candidates on axis 1
    view = output.reshape(first, second)
    table = view.T if transposed else view
    if table.shape[1] < min_columns:
        raise LayoutMismatch(f"a candidate row holds {table.shape[1]} values; this layout needs at least {min_columns}")
    return table, transposed


class YoloDecoder:
    """Candidates → thresholded, NMS'd detections (and their keypoints, masks or angles)."""

    def __init__(self, source: DecoderInput, *, kind: str) -> None:
        import numpy as np

        self.source, self.kind = source, kind
        main = 0
        self._protos = None
        if kind == "segment":
            main, self._protos = self._split_protos(source)
        elif len(source.outputs) != 1:
            raise LayoutMismatch(f"needs one output, not {len(source.outputs)}")
        self._table, transposed = _table(source, main, min_columns=5)
        self._spec = source.specs[main]
        n, columns = self._table.shape
        grids = grid_sizes(*source.input_size)
        if kind != "yolov5" and n not in grids and not (source.metadata.producer and transposed):
            raise LayoutMismatch(f"{n} candidates is not an anchor-free grid of a {source.input_size[0]}x"
                                 f"{source.input_size[1]} input ({', '.join(map(str, sorted(grids)))})")
        extra = self._extra_columns(source, columns)
        self.classes = columns - 4 - extra - (1 if kind == "yolov5" else 0)
        stated = _classes(source)
        if self.classes < 1 or (stated is not None and kind != "detect" and stated != self.classes):
            raise LayoutMismatch(f"{columns} values a candidate do not split into 4 box values, "
                                 f"{stated or 'some'} class scores and {extra} {kind} values")
        if kind == "detect" and stated is not None and stated != self.classes:
            raise LayoutMismatch(f"{columns} values a candidate is 4 + {self.classes} classes; the model names "
                                 f"{stated}")
        if kind == "yolov5" and n not in {3 * g for g in grids}:
            raise LayoutMismatch(f"{n} candidates is not 3 anchors a cell of a {source.input_size[0]}x"
                                 f"{source.input_size[1]} input's grid")
        first_score = 5 if kind == "yolov5" else 4
        self._scores = self._table[:, first_score:first_score + self.classes]
        self._extra = self._table[:, first_score + self.classes:]
        self._best = np.empty(n, np.float32)
        self._mask = np.empty(n, bool)

    def _split_protos(self, source: DecoderInput) -> tuple[int, Any]:
        if len(source.outputs) != 2:
            raise LayoutMismatch(f"needs 2 outputs (candidates and prototype masks), not {len(source.outputs)}")
        ranks = [len([d for d in o.shape if d > 1]) for o in source.outputs]
        if sorted(ranks) != [2, 3]:
            raise LayoutMismatch("needs a candidate table and a 1 x nm x H x W prototype output")
        proto_i = ranks.index(3)
        protos = source.outputs[proto_i]
        shape = [d for d in protos.shape if d > 1] if protos.ndim > 3 else list(protos.shape)
        shape = list(protos.shape[-3:])
        channels_last = shape[2] < shape[0] and shape[2] <= 64  # TFLite: 1 x H x W x nm
        self._proto_spec = source.specs[proto_i]
        view = protos.reshape(shape)
        self._proto_view = view.transpose(2, 0, 1) if channels_last else view
        return 1 - proto_i, self._proto_view

    def _extra_columns(self, source: DecoderInput, columns: int) -> int:
        if self.kind == "pose":
            k, d = source.metadata.kpt_shape or (len(KEYPOINT_NAMES), 3)
            if d not in (2, 3):
                raise LayoutMismatch(f"keypoints of {d} values are neither (x, y) nor (x, y, visibility)")
            self._kpt_shape = (k, d)
            return k * d
        if self.kind == "obb":
            return 1
        if self.kind == "segment":
            return int(self._proto_view.shape[0])
        return 0

    # ------------------------------------------------------------------------------ per frame
    def __call__(self, transform: Transform) -> Detections:
        import numpy as np

        settings = self.source.settings
        scores = self._scores
        spec = self._spec
        if spec.quantized:
            scores = spec.dequantize(scores)
        if self.kind == "yolov5":
            objectness = spec.dequantize(self._table[:, 4])
            np.greater(objectness, settings.score_threshold, out=self._mask)
            keep = np.flatnonzero(self._mask)
            table = scores[keep] * objectness[keep, None]
            best, classes = table.max(axis=1), table.argmax(axis=1)
            chosen_mask = best > settings.score_threshold
            keep, best, classes = keep[chosen_mask], best[chosen_mask], classes[chosen_mask]
        else:
            np.max(scores, axis=1, out=self._best)
            np.greater(self._best, settings.score_threshold, out=self._mask)  # NaN compares False
            keep = np.flatnonzero(self._mask)
            best = self._best[keep]
            classes = scores[keep].argmax(axis=1)
        rows = spec.dequantize(self._table[keep, :4]).astype(np.float32, copy=False)
        finite = finite_rows(rows, self._extra[keep]) if self._extra.shape[1] else finite_rows(rows)
        keep, best, classes, rows = keep[finite], best[finite].astype(np.float32), classes[finite], rows[finite]
        normalised = bool(rows.size) and float(np.abs(rows).max()) <= NORMALISED_MAX
        scale = np.array(self.source.input_size * 2, np.float32) if normalised else None
        if scale is not None:
            rows = rows * scale
        if self.kind == "obb":
            return self._oriented(rows, best, classes, keep, transform)
        boxes = to_source_boxes(centre_to_corners(rows), transform)
        chosen = nms(boxes, best, classes, settings.iou_threshold, settings.max_detections)
        return self._finish(boxes, best, classes, keep, chosen, transform, normalised)

    def _finish(self, boxes, best, classes, keep, chosen, transform, normalised: bool) -> Detections:
        keypoints = names = masks = None
        if self.kind == "pose":
            keypoints, names = self._keypoints(keep, transform, normalised), _keypoint_names(self._kpt_shape[0])
        elif self.kind == "segment":
            masks = [self._instance_mask(keep[i], boxes[i], transform) for i in chosen]
        return detections(boxes, best, classes, chosen, self.source, keypoints=keypoints,
                          keypoint_names=names or (), masks=masks)

    def _keypoints(self, keep: np.ndarray, transform: Transform, normalised: bool) -> np.ndarray:
        import numpy as np

        k, d = self._kpt_shape
        raw = self._spec.dequantize(self._extra[keep]).reshape(-1, k, d).astype(np.float32)
        points = np.ones((raw.shape[0], k, 3), np.float32)
        points[..., :2] = raw[..., :2]
        if d == 3:
            points[..., 2] = raw[..., 2]
        if normalised:
            points[..., 0] *= self.source.input_size[0]
            points[..., 1] *= self.source.input_size[1]
        to_source_points(points[..., :2], transform)
        return points

    def _instance_mask(self, row: int, box, transform: Transform) -> InstanceMask:
        """The box's mask: its coefficients times the prototypes, sampled at the box's source pixels."""
        import cv2
        import numpy as np

        protos = self._proto_spec.dequantize(self._proto_view) if self._proto_spec.quantized else self._proto_view
        nm, mh, mw = protos.shape
        coefficients = self._spec.dequantize(self._extra[row]).astype(np.float32)
        logits = (coefficients @ protos.reshape(nm, -1).astype(np.float32, copy=False)).reshape(mh, mw)
        x0, y0 = math.floor(box[0]), math.floor(box[1])
        x1, y1 = max(x0 + 1, math.ceil(box[2])), max(y0 + 1, math.ceil(box[3]))
        # source pixel (u, v) -> input (u * sx + px) -> prototype (* mw / input width); centres aligned
        fx, fy = mw / self.source.input_size[0], mh / self.source.input_size[1]
        ax, ay = transform.scale_x * fx, transform.scale_y * fy
        matrix = np.array([[ax, 0.0, (x0 + 0.5) * ax + transform.pad_x * fx - 0.5],
                           [0.0, ay, (y0 + 0.5) * ay + transform.pad_y * fy - 0.5]], np.float64)
        crop = cv2.warpAffine(logits, matrix, (x1 - x0, y1 - y0), flags=cv2.INTER_LINEAR | cv2.WARP_INVERSE_MAP,
                              borderMode=cv2.BORDER_CONSTANT, borderValue=-1.0)
        return InstanceMask(x0, y0, crop > 0.0)  # sigmoid > 0.5

    def _oriented(self, rows, best, classes, keep, transform: Transform) -> Detections:
        import numpy as np

        angles = self._spec.dequantize(self._extra[keep, 0]).astype(np.float32)
        settings = self.source.settings
        chosen = rotated_nms(rows, angles, best, classes, settings.iou_threshold, settings.max_detections)
        rotated = np.empty((rows.shape[0], 5), np.float32)
        centres = rows[:, :2].copy()
        to_source_points(centres, transform)
        rotated[:, :2] = centres
        rotated[:, 2] = rows[:, 2] / transform.scale_x
        rotated[:, 3] = rows[:, 3] / transform.scale_y
        rotated[:, 4] = angles
        boxes = upright_boxes(rotated, transform)
        return detections(boxes, best, classes, chosen, self.source, rotated=rotated)


def _keypoint_names(count: int) -> tuple[str, ...]:
    return KEYPOINT_NAMES if count == len(KEYPOINT_NAMES) else tuple(f"kp{i}" for i in range(count))


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


class EndToEndDecoder:
    """``[1, K, 6(+extra)]`` rows of x1, y1, x2, y2, score, class: the graph chose them (no NMS here)."""

    def __init__(self, source: DecoderInput) -> None:
        self.source = source
        kind = source.metadata.task or "detect"
        protos = None
        main = 0
        if len(source.outputs) == 2 and kind == "segment":
            helper = YoloDecoder.__new__(YoloDecoder)
            main, protos = YoloDecoder._split_protos(helper, source)
            self._proto_helper = helper
        elif len(source.outputs) != 1:
            raise LayoutMismatch(f"needs one output of selected boxes, not {len(source.outputs)}")
        output = source.outputs[main]
        shape = [d for d in output.shape]
        if len(shape) != 3 or shape[0] != 1 or shape[2] < 6:
            raise LayoutMismatch(f"needs [1, K, 6+] rows (x1, y1, x2, y2, score, class), not {list(output.shape)}")
        if shape[1] in grid_sizes(*source.input_size) or shape[1] > 1000:
            raise LayoutMismatch(f"{shape[1]} rows is a candidate grid, not selected boxes")
        if shape[2] > 6 and kind == "detect":
            raise LayoutMismatch(f"{shape[2]} values a row; a selected box has 6 (x1, y1, x2, y2, score, class)")
        self.kind, self._protos = kind, protos
        self._rows = output.reshape(shape[1], shape[2])
        self._spec = source.specs[main]
        if kind == "pose":
            k, d = source.metadata.kpt_shape or (len(KEYPOINT_NAMES), 3)
            if shape[2] != 6 + k * d:
                raise LayoutMismatch(f"{shape[2]} values a row is not 6 + {k} keypoints x {d}")
            self._kpt_shape = (k, d)

    def __call__(self, transform: Transform) -> Detections:
        import numpy as np

        settings = self.source.settings
        rows = self._spec.dequantize(self._rows).astype(np.float32, copy=False)
        scores = rows[:, 4]
        keep = np.flatnonzero((scores > settings.score_threshold) & finite_rows(rows))
        keep = keep[np.argsort(-scores[keep], kind="stable")][: settings.max_detections]
        classes = rows[keep, 5]
        valid = (classes >= 0) & (classes == np.floor(classes))
        keep = keep[valid]
        selected = rows[keep]
        boxes = selected[:, :4].copy()
        if self.kind == "obb":  # cx, cy, w, h, score, class, angle
            boxes = centre_to_corners(boxes)
        normalised = bool(boxes.size) and float(np.abs(boxes).max()) <= NORMALISED_MAX
        if normalised:
            boxes *= np.array(self.source.input_size * 2, np.float32)
        boxes = to_source_boxes(boxes, transform)
        chosen = list(range(len(keep)))
        extra: dict[str, Any] = {}
        if self.kind == "pose":
            k, d = self._kpt_shape
            raw = selected[:, 6:].reshape(-1, k, d)
            points = np.ones((raw.shape[0], k, 3), np.float32)
            points[..., :d] = raw
            if normalised:
                points[..., 0] *= self.source.input_size[0]
                points[..., 1] *= self.source.input_size[1]
            to_source_points(points[..., :2], transform)
            extra = {"keypoints": points, "keypoint_names": _keypoint_names(k)}
        elif self.kind == "segment" and self._protos is not None:
            helper = self._proto_helper
            helper.source, helper._spec, helper._extra = self.source, self._spec, self._rows[:, 6:]
            extra = {"masks": [helper._instance_mask(int(keep[i]), boxes[i], transform) for i in chosen]}
        return detections(boxes, selected[:, 4], selected[:, 5].astype(np.int64), chosen, self.source, **extra)


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
