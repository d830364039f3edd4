"""The two SSD layouts: pytorch-ssd's scores + boxes (Ultraface), and TFLite's detection post-process."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .base import DecoderInput, Layout, LayoutMismatch, Preprocessing, detections, finite_rows, nms, to_source_boxes

if TYPE_CHECKING:
    import numpy as np

    from ..postprocess import Detections
    from ..preprocess import Transform

#: the pytorch-ssd family (Ultraface) normalises float input as (pixel - 127) / 128
SSD_FLOAT_MEAN, SSD_FLOAT_STD = 127.0, 128.0


def _scale_normalised(boxes: np.ndarray, source: DecoderInput) -> np.ndarray:
    width, height = source.input_size
    boxes[:, 0::2] *= width
    boxes[:, 1::2] *= height
    return boxes


class SsdDecoder:
    """``scores`` 1xNxC (class 0 = background; or one column: the score) + ``boxes`` 1xNx4, corner form
    (x1, y1, x2, y2) normalised to the input: thresholded, NMS'd, mapped to source pixels."""

    def __init__(self, source: DecoderInput) -> None:
        import numpy as np

        shapes, names = source.shapes(), [spec.name.lower() for spec in source.specs]
        if len(shapes) != 2:
            raise LayoutMismatch(f"needs 2 outputs (scores 1xNxC, boxes 1xNx4), not {len(shapes)}")
        candidates = [i for i in (0, 1) if len(shapes[i]) >= 2 and shapes[i][-1] == 4]
        named = [i for i in candidates if "box" in names[i]]
        for box_i in named or candidates:
            score_i = 1 - box_i
            n = int(np.prod(shapes[box_i])) // 4
            if n and len(shapes[score_i]) >= 2 and (shapes[score_i][-2] == n or int(np.prod(shapes[score_i])) == n):
                break
        else:
            raise LayoutMismatch("no output pair of boxes 1xNx4 and scores 1xNxC with the same N")
        self.source = source
        self._boxes = source.outputs[box_i].reshape(-1, 4)
        self._scores = source.outputs[score_i].reshape(self._boxes.shape[0], -1)
        self._score_spec, self._box_spec = source.specs[score_i], source.specs[box_i]
        self._mask = np.empty(self._scores.shape[0], bool)

    def __call__(self, transform: Transform) -> Detections:
        import numpy as np

        settings = self.source.settings
        table = self._score_spec.dequantize(self._scores) if self._score_spec.quantized else self._scores
        classes_n = table.shape[1]
        if classes_n <= 2:  # one class (score only), or background + one class: a strided view, no copy
            best, best_class = table[:, classes_n - 1], None
        else:
            best = table[:, 1:].max(axis=1)
            best_class = table[:, 1:].argmax(axis=1) + 1
        np.greater(best, settings.score_threshold, out=self._mask)  # NaN compares False: never kept
        keep = np.flatnonzero(self._mask)
        if keep.size == 0:
            return detections(np.empty((0, 4)), np.empty(0), np.empty(0), (), self.source)
        scores = best[keep].astype(np.float32)
        classes = np.full(keep.size, classes_n - 1, np.int64) if best_class is None else best_class[keep]
        boxes = self._box_spec.dequantize(self._boxes[keep]).astype(np.float32, copy=True)
        finite = finite_rows(boxes)
        boxes, scores, classes = boxes[finite], scores[finite], classes[finite]
        boxes = to_source_boxes(_scale_normalised(boxes, self.source), transform)
        chosen = nms(boxes, scores, classes, settings.iou_threshold, settings.max_detections)
        return detections(boxes, scores, classes, chosen, self.source)


class TfliteSsdDecoder:
    """TFLite ``TFLite_Detection_PostProcess``: boxes 1xNx4 (y1, x1, y2, x2 normalised), classes 1xN, scores
    1xN, count 1 — the Coral / TF Object Detection API SSD models (already NMS'd)."""

    def __init__(self, source: DecoderInput) -> None:
        import numpy as np

        shapes = source.shapes()
        sizes = [int(np.prod(s)) for s in shapes]
        if len(shapes) != 4:
            raise LayoutMismatch(f"needs 4 outputs (boxes, classes, scores, count), not {len(shapes)}")
        counts = [i for i in range(4) if sizes[i] == 1]
        boxes = [i for i in range(4) if len(shapes[i]) == 3 and shapes[i][-1] == 4]
        if len(counts) != 1 or len(boxes) != 1:
            raise LayoutMismatch("no single count output (1 value) and boxes output (1xNx4)")
        rest = [i for i in range(4) if i not in (boxes[0], counts[0])]
        n = shapes[boxes[0]][1]
        if any(sizes[i] != n for i in rest):
            raise LayoutMismatch(f"classes and scores must hold {n} values each, like the boxes")
        self.source = source
        # TFLite_Detection_PostProcess emits boxes, classes, scores, count in this order
        outputs = source.outputs
        self._pp = (outputs[boxes[0]].reshape(-1, 4), outputs[rest[0]].reshape(-1), outputs[rest[1]].reshape(-1),
                    outputs[counts[0]].reshape(-1))

    def __call__(self, transform: Transform) -> Detections:
        import numpy as np

        settings = self.source.settings
        boxes_yx, classes, scores, count = self._pp
        count_value = float(count[0])
        n = min(int(count_value), boxes_yx.shape[0]) if np.isfinite(count_value) and count_value > 0 else 0
        keep = np.flatnonzero(scores[:n] > settings.score_threshold)[: settings.max_detections]
        boxes = boxes_yx[keep][:, [1, 0, 3, 2]].astype(np.float32)
        kept_scores = scores[keep].astype(np.float32)
        kept_classes = classes[keep]
        finite = finite_rows(boxes) & np.isfinite(kept_classes) & (kept_classes >= 0)
        boxes, kept_scores, kept_classes = boxes[finite], kept_scores[finite], kept_classes[finite].astype(np.int64)
        boxes = to_source_boxes(_scale_normalised(boxes, self.source), transform)
        order = np.argsort(-kept_scores, kind="stable")
        return detections(boxes, kept_scores, kept_classes, order.tolist(), self.source)


SSD = Layout("ssd", "detect", "scores 1xNxC + boxes 1xNx4 (corner form, normalised): pytorch-ssd, Ultraface",
             SsdDecoder, Preprocessing(mean=SSD_FLOAT_MEAN, std=SSD_FLOAT_STD))
TFLITE_SSD = Layout("tflite-ssd", "detect",
                    "TFLite_Detection_PostProcess: boxes, classes, scores, count (NMS inside): Coral, TF OD API",
                    TfliteSsdDecoder, Preprocessing(resize="stretch"))
