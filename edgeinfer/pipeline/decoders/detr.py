"""DETR-style detectors: a fixed set of queries, one box each, no NMS (the model's own matching did that).

* ``detr``: boxes ``[1, Q, 4]`` (cx, cy, w, h normalised to the input) and class logits ``[1, Q, C]`` —
  RT-DETR, Deformable/Conditional DETR, Hugging Face exports (``logits``, ``pred_boxes``), facebook DETR; or
  Ultralytics RT-DETR's single ``[1, Q, 4+nc]`` (the same boxes, then class scores already through a
  sigmoid) when its metadata says Ultralytics made it and Q is no YOLO grid.
* ``rf-detr``: the same two outputs under RF-DETR's names, ``dets`` and ``labels``: ImageNet normalisation.
* ``dfine``: the deploy exports of D-FINE and RT-DETR(v2) with their post-processor — ``labels [1, Q]``,
  ``boxes [1, Q, 4]`` (x1, y1, x2, y2), ``scores [1, Q]`` — and a second input ``orig_target_sizes`` ``[1, 2]``
  that scales the boxes: the pipeline fills it once per plan with the image input's (width, height), so the
  boxes come out in input pixels and the frame's transform maps them to the source.

**Sigmoid or softmax.** Most DETRs since Deformable DETR score each class with a sigmoid (focal loss);
facebook's DETR ends its C columns with a "no object" class and takes a softmax. The model does not say
which, so the class count does: with names (the model's metadata, else the labels given) C = names + 1 is
the softmax head, anything else sigmoid; without names C = 92 (COCO's 91 ids + no object, DETR's COCO head)
is softmax, anything else sigmoid. A sigmoid head gives every (query, class) pair above the threshold, best
first (RT-DETR's and RF-DETR's top-k); a softmax head each query's best real class. ``rf-detr`` is sigmoid.

**Telling it from SSD.** ``ssd`` reads scores ``[1, N, C]`` + boxes ``[1, N, 4]`` too, and is tried after
these layouts: the two-output DETR form fits when an output's name says DETR (``logits``, ``pred_boxes``,
``dets``, ``labels``) or, with other names, when Q is a query count (at most :data:`MAX_QUERIES`; SSD's
anchors run to thousands: Ultraface's 4420 stays ``ssd``).

**Preprocessing.** Stretched to the input (RT-DETR, D-FINE and RF-DETR resize without keeping the aspect
ratio), RGB in [0, 1] (mean 0, std 255) — RT-DETR's and D-FINE's ``ToTensor`` with no normalisation;
``rf-detr`` normalises with ImageNet's mean and std. facebook DETR wants ImageNet's too: give ``mean`` and
``std`` (or use ``rf-detr``'s by naming it). Ultralytics RT-DETR follows its metadata (the model's own
statement comes first). Rows with NaN or inf are never a box; a class id past the names keeps its number.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .base import (
    DecoderInput,
    Layout,
    LayoutMismatch,
    Preprocessing,
    centre_to_corners,
    detections,
    finite_rows,
    sigmoid,
    to_source_boxes,
)
from .yolo import NORMALISED_MAX, grid_sizes

if TYPE_CHECKING:
    import numpy as np

    from ..postprocess import Detections
    from ..preprocess import Transform

#: more queries than this and a scores + boxes pair is SSD's anchors, not DETR's queries (DINO has 900)
MAX_QUERIES = 1000
#: facebook DETR's COCO head: 91 category ids (0 unused) + no object
DETR_COCO_CLASSES = 92
#: RT-DETR, D-FINE: the resized frame as [0, 1]
UNIT_RANGE = Preprocessing(resize="stretch", mean=0.0, std=255.0)
#: RF-DETR (and facebook DETR): ImageNet's mean and std over [0, 255] pixels
IMAGENET = Preprocessing(resize="stretch", mean=(123.675, 116.28, 103.53), std=(58.395, 57.12, 57.375))
#: output names that say DETR (boxes, then class scores)
_DETR_BOX_NAMES = ("pred_boxes", "dets")
_DETR_SCORE_NAMES = ("logits", "labels")


def _class_count(source: DecoderInput) -> int | None:
    """The classes the model names (its metadata, else the labels given); None when nothing names them."""
    if source.metadata.names:
        return max(source.metadata.names) + 1
    return len(source.labels) if source.labels else None


def _squeeze(output: np.ndarray) -> tuple[int, ...]:
    shape = tuple(output.shape)
    while len(shape) > 1 and shape[0] == 1:
        shape = shape[1:]
    return shape


class DetrDecoder:
    """Boxes (cx, cy, w, h normalised) + per-class logits or scores -> detections, no NMS."""

    def __init__(self, source: DecoderInput, *, rf: bool = False) -> None:
        self.source = source
        if len(source.outputs) == 1 and not rf:
            self._single(source)
        elif len(source.outputs) == 2:
            self._pair(source, rf=rf)
        else:
            raise LayoutMismatch(f"needs boxes [1, Q, 4] + logits [1, Q, C] (or Ultralytics' [1, Q, 4+nc]), "
                                 f"not {len(source.outputs)} outputs")

    def _pair(self, source: DecoderInput, *, rf: bool) -> None:
        names = [spec.name.lower() for spec in source.specs]
        shapes = [_squeeze(o) for o in source.outputs]
        pairs = [(b, 1 - b) for b in (0, 1) if len(shapes[b]) == 2 and shapes[b][1] == 4
                 and len(shapes[1 - b]) == 2 and shapes[1 - b][0] == shapes[b][0]]
        if not pairs:
            raise LayoutMismatch("no boxes [1, Q, 4] beside logits [1, Q, C] with the same Q")
        named = [p for p in pairs if names[p[0]] in _DETR_BOX_NAMES or names[p[1]] in _DETR_SCORE_NAMES]
        box_i, score_i = (named or pairs)[0]
        queries, columns = shapes[score_i]
        if rf and (names[box_i], names[score_i]) != ("dets", "labels"):
            raise LayoutMismatch(f"RF-DETR names its outputs dets and labels, not {names[box_i]} and {names[score_i]}")
        if not named and queries > MAX_QUERIES:
            raise LayoutMismatch(f"{queries} rows is an SSD's anchors, not DETR queries (at most {MAX_QUERIES})")
        count = _class_count(source)
        self.softmax = not rf and (columns == count + 1 if count is not None else columns == DETR_COCO_CLASSES)
        if self.softmax and columns < 2:
            raise LayoutMismatch("a softmax head needs a class beside its no-object column")
        self.activation = "softmax" if self.softmax else "sigmoid"
        self._boxes = source.outputs[box_i].reshape(queries, 4)
        self._scores = source.outputs[score_i].reshape(queries, columns)
        self._specs = source.specs[box_i], source.specs[score_i]

    def _single(self, source: DecoderInput) -> None:
        """Ultralytics RT-DETR: [1, Q, 4+nc], the scores already probabilities."""
        shape = _squeeze(source.outputs[0])
        count = _class_count(source)
        if source.metadata.producer != "ultralytics" or len(shape) != 2:
            raise LayoutMismatch("one output is Ultralytics RT-DETR's [1, Q, 4+nc] only when its metadata says "
                                 "Ultralytics made it")
        queries, columns = shape
        width, height = source.input_size
        if queries in grid_sizes(width, height) or queries in {3 * g for g in grid_sizes(width, height)}:
            raise LayoutMismatch(f"{queries} rows is a YOLO grid of a {width}x{height} input, not DETR queries")
        if count is None or columns != 4 + count:
            raise LayoutMismatch(f"{columns} values a query is not 4 box values + {count or 'the named'} classes")
        self.softmax, self.activation = False, "none"
        table = source.outputs[0].reshape(queries, columns)
        self._boxes, self._scores = table[:, :4], table[:, 4:]
        self._specs = source.specs[0], source.specs[0]

    def _probabilities(self) -> np.ndarray:
        import numpy as np

        spec = self._specs[1]
        raw = spec.dequantize(self._scores) if spec.quantized else self._scores
        if self.activation == "sigmoid":
            return sigmoid(raw)
        if self.activation == "none":
            return np.asarray(raw, np.float32)
        shifted = raw - raw.max(axis=1, keepdims=True)  # NaN rows stay NaN: never kept
        exp = np.exp(shifted.astype(np.float32))
        return exp / exp.sum(axis=1, keepdims=True)

    def __call__(self, transform: Transform) -> Detections:
        import numpy as np

        settings = self.source.settings
        probabilities = self._probabilities()
        if self.softmax:  # each query's best real class; the last column is "no object"
            real = probabilities[:, :-1]
            queries, classes = np.arange(real.shape[0]), real.argmax(axis=1)
            scores = real[queries, classes]
        else:  # every (query, class) pair: a query may hold two classes
            queries, classes = np.nonzero(probabilities > settings.score_threshold)
            scores = probabilities[queries, classes]
        chosen = np.flatnonzero(scores > settings.score_threshold)  # NaN compares False: never kept
        chosen = chosen[np.argsort(-scores[chosen], kind="stable")]
        queries, classes, scores = queries[chosen], classes[chosen], scores[chosen]
        rows = self._specs[0].dequantize(self._boxes[queries]).astype(np.float32)
        finite = finite_rows(rows) & (rows[:, 2] >= 0) & (rows[:, 3] >= 0)
        rows, classes, scores = rows[finite], classes[finite], scores[finite].astype(np.float32)
        rows, classes, scores = (a[:settings.max_detections] for a in (rows, classes, scores))
        rows *= np.array(self.source.input_size * 2, np.float32)
        boxes = to_source_boxes(centre_to_corners(rows), transform)
        return detections(boxes, scores, classes, range(scores.size), self.source)


class DfineDecoder:
    """``labels [1, Q]``, ``boxes [1, Q, 4]`` (x1, y1, x2, y2 in the size input's pixels), ``scores [1, Q]``."""

    def __init__(self, source: DecoderInput) -> None:
        import numpy as np

        shapes = [_squeeze(o) for o in source.outputs]
        if len(shapes) != 3:
            raise LayoutMismatch(f"needs 3 outputs (labels [1, Q], boxes [1, Q, 4], scores [1, Q]), not {len(shapes)}")
        boxes = [i for i, s in enumerate(shapes) if len(s) == 2 and s[1] == 4]
        if len(boxes) != 1:
            raise LayoutMismatch("no single boxes output [1, Q, 4]")
        queries = shapes[boxes[0]][0]
        rest = [i for i in range(3) if i != boxes[0]]
        if any(int(np.prod(shapes[i])) != queries for i in rest):
            raise LayoutMismatch(f"labels and scores must hold one value a query ({queries}), like the boxes")
        self.source = source
        labels_i, scores_i = self._labels_and_scores(source, rest)
        self._labels = source.outputs[labels_i].reshape(queries)
        self._boxes = source.outputs[boxes[0]].reshape(queries, 4)
        self._scores = source.outputs[scores_i].reshape(queries)
        self._specs = source.specs[boxes[0]], source.specs[scores_i]
        #: the input the pipeline fills with the image input's (width, height): boxes in input pixels
        self.size_inputs = self._size_input(source)

    @staticmethod
    def _labels_and_scores(source: DecoderInput, rest: list[int]) -> tuple[int, int]:
        """Which of the two per-query outputs is the labels: the integer one, else by name, else D-FINE's order
        (labels, boxes, scores)."""
        integer = [i for i in rest if source.outputs[i].dtype.kind in "iu"]
        if len(integer) == 1:
            return integer[0], next(i for i in rest if i != integer[0])
        named = [i for i in rest if "label" in source.specs[i].name.lower() or "class" in source.specs[i].name.lower()]
        first = named[0] if len(named) == 1 else rest[0]
        return first, next(i for i in rest if i != first)

    @staticmethod
    def _size_input(source: DecoderInput) -> tuple[int, ...]:
        sizes = [i for i, spec in enumerate(source.inputs) if i and tuple(spec.shape) in ((1, 2), (2,))]
        if len(source.inputs) > 1 + len(sizes) or len(sizes) > 1:
            extra = ", ".join(f"{s.name} {list(s.shape)}" for s in source.inputs[1:])
            raise LayoutMismatch(f"its inputs past the image ({extra}) are not one [1, 2] size (orig_target_sizes)")
        return tuple(sizes)

    def __call__(self, transform: Transform) -> Detections:
        import numpy as np

        settings = self.source.settings
        box_spec, score_spec = self._specs
        scores = score_spec.dequantize(self._scores) if score_spec.quantized else self._scores
        labels = np.asarray(self._labels, np.float64)
        keep = np.flatnonzero((scores > settings.score_threshold) & np.isfinite(labels) & (labels >= 0)
                              & (labels == np.floor(labels)))
        keep = keep[np.argsort(-scores[keep], kind="stable")]
        boxes = box_spec.dequantize(self._boxes[keep]).astype(np.float32)
        finite = finite_rows(boxes)
        keep, boxes = keep[finite][:settings.max_detections], boxes[finite][:settings.max_detections]
        if not self.size_inputs and boxes.size and float(np.abs(boxes).max()) <= NORMALISED_MAX:
            boxes *= np.array(self.source.input_size * 2, np.float32)  # no size input: normalised boxes
        boxes = to_source_boxes(boxes, transform)
        return detections(boxes, scores[keep].astype(np.float32), labels[keep].astype(np.int64),
                          range(keep.size), self.source)


DETR = Layout("detr", "detect", "DETR queries: boxes [1, Q, 4] cx, cy, w, h normalised + logits [1, Q, C] "
              "(RT-DETR, DETR; Ultralytics RT-DETR's [1, Q, 4+nc]), no NMS", DetrDecoder, UNIT_RANGE)
RF_DETR = Layout("rf-detr", "detect", "RF-DETR: dets [1, Q, 4] + labels [1, Q, C] logits, ImageNet-normalised input",
                 lambda source: DetrDecoder(source, rf=True), IMAGENET)
DFINE = Layout("dfine", "detect", "D-FINE / RT-DETRv2 deploy: labels, boxes (x1, y1, x2, y2), scores + an "
               "orig_target_sizes input", DfineDecoder, UNIT_RANGE)
