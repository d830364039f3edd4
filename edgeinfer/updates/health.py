"""The health gate: whether a model just swapped in behaves on live frames (finite outputs, sane latency)."""

from __future__ import annotations

import math
from typing import Any


class HealthGate:
    """Decides after ``frames`` results whether a new model is healthy: finite outputs, sane latency."""

    def __init__(self, *, frames: int = 20, baseline_infer_ms: float | None = None, max_factor: float = 3.0) -> None:
        self.frames = frames
        self.baseline = baseline_infer_ms
        self.max_factor = max_factor
        self._latencies: list[float] = []
        self.reason: str | None = None

    def observe(self, infer_ms: float, finite: bool) -> bool | None:
        """Feed one frame; None while undecided, then True (healthy) or False (see ``reason``)."""
        if not finite:
            self.reason = "non_finite_output"
            return False
        self._latencies.append(infer_ms)
        if len(self._latencies) < self.frames:
            return None
        median = sorted(self._latencies)[len(self._latencies) // 2]
        if self.baseline and median > self.baseline * self.max_factor:
            self.reason = f"latency_regression: median {median:.1f} ms > {self.max_factor}x {self.baseline:.1f} ms"
            return False
        return True


def result_is_finite(value: Any) -> bool:
    """True when no float inside a task result (scores, boxes, keypoints) is NaN or infinite."""
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(result_is_finite(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return all(result_is_finite(v) for v in value)
    to_dict = getattr(value, "to_dict", None)
    if callable(to_dict):
        return result_is_finite(to_dict())
    return True
