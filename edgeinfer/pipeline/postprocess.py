"""The typed results a pipeline gives, and the class-score helpers classifiers share."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..forms.samples import COCO_KEYPOINT_NAMES, MAX_POLYGON_POINTS, MAX_POLYGONS

if TYPE_CHECKING:
    import numpy as np

    from ..runtime.model import TensorSpec
    from .labels import Labels


@dataclass(frozen=True, slots=True)
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

    scores = np.array(spec.dequantize(output), dtype=np.float32).reshape(-1)  # a copy: normalised in place
    counts = not spec.quantized and bool(np.issubdtype(np.asarray(output).dtype, np.unsignedinteger))
    return as_probabilities(scores, counts=counts)


def as_probabilities(scores: np.ndarray, *, counts: bool = False, probabilities: bool = False) -> np.ndarray:
    """``scores`` (dequantised, 1-D float) made class probabilities, in place. ``counts``: an unsigned integer
    output with no scale anywhere in the model (inspect_model notes it) — a quantised softmax's steps, read
    as shares of their sum (a softmax of the raw integers would say ~1.0 whatever they were);
    ``probabilities``: the output's whole range lies in [0, 1]; otherwise values outside [0, 1] are logits,
    softmaxed."""
    import numpy as np

    if counts:
        total = scores.sum()
        if total > 0:
            np.divide(scores, total, out=scores)
    elif not probabilities and scores.size and (scores.min() < -1e-6 or scores.max() > 1.0 + 1e-6):
        np.subtract(scores, scores.max(), out=scores)
        np.exp(scores, out=scores)
        np.divide(scores, scores.sum(), out=scores)
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


# ------------------------------------------------------------------------------------------
# Results of the geometric tasks (the decoders that make them: edgeinfer.pipeline.decoders)
# ------------------------------------------------------------------------------------------

#: MoveNet / COCO keypoint order (the sample form's, ``forms/samples.py``: one definition for the device and the fleet)
KEYPOINT_NAMES = COCO_KEYPOINT_NAMES

#: MediaPipe BlazeFace keypoint order
FACE_KEYPOINT_NAMES = ("right_eye", "left_eye", "nose_tip", "mouth_center", "right_ear_tragion", "left_ear_tragion")


@dataclass(frozen=True, slots=True)
class Keypoint:
    """A keypoint in source-frame pixels with its confidence (visibility; 1.0 when the model gives none)."""

    name: str
    x: float
    y: float
    score: float

    def to_dict(self) -> dict:
        return {"name": self.name, "x": round(self.x, 1), "y": round(self.y, 1), "score": round(self.score, 6)}


def keypoint_rows(keypoints: Any, width: float = math.inf, height: float = math.inf) -> list[list[float]]:
    """``[x, y, confidence]`` each in the frame's pixels (a sample's form, an event's); one the model put off the frame
    is cut to it, unseen (0)."""
    out = []
    for k in keypoints:
        x, y, score = (v if math.isfinite(v) else -1.0 for v in (float(k.x), float(k.y), float(k.score)))
        inside = 0.0 <= x <= width and 0.0 <= y <= height
        out.append([round(min(max(x, 0.0), width), 1), round(min(max(y, 0.0), height), 1),
                    round(min(max(score, 0.0), 1.0), 4) if inside else 0.0])
    return out


@dataclass(frozen=True, eq=False)
class InstanceMask:
    """One instance's mask at source resolution, cropped to its box: ``pixels`` (bool, HxW) covers the source
    rectangle whose top-left corner is (``x``, ``y``)."""

    x: int
    y: int
    pixels: np.ndarray

    @property
    def area(self) -> int:
        return int(self.pixels.sum())

    def polygons(self, max_points: int | None = None,
                 max_polygons: int | None = None) -> list[list[tuple[float, float]]]:
        """The mask's outer contours as polygons in source pixels (largest first): at most ``max_polygons`` of them
        and ``max_points`` points in all, simplified (Douglas-Peucker, the tolerance doubled until they fit)."""
        import cv2
        import numpy as np

        contours, _ = cv2.findContours(self.pixels.astype(np.uint8), cv2.RETR_EXTERNAL, cv2.CHAIN_APPROX_SIMPLE)
        contours = [c for c in sorted(contours, key=cv2.contourArea, reverse=True) if len(c) >= 3][:max_polygons]
        tolerance = 0.5
        while max_points is not None and sum(len(c) for c in contours) > max_points:
            contours = [c for c in (cv2.approxPolyDP(c, tolerance, True) for c in contours) if len(c) >= 3]
            tolerance *= 2
        return [[(float(px + self.x), float(py + self.y)) for px, py in contour.reshape(-1, 2)] for contour in contours]

    def full(self, width: int, height: int) -> np.ndarray:
        """The mask in a ``height`` x ``width`` frame (a new array)."""
        import numpy as np

        frame = np.zeros((height, width), bool)
        h, w = self.pixels.shape
        frame[self.y:self.y + h, self.x:self.x + w] = self.pixels[:max(0, height - self.y), :max(0, width - self.x)]
        return frame


@dataclass(frozen=True, slots=True)
class Detection:
    """One detected object: a box in source-frame pixels (x1, y1, x2, y2), its score and class.

    ``track_id`` is set by a tracker (edgeinfer.pipeline.tracking) on detections of a confirmed track. Layouts
    that say more fill the rest: ``keypoints`` (a pose model's person, a face's landmarks), ``mask`` (an
    instance-segmentation model), ``rotated`` (an oriented box: centre x, centre y, width, height, angle in
    radians; ``box`` is then the upright box that holds it).
    """

    box: tuple[float, float, float, float]
    score: float
    class_id: int
    label: str
    track_id: int | None = None
    keypoints: tuple[Keypoint, ...] = ()
    mask: InstanceMask | None = None
    rotated: tuple[float, float, float, float, float] | None = None

    def keypoint(self, name: str) -> Keypoint:
        """The keypoint called ``name`` (KeyError names the ones there are)."""
        for keypoint in self.keypoints:
            if keypoint.name == name:
                return keypoint
        known = ", ".join(k.name for k in self.keypoints) or "none"
        raise KeyError(f"no keypoint {name!r}; this detection has {known}")

    def to_dict(self) -> dict:
        data: dict = {"box": [round(v, 1) for v in self.box], "score": round(self.score, 6),
                      "class_id": self.class_id, "label": self.label}
        if self.track_id is not None:
            data["track_id"] = self.track_id
        if self.keypoints:
            data["keypoints"] = [k.to_dict() for k in self.keypoints]
        data.update(self.shapes())
        return data

    def shapes(self) -> dict:
        """What an oriented-box or instance-segmentation model gives beyond the box, as JSON — ``rotated_box`` (cx,
        cy, w, h, angle in radians) and ``polygons`` (the mask's outline): the one form a run's JSON, an event and
        a sample carry them in (``forms.samples``)."""
        data: dict = {}
        if self.rotated is not None:
            data["rotated_box"] = [round(v, 1) for v in self.rotated[:4]] + [round(self.rotated[4], 5)]
        if self.mask is not None:
            data["polygons"] = [[[round(x, 1), round(y, 1)] for x, y in polygon]
                                for polygon in self.mask.polygons(MAX_POLYGON_POINTS, MAX_POLYGONS)]
        return data


@dataclass(frozen=True)
class Detections:
    """The detections of one frame, best score first (a sequence of :class:`Detection`)."""

    items: tuple[Detection, ...] = ()

    def __len__(self) -> int:
        return len(self.items)

    def __iter__(self):
        return iter(self.items)

    def __getitem__(self, index: int) -> Detection:
        return self.items[index]

    def to_dict(self) -> list[dict]:
        return [d.to_dict() for d in self.items]


@dataclass(frozen=True, eq=False)
class Segmentation:
    """A per-pixel class map in source-frame size (uint8 class ids) and the classes present."""

    mask: np.ndarray
    class_ids: tuple[int, ...]
    labels: tuple[str, ...]
    #: share of the frame's pixels per class id present
    fractions: tuple[float, ...]

    def class_mask(self, class_id: int) -> np.ndarray:
        """Boolean HxW mask of one class."""
        return self.mask == class_id

    def to_dict(self) -> dict:
        return {"shape": list(self.mask.shape),
                "classes": [{"class_id": c, "label": label, "fraction": round(f, 6)}
                            for c, label, f in zip(self.class_ids, self.labels, self.fractions)]}
