"""What a pipeline answered over a window: the small output summary a canary analysis compares.

:class:`OutputSummary` counts, per window, each frame's top-1 class (classifiers) or the detections
by label (every task whose results are boxes: detect, pose, instance masks, oriented boxes), and the
mean score. ``take()`` returns the window's summary and starts the
next one; telemetry carries it (``outputs`` in a pipeline's entry), and the fleet compares a
canary's distribution with the devices still on the old model. It costs a few dictionary updates
per frame; only the :data:`TOP_LABELS` most frequent labels of a window are reported.
"""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

from .postprocess import Classification, Detections, Segmentation

#: labels reported per window (the most frequent)
TOP_LABELS = 10
#: a label longer than this is cut (the protocol's bound)
MAX_LABEL_CHARS = 128


def _label(label: str, index: int) -> str:
    return (label or f"#{index}")[:MAX_LABEL_CHARS]


class OutputSummary:
    """Counts of one window's answers; ``observe`` in the inference thread, ``take`` in any other."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._reset()

    def _reset(self) -> None:
        self._frames = 0
        self._labels: Counter[str] = Counter()
        self._detections = 0
        self._score_sum = 0.0
        self._scores = 0

    def observe(self, result: Any) -> None:
        """Count one frame's result (a FrameResult's ``result``)."""
        with self._lock:
            self._frames += 1
            if isinstance(result, Detections):
                self._detections += len(result)
                for detection in result:
                    self._labels[_label(detection.label, detection.class_id)] += 1
                    self._score_sum += detection.score
                self._scores += len(result)
            elif isinstance(result, list):
                if result and isinstance(result[0], Classification):
                    top = result[0]
                    self._labels[_label(top.label, top.index)] += 1
                    self._score_sum += top.score
                    self._scores += 1
            elif isinstance(result, Segmentation):
                for class_id, label in zip(result.class_ids, result.labels):
                    self._labels[_label(label, class_id)] += 1

    def take(self) -> dict[str, Any] | None:
        """The window's summary (None when no frame was counted), and a new window."""
        with self._lock:
            if not self._frames:
                return None
            summary = {
                "frames": self._frames,
                "top": dict(self._labels.most_common(TOP_LABELS)),
                "detections": self._detections,
                "score_mean": round(self._score_sum / self._scores, 6) if self._scores else None,
            }
            self._reset()
            return summary


def merge_summaries(first: dict[str, Any] | None, second: dict[str, Any] | None) -> dict[str, Any] | None:
    """Two consecutive windows' summaries as one (counts add up; the top labels are re-cut)."""
    if first is None or second is None:
        return second if first is None else first
    labels = Counter(first.get("top") or {}) + Counter(second.get("top") or {})
    scored = [(s["score_mean"], s["frames"]) for s in (first, second) if s.get("score_mean") is not None]
    weight = sum(n for _, n in scored)
    return {
        "frames": first["frames"] + second["frames"],
        "top": dict(labels.most_common(TOP_LABELS)),
        "detections": first.get("detections", 0) + second.get("detections", 0),
        "score_mean": round(sum(m * n for m, n in scored) / weight, 6) if weight else None,
    }
