"""Turning output tensors into typed results."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from .labels import Labels
from .model import TensorSpec

if TYPE_CHECKING:
    import numpy as np


@dataclass(frozen=True)
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

    scores = spec.dequantize(output).reshape(-1)
    if scores.size and (scores.min() < -1e-6 or scores.max() > 1.0 + 1e-6):
        shifted = np.exp(scores - scores.max())
        scores = shifted / shifted.sum()
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
