"""Semantic segmentation: a class per pixel (DeepLab's argmax map, or per-class scores)."""

from __future__ import annotations

from ..postprocess import Segmentation
from .base import DecoderInput, Layout, LayoutMismatch


class SegmentationDecoder:
    """A class map (argmax int map 1xHxW, or scores 1xHxWxC) warped back to the source frame."""

    def __init__(self, source: DecoderInput) -> None:
        import numpy as np

        if len(source.outputs) != 1:
            raise LayoutMismatch(f"a class map is one output, not {len(source.outputs)}")
        output, labels = source.outputs[0], source.labels
        shape = tuple(output.shape)
        integral = np.issubdtype(output.dtype, np.integer)
        if (len(shape) == 3 or (len(shape) == 4 and shape[-1] == 1)) and integral:
            self._argmax = False
            height, width = shape[1], shape[2]
        elif len(shape) == 4 and 1 < shape[-1] < min(shape[1], shape[2]):  # class scores a pixel, channels last
            self._argmax = True
            height, width = shape[1], shape[2]
        else:
            raise LayoutMismatch(f"needs a 1xHxW integer class map or 1xHxWxC scores, not {list(shape)} {output.dtype}")
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
        names = tuple(self.labels[int(c)] if self.labels else str(int(c)) for c in present)
        return Segmentation(mask, tuple(int(c) for c in present), names,
                            tuple(float(counts[c]) / total for c in present))


SEMANTIC = Layout("semantic", "segment", "a class map 1xHxW or scores 1xHxWxC (DeepLab): a class per pixel",
                  SegmentationDecoder)
