"""Still-image classification: the engine, a preprocessor per image size, top-k."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from ..capture.images import read_image
from ..runtime.engine import Engine
from .labels import Labels
from .postprocess import Classification, class_scores, top_k
from .preprocess import Preprocessor

if TYPE_CHECKING:
    import numpy as np


class ImageClassifier:
    """Classify BGR images with an engine; reuses the preprocessor while the image size repeats."""

    def __init__(self, engine: Engine, labels: Labels | None = None, *, top_k: int = 5,
                 resize: str = "stretch", mean=None, std=None) -> None:
        self.engine = engine
        self.labels = labels
        self.k = top_k
        self._options = {"resize": resize, "mean": mean, "std": std}
        self._pre: Preprocessor | None = None

    def classify_array(self, image: np.ndarray) -> list[Classification]:
        """Top-k classes of an HxWx3 BGR uint8 image."""
        size = (image.shape[1], image.shape[0])
        pre = self._pre
        if pre is None or (pre.source_width, pre.source_height) != size:
            pre = self._pre = Preprocessor(self.engine.inputs[0], size, **self._options)
        pre(image, self.engine.input_view(0))
        self.engine.invoke()
        scores = class_scores(self.engine.output_view(0), self.engine.outputs[0])
        return top_k(scores, self.k, self.labels)

    def classify_file(self, path: str | os.PathLike) -> list[Classification]:
        """Top-k classes of an image file."""
        return self.classify_array(read_image(path))
