"""YOLOX (``yolox``): ``[1, N, 5+nc]`` — cx, cy, w, h, objectness, nc class scores — one row per cell of the
anchor-free grids of strides 8, 16 and 32 (N = 8400 at 640x640; YOLOv5's 3 anchors a cell make 3N, which
stays ``yolov5``'s; Ultralytics' ``[1, 4+nc, N]`` has no objectness and its metadata sends it to the YOLO
layouts first). Objectness and class scores come out of the graph through a sigmoid; score = objectness x
the best class score, thresholded, then per-class NMS.

**Raw or decoded.** YOLOX's exporter leaves the boxes as the head's raw offsets unless asked to decode them
(``decode_in_inference``). Raw: xy = (pred + cell) x stride, wh = exp(pred) x stride, where a cell is its
grid's (column, row) and the rows run stride by stride, row-major (YOLOX's own order). Which one a model
gives is read from each frame's centres: decoded centres divided by their stride lie within a cell or two of
their cell, raw ones are offsets of about a cell from 0 — over a sample of rows spread across the grids, the
median distance to each hypothesis is near 0.5 for the true one and tens of cells (or hundreds of pixels)
for the other, whatever the frame shows. :attr:`YoloxDecoder.decoded` says which the last frame was.

**Preprocessing.** What YOLOX's own ``preproc`` (``yolox.data.data_augment``) feeds, which its models were
trained on: BGR pixels 0-255 unnormalised, the image resized by ``min(H / h, W / w)`` (its size truncated) at
the top-left of a 114-grey letterbox, the whole border bottom-right. The layout states exactly that
(:data:`YOLOX_PIXELS`), so the preprocessor's input is YOLOX's to the bit and boxes come back by YOLOX's ratio;
fed RGB and a centred border instead, the scores move by tenths and objects are lost (docs/pipeline.md).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

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
)

if TYPE_CHECKING:
    import numpy as np

    from ..postprocess import Detections
    from ..preprocess import Transform

STRIDES = (8, 16, 32)
#: YOLOX's preproc: BGR 0-255, letterboxed at the top-left corner in grey 114 (see the module's docstring)
YOLOX_PIXELS = Preprocessing(resize="letterbox", mean=0.0, std=1.0, channels="bgr", pad="corner", pad_value=114)
#: rows sampled per frame to tell raw offsets from decoded boxes
SAMPLE_ROWS = 512


def yolox_grid(width: int, height: int) -> tuple[np.ndarray, np.ndarray]:
    """Each row's cell (column, row) and stride, in YOLOX's order (stride by stride, row-major)."""
    import numpy as np

    cells, strides = [], []
    for stride in STRIDES:
        columns, rows = math.ceil(width / stride), math.ceil(height / stride)
        ys, xs = np.meshgrid(np.arange(rows), np.arange(columns), indexing="ij")
        cells.append(np.stack([xs, ys], axis=-1).reshape(-1, 2))
        strides.append(np.full(rows * columns, stride))
    return np.concatenate(cells).astype(np.float32), np.concatenate(strides).astype(np.float32)


#: YOLOX's released heads are COCO's 80 classes
COCO_CLASSES = 80


class YoloxDecoder:
    """Rows of a YOLOX head (raw or decoded) -> thresholded, NMS'd detections."""

    def __init__(self, source: DecoderInput) -> None:
        import numpy as np

        if len(source.outputs) != 1:
            raise LayoutMismatch(f"needs one output [1, N, 5+nc], not {len(source.outputs)}")
        if source.metadata.producer == "ultralytics":
            raise LayoutMismatch("Ultralytics made this model: its heads have no objectness")
        shape = tuple(source.outputs[0].shape)
        width, height = source.input_size
        self._cells, self._strides = yolox_grid(width, height)
        n = self._cells.shape[0]
        if len(shape) != 3 or shape[0] != 1 or shape[1] != n:
            raise LayoutMismatch(f"needs [1, {n}, 5+nc] rows (the stride 8/16/32 grids of a {width}x{height} "
                                 f"input), not {list(shape)}")
        classes = shape[2] - 5
        stated = len(source.metadata.names) if source.metadata.names else (
            len(source.labels) if source.labels else None)
        if classes < 1 or (stated is not None and stated != classes):
            raise LayoutMismatch(f"{shape[2]} values a row is not 4 box values, objectness and "
                                 f"{stated or 'at least one'} class scores")
        if stated is None and classes != COCO_CLASSES:
            # [1, N, C] with no names is a transposed Ultralytics table as much as a YOLOX one: shapes alone
            # say YOLOX only for its COCO head (85 = 5 + 80; Ultralytics' COCO table is 84)
            raise LayoutMismatch(f"[1, N, {shape[2]}] with no class names is not told from a transposed YOLO "
                                 f"table: name the labels or --decoder yolox")
        self.source = source
        self._table = source.outputs[0].reshape(n, shape[2])
        self._spec = source.specs[0]
        self._sample = np.linspace(0, n - 1, min(SAMPLE_ROWS, n)).astype(np.int64)
        self._objectness = np.empty(n, np.float32)
        self._mask = np.empty(n, bool)
        #: whether the last frame's boxes were decoded by the graph (None before the first frame)
        self.decoded: bool | None = None

    def _is_decoded(self) -> bool:
        """Whether the centres are pixels near their cells (decoded) rather than offsets near 0 (raw)."""
        import numpy as np

        rows = self._sample
        xy = self._spec.dequantize(self._table[rows, :2]).astype(np.float64)
        as_decoded = np.abs(xy / self._strides[rows, None] - self._cells[rows] - 0.5)
        as_raw = np.abs(xy - 0.5)
        return bool(np.nanmedian(as_decoded) < np.nanmedian(as_raw)) if np.isfinite(xy).any() else False

    def __call__(self, transform: Transform) -> Detections:
        import numpy as np

        settings = self.source.settings
        table, spec = self._table, self._spec
        np.copyto(self._objectness, spec.dequantize(table[:, 4]), casting="unsafe")
        np.greater(self._objectness, settings.score_threshold, out=self._mask)  # NaN compares False
        keep = np.flatnonzero(self._mask)
        class_scores = spec.dequantize(table[keep, 5:]).astype(np.float32) * self._objectness[keep, None]
        classes = class_scores.argmax(axis=1)
        best = class_scores[np.arange(keep.size), classes]
        chosen = best > settings.score_threshold
        keep, classes, best = keep[chosen], classes[chosen], best[chosen]
        rows = spec.dequantize(table[keep, :4]).astype(np.float32)
        self.decoded = self._is_decoded()
        if not self.decoded:
            stride = self._strides[keep, None]
            rows[:, :2] = (rows[:, :2] + self._cells[keep]) * stride
            rows[:, 2:] = np.exp(np.minimum(rows[:, 2:], 30.0)) * stride  # clipped: exp must not overflow
        finite = finite_rows(rows) & (rows[:, 2] >= 0) & (rows[:, 3] >= 0)
        rows, classes, best = rows[finite], classes[finite], best[finite]
        boxes = to_source_boxes(centre_to_corners(rows), transform)
        chosen_rows = nms(boxes, best, classes, settings.iou_threshold, settings.max_detections)
        return detections(boxes, best, classes, chosen_rows, self.source)


YOLOX = Layout("yolox", "detect", "YOLOX: [1, N, 5+nc] over the stride 8/16/32 grids, raw offsets or decoded boxes",
               YoloxDecoder, YOLOX_PIXELS)
