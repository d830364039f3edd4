"""MoveNet single-pose: 1x1x17x3 of (y, x, score), normalised — one person, as a list of one."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..postprocess import KEYPOINT_NAMES, Detection, Detections, Keypoint
from .base import DecoderInput, Layout, LayoutMismatch

if TYPE_CHECKING:
    from ..preprocess import Transform


class MoveNetDecoder:
    """One person: its 17 keypoints in source pixels; the box holds them, the score is their mean."""

    def __init__(self, source: DecoderInput) -> None:
        output = source.outputs[0]
        shape = tuple(output.shape)
        if len(source.outputs) != 1 or len(shape) < 2 or shape[-1] != 3 or output.size // 3 != len(KEYPOINT_NAMES):
            raise LayoutMismatch(f"needs one output of {len(KEYPOINT_NAMES)} keypoints x (y, x, score) "
                                 f"(MoveNet 1x1x17x3)")
        self._rows = output.reshape(-1, 3)
        self.spec = source.specs[0]
        self.input_width, self.input_height = source.input_size
        self._label = source.label(0) if source.labels else "person"

    def __call__(self, transform: Transform) -> Detections:
        import math

        rows = self.spec.dequantize(self._rows) if self.spec.quantized else self._rows
        keypoints = []
        for name, (y, x, score) in zip(KEYPOINT_NAMES, rows.tolist()):
            if not (math.isfinite(x) and math.isfinite(y) and math.isfinite(score)):
                return Detections()  # a broken output is no person
            sx, sy = transform.to_source(x * self.input_width, y * self.input_height)
            keypoints.append(Keypoint(name, sx, sy, score))
        xs, ys = [k.x for k in keypoints], [k.y for k in keypoints]
        score = sum(k.score for k in keypoints) / len(keypoints)
        return Detections((Detection((min(xs), min(ys), max(xs), max(ys)), score, 0, self._label, None,
                                     tuple(keypoints)),))


MOVENET = Layout("movenet", "pose", "MoveNet single-pose 1x1x17x3 (y, x, score): a list of one person",
                 MoveNetDecoder, thresholded=False)
