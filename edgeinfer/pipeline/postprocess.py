"""Turning output tensors into typed results."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

    from ..runtime.model import TensorSpec
    from .labels import Labels


@dataclass(frozen=True, slots=True)
class Classification:
    """One class of a top-k result; ``score`` is a probability in [0, 1]."""

    index: int
    label: str
    score: float

    def to_dict(self) -> dict:
        return {"index": self.index, "label": self.label, "score": round(self.score, 6)}


def class_scores(output: np.ndarray, spec: TensorSpec) -> np.ndarray:
    """Dequantised 1-D class scores in [0, 1] (softmax applied when the model emits logits)."""
    import numpy as np

    scores = np.array(spec.dequantize(output), dtype=np.float32).reshape(-1)  # a copy: normalised in place
    counts = not spec.quantized and bool(np.issubdtype(np.asarray(output).dtype, np.unsignedinteger))
    return as_probabilities(scores, counts=counts)


def as_probabilities(scores: np.ndarray, *, counts: bool = False, probabilities: bool = False) -> np.ndarray:
    """``scores`` (dequantised, 1-D float) made class probabilities, in place. ``counts``: an unsigned integer
    output with no scale anywhere in the model (inspect_model notes it) — a quantised softmax's steps, read
    as shares of their sum (a softmax of the raw integers would say ~1.0 whatever they were);
    ``probabilities``: the output's whole range lies in [0, 1]; otherwise values outside [0, 1] are logits,
    softmaxed."""
    import numpy as np

    if counts:
        total = scores.sum()
        if total > 0:
            np.divide(scores, total, out=scores)
    elif not probabilities and scores.size and (scores.min() < -1e-6 or scores.max() > 1.0 + 1e-6):
        np.subtract(scores, scores.max(), out=scores)
        np.exp(scores, out=scores)
        np.divide(scores, scores.sum(), out=scores)
    return scores


def top_k(scores: np.ndarray, k: int, labels: Labels | None = None) -> list[Classification]:
    """The ``k`` highest scores, best first."""
    import numpy as np

    k = max(1, min(k, scores.size))
    best = np.argpartition(scores, -k)[-k:]
    best = best[np.argsort(scores[best])[::-1]]
    return [
        Classification(int(i), labels[int(i)] if labels else str(int(i)), float(scores[i])) for i in best
    ]


# ------------------------------------------------------------------------------------------
# Decoders: built once per (engine, task), bound to the engine's output views, called per frame.
# They preallocate their scratch buffers; what they allocate per frame is the result itself.
# ------------------------------------------------------------------------------------------

#: MoveNet / COCO keypoint order
KEYPOINT_NAMES = (
    "nose", "left_eye", "right_eye", "left_ear", "right_ear", "left_shoulder", "right_shoulder",
    "left_elbow", "right_elbow", "left_wrist", "right_wrist", "left_hip", "right_hip", "left_knee",
    "right_knee", "left_ankle", "right_ankle",
)

DEFAULT_SCORE_THRESHOLD = 0.5
DEFAULT_IOU_THRESHOLD = 0.45
DEFAULT_MAX_DETECTIONS = 100


@dataclass(frozen=True, slots=True)
class Detection:
    """One detected object: a box in source-frame pixels (x1, y1, x2, y2), its score and class.

    ``track_id`` is set by a tracker (edgeinfer.pipeline.tracking) on detections of a confirmed track.
    """

    box: tuple[float, float, float, float]
    score: float
    class_id: int
    label: str
    track_id: int | None = None

    def to_dict(self) -> dict:
        data = {"box": [round(v, 1) for v in self.box], "score": round(self.score, 6),
                "class_id": self.class_id, "label": self.label}
        if self.track_id is not None:
            data["track_id"] = self.track_id
        return data


@dataclass(frozen=True)
class Detections:
    """The detections of one frame, best score first (a sequence of :class:`Detection`)."""

    items: tuple[Detection, ...] = ()

    def __len__(self) -> int:
        return len(self.items)

    def __iter__(self):
        return iter(self.items)

    def __getitem__(self, index: int) -> Detection:
        return self.items[index]

    def to_dict(self) -> list[dict]:
        return [d.to_dict() for d in self.items]


@dataclass(frozen=True, slots=True)
class Keypoint:
    """A body keypoint in source-frame pixels with its confidence."""

    name: str
    x: float
    y: float
    score: float

    def to_dict(self) -> dict:
        return {"name": self.name, "x": round(self.x, 1), "y": round(self.y, 1), "score": round(self.score, 6)}


@dataclass(frozen=True)
class Pose:
    """One person's keypoints; ``score`` is the mean keypoint confidence."""

    keypoints: tuple[Keypoint, ...]
    score: float

    def __getitem__(self, name: str) -> Keypoint:
        for keypoint in self.keypoints:
            if keypoint.name == name:
                return keypoint
        raise KeyError(name)

    def to_dict(self) -> dict:
        return {"score": round(self.score, 6), "keypoints": [k.to_dict() for k in self.keypoints]}


@dataclass(frozen=True, eq=False)
class Segmentation:
    """A per-pixel class map in source-frame size (uint8 class ids) and the classes present."""

    mask: np.ndarray
    class_ids: tuple[int, ...]
    labels: tuple[str, ...]
    #: share of the frame's pixels per class id present
    fractions: tuple[float, ...]

    def class_mask(self, class_id: int) -> np.ndarray:
        """Boolean HxW mask of one class."""
        return self.mask == class_id

    def to_dict(self) -> dict:
        return {"shape": list(self.mask.shape),
                "classes": [{"class_id": c, "label": label, "fraction": round(f, 6)}
                            for c, label, f in zip(self.class_ids, self.labels, self.fractions)]}


def _label(labels: Labels | None, index: int) -> str:
    return labels[index] if labels else str(index)


class ClassificationDecoder:
    """Top-k classes of a classifier output, allocation-free apart from the result list."""

    def __init__(self, output: np.ndarray, spec: TensorSpec, labels: Labels | None = None, k: int = 5) -> None:
        import numpy as np

        if k < 1:
            raise ValueError(f"top_k must be >= 1, not {k}")
        if sum(1 for d in output.shape if d > 1) > 1:
            raise ValueError(
                f"task 'classify' needs a 1xN class-score output; this model outputs {list(output.shape)}"
            )
        if not output.flags.c_contiguous:
            raise ValueError("the classifier output must be a contiguous tensor (the engine's output view)")
        self._flat = output.reshape(-1)
        self.spec = spec
        self.labels = labels
        self.k = min(k, self._flat.size)
        self._scores = np.empty(self._flat.size, np.float32)
        self._work = np.empty(self._flat.size, np.float32)
        # names made once: a per-frame str(index) would be an allocation per class per frame
        self._names = [_label(labels, i) for i in range(self._flat.size)]
        self._quantized = spec.quantized
        self._zero = float(spec.zero_point or 0)
        self._scale = float(spec.scale or 1.0)
        # a quantised output whose whole range lies in [0, 1] holds probabilities: never softmax it
        self._probabilities = False
        if self._quantized and np.issubdtype(output.dtype, np.integer):
            info = np.iinfo(output.dtype)
            low, high = (info.min - self._zero) * self._scale, (info.max - self._zero) * self._scale
            self._probabilities = low >= -1e-6 and high <= 1.0 + 1e-6
        # an unsigned integer output with no scale anywhere in the model (see as_probabilities)
        self._counts = not self._quantized and bool(np.issubdtype(output.dtype, np.unsignedinteger))

    def scores(self) -> np.ndarray:
        """Dequantised class probabilities (softmax applied to logits) in a reused buffer."""
        import numpy as np

        scores = self._scores
        np.copyto(scores, self._flat, casting="unsafe")
        if self._quantized:
            np.subtract(scores, self._zero, out=scores)
            np.multiply(scores, self._scale, out=scores)
        return as_probabilities(scores, counts=self._counts, probabilities=self._probabilities)

    def __call__(self, transform: object = None) -> list[Classification]:
        import numpy as np

        scores = self.scores()
        if self.k > 8:
            return top_k(scores, self.k, self.labels)
        work = self._work
        np.copyto(work, scores)
        found = []
        for _ in range(self.k):
            index = int(work.argmax())
            found.append(Classification(index, self._names[index], float(scores[index])))
            work[index] = -1.0
        return found


class DetectionDecoder:
    """Boxes from an SSD-style detector, thresholded, NMS'd and mapped back to source pixels.

    Two output layouts are understood:

    * ``scores`` 1xNxC (class 0 = background) + ``boxes`` 1xNx4, corner form (x1, y1, x2, y2)
      normalised to the input — Ultraface and other pytorch-ssd exports;
    * TFLite ``TFLite_Detection_PostProcess``: boxes 1xNx4 (y1, x1, y2, x2 normalised), classes 1xN,
      scores 1xN, count 1 — the Coral / TF Object Detection API SSD models (already NMS'd).
    """

    def __init__(self, outputs: list[np.ndarray], specs: tuple[TensorSpec, ...], input_size: tuple[int, int],
                 labels: Labels | None = None, *, score_threshold: float = DEFAULT_SCORE_THRESHOLD,
                 iou_threshold: float = DEFAULT_IOU_THRESHOLD, max_detections: int = DEFAULT_MAX_DETECTIONS) -> None:
        import numpy as np

        if not 0.0 <= score_threshold <= 1.0 or not 0.0 < iou_threshold <= 1.0 or max_detections < 1:
            raise ValueError("need 0 <= score_threshold <= 1, 0 < iou_threshold <= 1 and max_detections >= 1")
        self.labels = labels
        self.score_threshold = score_threshold
        self.iou_threshold = iou_threshold
        self.max_detections = max_detections
        self.input_width, self.input_height = input_size
        shapes = [tuple(o.shape) for o in outputs]
        found = _detection_outputs(shapes, [spec.name or "" for spec in specs])
        if found is None:
            described = ", ".join(f"{s.name or '?'} {list(shape)}" for s, shape in zip(specs, shapes))
            raise ValueError(
                f"task 'detect' needs SSD-style outputs (scores 1xNxC + boxes 1xNx4, or TFLite detection "
                f"post-process boxes/classes/scores/count); this model has {described}"
            )
        self.layout, order = found
        if self.layout == "ssd":
            box_i, score_i = order
            self._boxes = outputs[box_i].reshape(-1, 4)
            self._scores = outputs[score_i].reshape(self._boxes.shape[0], -1)
            self._score_spec = specs[score_i]
            self._box_spec = specs[box_i]
            self._mask = np.empty(self._scores.shape[0], bool)
        else:
            box_i, class_i, score_i, count_i = order
            self._pp = (outputs[box_i].reshape(-1, 4), outputs[class_i].reshape(-1), outputs[score_i].reshape(-1),
                        outputs[count_i].reshape(-1))

    def __call__(self, transform) -> Detections:
        if self.layout == "ssd":
            return self._decode_ssd(transform)
        return self._decode_postprocessed(transform)

    def _to_source(self, boxes: np.ndarray, transform) -> np.ndarray:
        """Normalised (x1, y1, x2, y2) rows -> source pixels, in place."""
        import numpy as np

        boxes[:, 0::2] *= self.input_width
        boxes[:, 1::2] *= self.input_height
        boxes[:, 0::2] -= transform.pad_x
        boxes[:, 0::2] /= transform.scale_x
        boxes[:, 1::2] -= transform.pad_y
        boxes[:, 1::2] /= transform.scale_y
        np.clip(boxes[:, 0::2], 0.0, transform.source_width, out=boxes[:, 0::2])
        np.clip(boxes[:, 1::2], 0.0, transform.source_height, out=boxes[:, 1::2])
        return boxes

    def _decode_ssd(self, transform) -> Detections:
        import numpy as np

        table = self._score_spec.dequantize(self._scores) if self._score_spec.quantized else self._scores
        classes_n = table.shape[1]
        if classes_n <= 2:  # one class (score only), or background + one class: a strided view, no copy
            best, best_class = table[:, classes_n - 1], None
        else:
            best = table[:, 1:].max(axis=1)
            best_class = table[:, 1:].argmax(axis=1) + 1
        np.greater(best, self.score_threshold, out=self._mask)
        keep = np.flatnonzero(self._mask)
        if keep.size == 0:
            return Detections()
        scores = best[keep].astype(np.float32)
        classes = np.full(keep.size, classes_n - 1, np.int64) if best_class is None else best_class[keep]
        boxes = self._box_spec.dequantize(self._boxes[keep]).astype(np.float32, copy=True)
        boxes = self._to_source(boxes, transform)
        chosen = nms(boxes, scores, classes, self.iou_threshold, self.max_detections)
        return Detections(tuple(
            Detection(tuple(float(v) for v in boxes[i]), float(scores[i]), int(classes[i]),
                      _label(self.labels, int(classes[i])))
            for i in chosen
        ))

    def _decode_postprocessed(self, transform) -> Detections:
        import numpy as np

        boxes_yx, classes, scores, count = self._pp
        n = min(int(count[0]), boxes_yx.shape[0])
        keep = [i for i in range(n) if scores[i] > self.score_threshold][: self.max_detections]
        if not keep:
            return Detections()
        boxes = boxes_yx[keep][:, [1, 0, 3, 2]].astype(np.float32)
        boxes = self._to_source(boxes, transform)
        order = sorted(range(len(keep)), key=lambda j: -float(scores[keep[j]]))
        return Detections(tuple(
            Detection(tuple(float(v) for v in boxes[j]), float(scores[keep[j]]), int(classes[keep[j]]),
                      _label(self.labels, int(classes[keep[j]])))
            for j in order
        ))


def _detection_outputs(shapes: list[tuple[int, ...]], names: list[str]) -> tuple[str, tuple[int, ...]] | None:
    """("ssd", (boxes, scores)) or ("postprocessed", (boxes, classes, scores, count)) output indices."""
    import numpy as np

    sizes = [int(np.prod(s)) for s in shapes]
    if len(shapes) == 2:
        candidates = [i for i in (0, 1) if len(shapes[i]) >= 2 and shapes[i][-1] == 4]
        named = [i for i in candidates if "box" in names[i].lower()]
        for box_i in named or candidates:
            score_i = 1 - box_i
            n = sizes[box_i] // 4
            if n and len(shapes[score_i]) >= 2 and (shapes[score_i][-2] == n or sizes[score_i] == n):
                return "ssd", (box_i, score_i)
    if len(shapes) == 4:
        counts = [i for i in range(4) if sizes[i] == 1]
        boxes = [i for i in range(4) if len(shapes[i]) == 3 and shapes[i][-1] == 4]
        if len(counts) == 1 and len(boxes) == 1:
            rest = [i for i in range(4) if i not in (boxes[0], counts[0])]
            # TFLite_Detection_PostProcess emits boxes, classes, scores, count in this order
            return "postprocessed", (boxes[0], rest[0], rest[1], counts[0])
    return None


def nms(boxes: np.ndarray, scores: np.ndarray, classes: np.ndarray, iou_threshold: float,
        max_detections: int) -> list[int]:
    """Greedy per-class non-maximum suppression; indices of the kept boxes, best score first."""
    import numpy as np

    order = np.argsort(-scores, kind="stable")
    areas = np.maximum(boxes[:, 2] - boxes[:, 0], 0) * np.maximum(boxes[:, 3] - boxes[:, 1], 0)
    kept: list[int] = []
    while order.size and len(kept) < max_detections:
        best = int(order[0])
        kept.append(best)
        rest = order[1:]
        if not rest.size:
            break
        x1 = np.maximum(boxes[best, 0], boxes[rest, 0])
        y1 = np.maximum(boxes[best, 1], boxes[rest, 1])
        x2 = np.minimum(boxes[best, 2], boxes[rest, 2])
        y2 = np.minimum(boxes[best, 3], boxes[rest, 3])
        inter = np.maximum(x2 - x1, 0) * np.maximum(y2 - y1, 0)
        union = areas[best] + areas[rest] - inter
        iou = np.divide(inter, union, out=np.zeros_like(inter), where=union > 0)
        order = rest[(iou <= iou_threshold) | (classes[rest] != classes[best])]
    return kept


class PoseDecoder:
    """Single-person keypoints (MoveNet: 1x1x17x3 of y, x, score) mapped to source pixels."""

    def __init__(self, output: np.ndarray, spec: TensorSpec, input_size: tuple[int, int]) -> None:
        shape = tuple(output.shape)
        if len(shape) < 2 or shape[-1] != 3 or output.size // 3 != len(KEYPOINT_NAMES):
            raise ValueError(
                f"task 'pose' needs a single-pose output of {len(KEYPOINT_NAMES)} keypoints x (y, x, score) "
                f"(MoveNet 1x1x17x3); this model outputs {list(shape)}"
            )
        self._rows = output.reshape(-1, 3)
        self.spec = spec
        self.input_width, self.input_height = input_size

    def __call__(self, transform) -> Pose:
        rows = self.spec.dequantize(self._rows) if self.spec.quantized else self._rows
        keypoints = []
        total = 0.0
        for name, (y, x, score) in zip(KEYPOINT_NAMES, rows.tolist()):
            sx, sy = transform.to_source(x * self.input_width, y * self.input_height)
            keypoints.append(Keypoint(name, sx, sy, score))
            total += score
        return Pose(tuple(keypoints), total / len(keypoints))


class SegmentationDecoder:
    """A class map (argmax int map 1xHxW, or scores 1xHxWxC) warped back to the source frame."""

    def __init__(self, output: np.ndarray, spec: TensorSpec, labels: Labels | None = None) -> None:
        import numpy as np

        shape = tuple(output.shape)
        if len(shape) == 3 or (len(shape) == 4 and shape[-1] == 1):
            self._argmax = False
            height, width = shape[1], shape[2]
        elif len(shape) == 4 and shape[-1] > 1:
            self._argmax = True
            height, width = shape[1], shape[2]
        else:
            raise ValueError(
                f"task 'segment' needs a 1xHxW class map or 1xHxWxC scores; this model outputs {list(shape)}"
            )
        self._output = output.reshape(height, width, -1) if self._argmax else output.reshape(height, width)
        self.labels = labels
        self._map = np.empty((height, width), np.uint8)

    def __call__(self, transform) -> Segmentation:
        import cv2
        import numpy as np

        if self._argmax:
            np.copyto(self._map, self._output.argmax(axis=-1), casting="unsafe")
        else:
            np.copyto(self._map, self._output, casting="unsafe")
        sx, sy = transform.scale_x, transform.scale_y
        # source pixel centre (u + .5) lands on model pixel centre (m + .5) = (u + .5) * s + pad
        matrix = np.array([[sx, 0.0, transform.pad_x + 0.5 * sx - 0.5],
                           [0.0, sy, transform.pad_y + 0.5 * sy - 0.5]], np.float64)
        mask = cv2.warpAffine(self._map, matrix, (transform.source_width, transform.source_height),
                              flags=cv2.INTER_NEAREST | cv2.WARP_INVERSE_MAP, borderMode=cv2.BORDER_CONSTANT,
                              borderValue=0)
        counts = np.bincount(mask.reshape(-1), minlength=1)
        present = np.flatnonzero(counts)
        total = float(mask.size) or 1.0
        return Segmentation(mask, tuple(int(c) for c in present), tuple(_label(self.labels, int(c)) for c in present),
                            tuple(float(counts[c]) / total for c in present))
