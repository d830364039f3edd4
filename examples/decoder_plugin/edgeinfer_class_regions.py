"""``class-regions``: a semantic segmentation model (DeepLab's class map) read as instances — one detection per
connected region of a class, with its box and its mask — so a segmentation model can be tracked, counted across
lines and zones, fire ``detection`` events and keep samples, as a detector's boxes can.

An edgeinfer decoder plug-in: a :class:`~edgeinfer.pipeline.decoders.Layout` registered under the
``edgeinfer.decoders`` entry point (pyproject.toml). ``build`` gets the engine's outputs (:class:`DecoderInput`)
once and returns a callable that decodes one frame given the frame's transform (model pixels -> source pixels), or
raises :class:`~edgeinfer.errors.LayoutMismatch` saying why the outputs do not fit.

The class map is either an integer map ``1xHxW`` (DeepLab's ArgMax export: every region scores 1, the map states no
confidence) or per-class scores ``1xHxWxC`` (a region scores its pixels' mean softmax probability of its class).
Class 0 is the background. A region smaller than ``MIN_AREA`` of the frame is noise and dropped.
"""

from __future__ import annotations

import cv2
import numpy as np

from edgeinfer.errors import LayoutMismatch
from edgeinfer.pipeline.decoders import DecoderInput, Layout
from edgeinfer.pipeline.postprocess import Detection, Detections, InstanceMask

#: the smallest region kept, as a share of the frame's pixels
MIN_AREA = 0.002
BACKGROUND = 0


class ClassRegions:
    """Bound to one engine's class-map output; called once per frame."""

    def __init__(self, source: DecoderInput) -> None:
        if len(source.outputs) != 1:
            raise LayoutMismatch(f"a class map is one output, not {len(source.outputs)}")
        output = source.outputs[0]
        shape = tuple(output.shape)
        if len(shape) == 3 and np.issubdtype(output.dtype, np.integer):
            self._scores = False
        elif len(shape) == 4 and 1 < shape[-1] < min(shape[1], shape[2]):
            self._scores = True
        else:
            raise LayoutMismatch(f"needs a 1xHxW integer class map or 1xHxWxC class scores, not {list(shape)} "
                                 f"{output.dtype}")
        self._output, self._source = output, source

    def __call__(self, transform) -> Detections:
        classes, confidence = self._class_map()
        # model pixels -> source pixels: the inverse of the preprocessing's scale and padding
        sx, sy = transform.scale_x, transform.scale_y
        matrix = np.array([[sx, 0.0, transform.pad_x + 0.5 * sx - 0.5],
                           [0.0, sy, transform.pad_y + 0.5 * sy - 0.5]], np.float64)
        size = (transform.source_width, transform.source_height)
        inverse = cv2.INTER_NEAREST | cv2.WARP_INVERSE_MAP
        classes = cv2.warpAffine(classes, matrix, size, flags=inverse, borderValue=BACKGROUND)
        if confidence is not None:
            confidence = cv2.warpAffine(confidence, matrix, size, flags=inverse, borderValue=0.0)
        return Detections(tuple(self._regions(classes, confidence)))

    def _class_map(self) -> tuple[np.ndarray, np.ndarray | None]:
        output = self._output[0]
        if not self._scores:
            return output.astype(np.uint8), None
        logits = output.astype(np.float32)
        probabilities = np.exp(logits - logits.max(axis=-1, keepdims=True))
        probabilities /= probabilities.sum(axis=-1, keepdims=True)
        return probabilities.argmax(axis=-1).astype(np.uint8), probabilities.max(axis=-1)

    def _regions(self, classes: np.ndarray, confidence: np.ndarray | None) -> list[Detection]:
        settings, smallest = self._source.settings, MIN_AREA * classes.size
        found = []
        for class_id in np.unique(classes):
            if class_id == BACKGROUND:
                continue
            count, labels, stats, _ = cv2.connectedComponentsWithStats((classes == class_id).astype(np.uint8))
            for region in range(1, count):
                x, y, w, h, area = (int(v) for v in stats[region])
                if area < smallest:
                    continue
                pixels = labels[y:y + h, x:x + w] == region
                score = float(confidence[y:y + h, x:x + w][pixels].mean()) if confidence is not None else 1.0
                if confidence is not None and score <= settings.score_threshold:
                    continue
                found.append(Detection((float(x), float(y), float(x + w), float(y + h)), score, int(class_id),
                                       self._source.label(int(class_id)), mask=InstanceMask(x, y, pixels)))
        found.sort(key=lambda d: (-d.score, -d.mask.area))
        return found[:settings.max_detections]


CLASS_REGIONS = Layout(
    "class-regions", "segment",
    "a class map 1xHxW or class scores 1xHxWxC (DeepLab) as one detection (box and mask) per connected region",
    ClassRegions, also=("detect",))
