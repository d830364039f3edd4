"""What every output layout shares: what a decoder is built from, the layout record, box helpers.

A *layout* is one way a model's outputs can be arranged (YOLO's ``[1, 4+nc, N]``, TFLite's detection
post-process, MediaPipe's raw anchors …). Each is a :class:`Layout`: a name (``--decoder`` takes it), the
task its results serve, the preprocessing its family expects, and ``build``, which returns a decoder bound to
the engine's output views or raises :class:`LayoutMismatch` saying why the outputs do not fit.

A decoder is built once per (engine, layout) and called per frame with the frame's
:class:`~..preprocess.Transform`; it preallocates what it can, and what it allocates per frame is the
result itself (and, for the layouts that select candidates, arrays the size of the candidates kept).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ...errors import LayoutMismatch  # noqa: F401  (re-exported: every layout module raises it)

if TYPE_CHECKING:
    import numpy as np

    from ...runtime.metadata import ModelMetadata
    from ...runtime.model import TensorSpec
    from ..labels import Labels
    from ..preprocess import Transform

DEFAULT_SCORE_THRESHOLD = 0.5
DEFAULT_IOU_THRESHOLD = 0.45
DEFAULT_MAX_DETECTIONS = 100


@dataclass(frozen=True)
class DecoderSettings:
    """The task options a decoder reads (top-k, detection thresholds)."""

    top_k: int = 5
    score_threshold: float = DEFAULT_SCORE_THRESHOLD
    iou_threshold: float = DEFAULT_IOU_THRESHOLD
    max_detections: int = DEFAULT_MAX_DETECTIONS


@dataclass(frozen=True)
class Preprocessing:
    """How a layout's family feeds its models, as its exporter's own code does (None: the task's default, the input
    type's default, RGB, a centred border of grey 114)."""

    resize: str | None = None
    mean: float | tuple[float, ...] | None = None
    std: float | tuple[float, ...] | None = None
    #: ``rgb`` or ``bgr`` (runtime.metadata.CHANNEL_ORDERS)
    channels: str | None = None
    #: where a letterbox's border goes: ``centre`` or ``corner`` (runtime.metadata.PAD_PLACES)
    pad: str | None = None
    #: the border's pixel value, 0-255
    pad_value: int | None = None


@dataclass(frozen=True, eq=False)
class DecoderInput:
    """What a decoder is built from: the engine row's output views and specs, the model input's size, the
    labels, the task options and what the model says about itself."""

    outputs: list[np.ndarray]
    specs: tuple[TensorSpec, ...]
    #: the model input's (width, height)
    input_size: tuple[int, int]
    labels: Labels | None
    settings: DecoderSettings
    metadata: ModelMetadata
    #: the engine's inputs (a layout may take a second one: D-FINE's original size)
    inputs: tuple[TensorSpec, ...] = ()

    def shapes(self) -> list[tuple[int, ...]]:
        return [tuple(o.shape) for o in self.outputs]

    def describe(self) -> str:
        """Each output as ``name [shape] dtype``, for errors."""
        return ", ".join(f"{s.name or '?'} {list(o.shape)} {o.dtype}" for s, o in zip(self.specs, self.outputs))

    def label(self, index: int) -> str:
        return self.labels[index] if self.labels else str(index)


@dataclass(frozen=True)
class Layout:
    """One arrangement of a model's outputs and how to decode it."""

    #: the ``--decoder`` word
    name: str
    #: the task whose results it produces (the first of ``tasks`` when it serves several)
    task: str
    summary: str
    #: the decoder bound to the outputs, or LayoutMismatch with the reason they do not fit
    build: Callable[[DecoderInput], Any]
    preprocessing: Preprocessing = field(default_factory=Preprocessing)
    #: tried when a model's layout is guessed from its outputs (False: only when named, or when the model's
    #: metadata says it is this kind of model)
    guessed: bool = True
    #: further tasks it serves (an end-to-end YOLO export: its metadata says which)
    also: tuple[str, ...] = ()
    #: its decoder drops what scores at or under ``score_threshold`` (MoveNet's one person is always kept)
    thresholded: bool = True

    @property
    def tasks(self) -> tuple[str, ...]:
        return (self.task, *self.also)


def to_source_boxes(boxes: np.ndarray, transform: Transform) -> np.ndarray:
    """(x1, y1, x2, y2) rows in model-input pixels -> source pixels, clipped to the frame, in place."""
    import numpy as np

    boxes[:, 0::2] -= transform.pad_x
    boxes[:, 0::2] /= transform.scale_x
    boxes[:, 1::2] -= transform.pad_y
    boxes[:, 1::2] /= transform.scale_y
    np.clip(boxes[:, 0::2], 0.0, transform.source_width, out=boxes[:, 0::2])
    np.clip(boxes[:, 1::2], 0.0, transform.source_height, out=boxes[:, 1::2])
    return boxes


def to_source_points(points: np.ndarray, transform: Transform) -> np.ndarray:
    """(..., 2) x, y in model-input pixels -> source pixels, clipped to the frame, in place."""
    import numpy as np

    points[..., 0] -= transform.pad_x
    points[..., 0] /= transform.scale_x
    points[..., 1] -= transform.pad_y
    points[..., 1] /= transform.scale_y
    np.clip(points[..., 0], 0.0, transform.source_width, out=points[..., 0])
    np.clip(points[..., 1], 0.0, transform.source_height, out=points[..., 1])
    return points


def centre_to_corners(rows: np.ndarray) -> np.ndarray:
    """(cx, cy, w, h) rows -> (x1, y1, x2, y2), a new float32 array."""
    import numpy as np

    out = np.empty(rows.shape, np.float32)
    half_w, half_h = rows[:, 2] / 2, rows[:, 3] / 2
    out[:, 0] = rows[:, 0] - half_w
    out[:, 1] = rows[:, 1] - half_h
    out[:, 2] = rows[:, 0] + half_w
    out[:, 3] = rows[:, 1] + half_h
    return out


def finite_rows(*arrays: np.ndarray) -> np.ndarray:
    """A mask of the rows whose values are all finite in every array (NaN or inf rows are never a box)."""
    import numpy as np

    mask = np.ones(arrays[0].shape[0], bool)
    if not mask.size:
        return mask
    for array in arrays:
        flat = array.reshape(array.shape[0], math.prod(array.shape[1:]))  # not -1: no rows is a shape too
        mask &= np.isfinite(flat).all(axis=1)
    return mask


def sigmoid(values: np.ndarray) -> np.ndarray:
    """1 / (1 + exp(-x)), overflow-safe, a new float32 array."""
    import numpy as np

    clipped = np.clip(np.asarray(values, np.float32), -80.0, 80.0)
    return 1.0 / (1.0 + np.exp(-clipped))


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
        iou = box_iou(boxes[best], boxes[rest], areas[best], areas[rest])
        order = rest[(iou <= iou_threshold) | (classes[rest] != classes[best])]
    return kept


def box_iou(box: np.ndarray, others: np.ndarray, area: float | None = None,
            areas: np.ndarray | None = None) -> np.ndarray:
    """IoU of one (x1, y1, x2, y2) box with each row of ``others``."""
    import numpy as np

    if area is None:
        area = max(float(box[2] - box[0]), 0.0) * max(float(box[3] - box[1]), 0.0)
    if areas is None:
        areas = np.maximum(others[:, 2] - others[:, 0], 0) * np.maximum(others[:, 3] - others[:, 1], 0)
    x1 = np.maximum(box[0], others[:, 0])
    y1 = np.maximum(box[1], others[:, 1])
    x2 = np.minimum(box[2], others[:, 2])
    y2 = np.minimum(box[3], others[:, 3])
    inter = np.maximum(x2 - x1, 0) * np.maximum(y2 - y1, 0)
    union = area + areas - inter
    return np.divide(inter, union, out=np.zeros_like(inter, dtype=np.float64), where=union > 0)


def detections(boxes: np.ndarray, scores: np.ndarray, classes: np.ndarray, chosen: Any, source: DecoderInput,
               *, keypoints: np.ndarray | None = None, keypoint_names: tuple[str, ...] = (),
               masks: list[Any] | None = None, rotated: np.ndarray | None = None) -> Any:
    """The chosen rows as :class:`~..postprocess.Detections`, best first: ``boxes`` in source pixels;
    ``keypoints`` (n, K, 3) x, y, score in source pixels; ``masks`` one InstanceMask per chosen row (in the
    order of ``chosen``); ``rotated`` (n, 5). A class id past the names keeps its number as the label."""
    from ..postprocess import Detection, Detections, Keypoint

    found = []
    for rank, i in enumerate(chosen):
        points: tuple = ()
        if keypoints is not None:
            names = keypoint_names or tuple(f"kp{k}" for k in range(keypoints.shape[1]))
            points = tuple(Keypoint(names[k] if k < len(names) else f"kp{k}", float(x), float(y), float(s))
                           for k, (x, y, s) in enumerate(keypoints[i].tolist()))
        class_id = int(classes[i])
        found.append(Detection(
            tuple(float(v) for v in boxes[i]), float(scores[i]), class_id, source.label(class_id), None, points,
            masks[rank] if masks is not None else None,
            tuple(float(v) for v in rotated[i]) if rotated is not None else None))  # type: ignore[arg-type]
    return Detections(tuple(found))
