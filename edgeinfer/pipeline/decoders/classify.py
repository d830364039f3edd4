"""A classifier's 1xN class scores: top-k classes."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..postprocess import Classification, as_probabilities, top_k
from .base import DecoderInput, Layout, LayoutMismatch

if TYPE_CHECKING:
    import numpy as np


class ClassificationDecoder:
    """Top-k classes of a classifier output, allocation-free apart from the result list."""

    def __init__(self, output: np.ndarray, spec, labels=None, k: int = 5) -> None:
        import numpy as np

        if k < 1:
            raise ValueError(f"top_k must be >= 1, not {k}")
        if sum(1 for d in output.shape if d > 1) > 1:
            raise LayoutMismatch(
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
        self._names = [labels[i] if labels else str(i) for i in range(self._flat.size)]
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


def _build(source: DecoderInput) -> ClassificationDecoder:
    if len(source.outputs) != 1:
        raise LayoutMismatch(f"a classifier has one output, not {len(source.outputs)}")
    return ClassificationDecoder(source.outputs[0], source.specs[0], source.labels, source.settings.top_k)


CLASSIFY = Layout("classify", "classify", "1xN class scores or logits: top-k classes", _build)
