"""MediaPipe's raw SSD anchors (``ssd-anchors``): BlazeFace short and full range, and the palm and pose
detectors built the same way.

The model gives, per anchor, ``regressors`` ``[1, N, 4 + 2K]`` (centre x, centre y, width, height, then K
keypoints' x, y, all in input pixels relative to the anchor) and ``classificators`` ``[1, N, 1]`` (a logit).
The anchors are not in the file: MediaPipe's ``SsdAnchorsCalculator`` makes them from the input size and
its options. :mod:`.anchor_schemes` generates them the same way — from the options a model's metadata states
under ``anchors:``, else from the one MediaPipe-shaped scheme whose anchor count is N for the model's input
(the layout fits only then: Ultraface's 4420 boxes of 4 values and 2 scores is no such model, and stays
``ssd``'s).

Decoding is MediaPipe's ``TensorsToDetectionsCalculator`` with ``x_scale = y_scale = w_scale = h_scale`` =
the model's input size (what each of its detector graphs sets, 128 to 256: the scale is the input, not a
number per model): centre = anchor centre + offset, size as given. Scores are the
sigmoid of the logit clipped to +-100, thresholded (``score_threshold``), then MediaPipe's *weighted*
non-maximum suppression: each box, best first, takes every remaining box whose IoU with it exceeds the
threshold (MediaPipe's 0.3 while ``iou_threshold`` is left at its default) and becomes their score-weighted
average, corners and keypoints alike, keeping the best score. Keypoints carry score 1.0 (the model gives
none); six of them are BlazeFace's (:data:`~..postprocess.FACE_KEYPOINT_NAMES`).

Preprocessing: RGB in [-1, 1], letterboxed (MediaPipe keeps the aspect ratio). MediaPipe pads with black
(-1), the preprocessor a float input with its mean (0.0, mid grey): that changes MediaPipe's own results
by under a pixel and 0.002. What moves them is the sampling: MediaPipe warps corner-aligned at the exact
scale, the preprocessor resizes centre-aligned (OpenCV) to whole pixels, and BlazeFace, reading a 4-5x
downscale with no anti-aliasing, answers a different sampling phase with boxes a few pixels and scores a
few hundredths apart (tests/pipeline/test_decoders_anchors.py measures both: fed MediaPipe's own input,
this decoder gives MediaPipe's detections to 0.3 pixel and 0.0012). tests/pipeline/test_mediapipe_detectors.py
holds every MediaPipe detector (face short, full and back-camera range, palm full and lite, pose) to MediaPipe's
own graphs: fed the numbers MediaPipe feeds, to 0.0002 pixel and 5e-6 in score.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from ...errors import AnchorOptionsError
from ..postprocess import FACE_KEYPOINT_NAMES
from .anchor_schemes import OPTIONS_KEY, AnchorScheme, derive_scheme, scheme_from_options
from .base import (
    DEFAULT_IOU_THRESHOLD,
    DecoderInput,
    Layout,
    LayoutMismatch,
    Preprocessing,
    box_iou,
    detections,
    finite_rows,
    to_source_boxes,
    to_source_points,
)

if TYPE_CHECKING:
    import numpy as np

    from ..postprocess import Detections
    from ..preprocess import Transform

#: MediaPipe's weighted NMS threshold (``min_suppression_threshold``) in its detection graphs
MEDIAPIPE_IOU = 0.3
#: MediaPipe's ``score_clipping_thresh``
SCORE_CLIP = 100.0
#: its detectors take RGB in [-1, 1], the aspect ratio kept
MEDIAPIPE = Preprocessing(resize="letterbox", mean=127.5, std=127.5)


def scheme_of(source: DecoderInput, count: int) -> AnchorScheme:
    """The anchor scheme of ``source``'s model: the one its metadata states (``anchors:``; a wrong option is an
    AnchorOptionsError naming it), else the MediaPipe scheme that gives ``count`` anchors for its input."""
    width, height = source.input_size
    stated = source.metadata.anchors
    if stated is None:
        return derive_scheme(width, height, count)
    scheme = scheme_from_options(stated)
    made = scheme.count(width, height)
    if made != count:
        raise AnchorOptionsError(f"{OPTIONS_KEY}.strides in the model's metadata ({scheme.describe()}) makes {made} "
                                 f"anchors for its {width}x{height} input; the model has {count}",
                                 f"{OPTIONS_KEY}.strides")
    return scheme


def _split(source: DecoderInput) -> tuple[int, int, int]:
    """(regressors index, classificators index, keypoints K), or LayoutMismatch."""
    import numpy as np

    shapes = source.shapes()
    if len(shapes) != 2:
        raise LayoutMismatch(f"needs 2 outputs (regressors 1xNx(4+2K), classificators 1xNx1), not {len(shapes)}")
    sizes = [int(np.prod(s)) for s in shapes]
    for reg in (0, 1):
        score = 1 - reg
        n = sizes[score]
        if n and sizes[reg] % n == 0 and shapes[reg][-1] == sizes[reg] // n and shapes[score][-1] in (1, n):
            values = sizes[reg] // n
            if values >= 4 and values % 2 == 0:
                return reg, score, (values - 4) // 2
    raise LayoutMismatch("no regressors 1xNx(4+2K) beside one score per anchor (classificators 1xNx1)")


class AnchorDecoder:
    """Regressors + classificators over MediaPipe's anchors -> weighted-NMS'd boxes with keypoints."""

    def __init__(self, source: DecoderInput) -> None:
        import numpy as np

        reg, score, keypoints = _split(source)
        n = source.outputs[score].size
        self.scheme = scheme_of(source, n)
        self.source = source
        self.keypoints = keypoints
        self._centres = self.scheme.centres(*source.input_size)
        self._regressors = source.outputs[reg].reshape(n, -1)
        self._logits = source.outputs[score].reshape(n)
        self._specs = source.specs[reg], source.specs[score]
        self._mask = np.empty(n, bool)
        self._names = FACE_KEYPOINT_NAMES if keypoints == len(FACE_KEYPOINT_NAMES) else ()

    def _threshold_logit(self) -> float:
        """The logit whose sigmoid is the score threshold (comparing logits spares a sigmoid per anchor)."""
        t = self.source.settings.score_threshold
        if t <= 0.0:
            return -math.inf
        if t >= 1.0:
            return math.inf
        return math.log(t / (1.0 - t))

    def __call__(self, transform: Transform) -> Detections:
        import numpy as np

        reg_spec, score_spec = self._specs
        logits = score_spec.dequantize(self._logits) if score_spec.quantized else self._logits
        np.greater(logits, self._threshold_logit(), out=self._mask)  # NaN compares False: never kept
        keep = np.flatnonzero(self._mask)
        raw = reg_spec.dequantize(self._regressors[keep]).astype(np.float32, copy=True)
        finite = finite_rows(raw) & (raw[:, 2] >= 0) & (raw[:, 3] >= 0)  # a negative size is no box
        keep, raw = keep[finite], raw[finite]
        clipped = np.clip(logits[keep].astype(np.float64), -SCORE_CLIP, SCORE_CLIP)
        scores = (1.0 / (1.0 + np.exp(-clipped))).astype(np.float32)
        centres = self._centres[keep]
        boxes = np.empty((keep.size, 4), np.float32)
        boxes[:, :2] = centres + raw[:, :2] - raw[:, 2:4] / 2
        boxes[:, 2:] = centres + raw[:, :2] + raw[:, 2:4] / 2
        points = raw[:, 4:].reshape(keep.size, self.keypoints, 2) + centres[:, None, :]
        settings = self.source.settings
        iou = MEDIAPIPE_IOU if settings.iou_threshold == DEFAULT_IOU_THRESHOLD else settings.iou_threshold
        boxes, points, scores = weighted_nms(boxes, points, scores, iou, settings.max_detections)
        to_source_boxes(boxes, transform)
        located = np.ones((points.shape[0], self.keypoints, 3), np.float32)
        located[..., :2] = to_source_points(points, transform)
        return detections(boxes, scores, np.zeros(scores.size, np.int64), range(scores.size), self.source,
                          keypoints=located if self.keypoints else None, keypoint_names=self._names)


def weighted_nms(boxes: np.ndarray, points: np.ndarray, scores: np.ndarray, iou_threshold: float,
                 max_detections: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """MediaPipe's WEIGHTED suppression: best first, each box and the remaining ones overlapping it by more
    than ``iou_threshold`` become one — their score-weighted mean box and keypoints, with the best score."""
    import numpy as np

    order = np.argsort(-scores, kind="stable")
    areas = np.maximum(boxes[:, 2] - boxes[:, 0], 0) * np.maximum(boxes[:, 3] - boxes[:, 1], 0)
    kept_boxes, kept_points, kept_scores = [], [], []
    while order.size and len(kept_scores) < max_detections:
        best = order[0]
        group = box_iou(boxes[best], boxes[order], areas[best], areas[order]) > iou_threshold
        group[0] = True  # a box is its own group even when it has no area (MediaPipe's loop would stop)
        members, order = order[group], order[~group]
        weights = scores[members].astype(np.float64)
        total = weights.sum()
        if not total > 0:  # scores that underflowed to 0: the best box as it is
            members, weights, total = members[:1], np.ones(1), 1.0
        kept_boxes.append((boxes[members] * weights[:, None]).sum(axis=0) / total)
        kept_points.append((points[members] * weights[:, None, None]).sum(axis=0) / total)
        kept_scores.append(scores[best])
    if not kept_scores:
        return np.empty((0, 4), np.float32), np.empty((0, *points.shape[1:]), np.float32), np.empty(0, np.float32)
    return (np.array(kept_boxes, np.float32), np.array(kept_points, np.float32),
            np.array(kept_scores, np.float32))


SSD_ANCHORS = Layout("ssd-anchors", "detect",
                     "MediaPipe raw SSD anchors: regressors 1xNx(4+2K) + classificators 1xNx1 (BlazeFace, palm)",
                     AnchorDecoder, MEDIAPIPE)
