"""How far a model's answers agree with a reference's: pure arithmetic, no model.

**The** judgement of agreement: ``edgeinfer optimize`` judges an optimised model against its original
by it, and the delegate probe (:mod:`.delegate_probe`) judges another runtime against the reference
runtime by it, with the same defaults (the ``DEFAULT_*`` below).

Boxes. The reference (the float model, the reference runtime) stands in for ground truth. Per image and per
class, the candidate's boxes (the INT8 model's, the other runtime's) are taken best score first and each
claims the unclaimed reference box of its class it overlaps most, if that overlap is at least ``min_iou``
(0.5): the matching of PASCAL VOC and COCO at IoU 0.5. From the matches:

- **recall**: reference boxes matched / reference boxes (what the optimised model still finds);
- **precision**: candidate boxes matched / candidate boxes (what it finds that the original does not);
- **mAP50 agreement**: the average precision of the candidate's boxes against the reference, per class
  the reference has, averaged (all-point interpolation, as VOC since 2010). It may use candidate boxes
  below the operating score threshold (``ap_boxes``): a box ranked rather than cut, as in COCO eval;
- **mean IoU** of the matched pairs: whether the boxes that are found still sit where they did.

Recall, precision and mean IoU count the boxes at or above ``score_threshold`` only — what a user of
the model at that threshold sees.

Class scores: the top-1 of each image (:func:`compare_top1`). An image whose reference top-1 beats its
top-2 by less than the ambiguous margin is a coin flip, not evidence; a tie at the top of the
candidate's scores never agrees (which class a user sees would depend on the sort).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

#: a match needs this overlap, as in PASCAL VOC and COCO's mAP50
DEFAULT_MATCH_IOU = 0.5
#: a candidate whose boxes fall below any of these against the reference's disagrees (see the module docstring)
DEFAULT_MIN_RECALL = 0.8
DEFAULT_MIN_PRECISION = 0.8
DEFAULT_MIN_MAP50 = 0.8
DEFAULT_MIN_MEAN_IOU = 0.8
#: boxes are compared at this score (Ultralytics' own default ``conf``) ...
DEFAULT_SCORE_THRESHOLD = 0.25
#: ... after NMS at this IoU (Ultralytics' default ``iou``)
DEFAULT_NMS_IOU = 0.7
#: candidate boxes below the operating threshold still rank for mAP50 down to this score (COCO eval ranks
#: everything; a floor keeps NMS cheap)
AP_SCORE_FLOOR = 0.01
#: boxes kept per image: enough that the floor, not the cap, decides what ranks
MAX_BOXES = 300
#: a classifier agrees when its top-1 is the reference's on at least this share of the decisive images
DEFAULT_MIN_AGREEMENT = 0.95
#: an image whose reference top-1 beats its top-2 by less than this is a coin flip, not evidence
DEFAULT_AMBIGUOUS_MARGIN = 0.05


class BoxLike(Protocol):
    """What a detection needs to be matched: ``edgeinfer.Detection`` is one."""

    @property
    def box(self) -> tuple[float, float, float, float]: ...

    @property
    def score(self) -> float: ...

    @property
    def class_id(self) -> int: ...


@dataclass(frozen=True)
class Box:
    """A box (x1, y1, x2, y2), its score and class: a detection reduced to what matching reads."""

    box: tuple[float, float, float, float]
    score: float
    class_id: int


@dataclass(frozen=True)
class ImageBoxes:
    """One image: boxes of the reference and of the candidate (at the threshold), and how many matched."""

    image: str
    reference: int
    candidate: int
    matched: int
    mean_iou: float | None

    @property
    def missed(self) -> int:
        """Reference boxes the candidate did not find."""
        return self.reference - self.matched

    @property
    def extra(self) -> int:
        """Candidate boxes with no reference box."""
        return self.candidate - self.matched

    @property
    def agrees(self) -> bool:
        """Every box found, none added."""
        return self.missed == 0 and self.extra == 0


@dataclass(frozen=True)
class BoxAgreement:
    """The candidate's boxes against the reference's over every image. None where a ratio has no denominator."""

    images: int
    reference_boxes: int
    candidate_boxes: int
    matched: int
    recall: float | None
    precision: float | None
    map50: float | None
    mean_iou: float | None
    #: average precision per class id the reference has (its name where known)
    per_class: dict[str, float]
    per_image: tuple[ImageBoxes, ...] = ()
    score_threshold: float = 0.0
    min_iou: float = DEFAULT_MATCH_IOU


def box_iou(a: Sequence[float], b: Sequence[float]) -> float:
    """Intersection over union of two (x1, y1, x2, y2) boxes; 0 when either has no area."""
    width = min(a[2], b[2]) - max(a[0], b[0])
    height = min(a[3], b[3]) - max(a[1], b[1])
    if width <= 0 or height <= 0:
        return 0.0
    inter = width * height
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union > 0 else 0.0


def match_boxes(reference: Sequence[BoxLike], candidate: Sequence[BoxLike],
                min_iou: float = DEFAULT_MATCH_IOU) -> list[float | None]:
    """Greedy matching, candidate boxes best score first: per candidate box (in the order given), the IoU
    of the reference box of its class it claimed, or None when it claimed none."""
    taken = [False] * len(reference)
    found: list[float | None] = [None] * len(candidate)
    for index in sorted(range(len(candidate)), key=lambda i: -candidate[i].score):
        box = candidate[index]
        best, best_iou = -1, min_iou
        for ref_index, ref in enumerate(reference):
            if taken[ref_index] or ref.class_id != box.class_id:
                continue
            overlap = box_iou(box.box, ref.box)
            if overlap >= best_iou:
                best, best_iou = ref_index, overlap
        if best >= 0:
            taken[best] = True
            found[index] = best_iou
    return found


def average_precision(ranked: Sequence[tuple[float, bool]], positives: int) -> float:
    """AP of (score, is a match) pairs against ``positives`` true boxes: the area under the precision
    envelope (all-point interpolation). 0 when nothing is ranked; ValueError when ``positives`` < 1."""
    if positives < 1:
        raise ValueError("average precision needs at least one reference box")
    hits = [hit for _score, hit in sorted(ranked, key=lambda pair: -pair[0])]
    precisions, recalls, true = [], [], 0
    for rank, hit in enumerate(hits, 1):
        true += hit
        precisions.append(true / rank)
        recalls.append(true / positives)
    area, previous_recall = 0.0, 0.0
    for index, recall in enumerate(recalls):
        if recall > previous_recall:  # precision envelope: the best precision at this recall or beyond
            area += (recall - previous_recall) * max(precisions[index:])
            previous_recall = recall
    return area


def box_agreement(images: Sequence[str], reference: Sequence[Sequence[BoxLike]],
                  candidate: Sequence[Sequence[BoxLike]], *, score_threshold: float,
                  min_iou: float = DEFAULT_MATCH_IOU, names: dict[int, str] | None = None) -> BoxAgreement:
    """Compare the candidate's boxes on each image with the reference's (see the module docstring).

    ``candidate`` may hold boxes below ``score_threshold``: they rank for mAP50 only.
    """
    if not len(images) == len(reference) == len(candidate):
        raise ValueError("one list of boxes per image, for both models")
    ranked: dict[int, list[tuple[float, bool]]] = {}
    positives: dict[int, int] = {}
    rows, ious = [], []
    for image, ref_boxes, cand_boxes in zip(images, reference, candidate):
        for ref in ref_boxes:
            positives[ref.class_id] = positives.get(ref.class_id, 0) + 1
        found = match_boxes(ref_boxes, cand_boxes, min_iou)
        for box, overlap in zip(cand_boxes, found):
            ranked.setdefault(box.class_id, []).append((box.score, overlap is not None))
        # at the threshold: a box above it is never matched through one below it (greedy by score)
        kept = [overlap for box, overlap in zip(cand_boxes, found) if box.score >= score_threshold]
        matched = [overlap for overlap in kept if overlap is not None]
        ious += matched
        rows.append(ImageBoxes(image, len(ref_boxes), len(kept), len(matched),
                               sum(matched) / len(matched) if matched else None))
    reference_boxes = sum(row.reference for row in rows)
    candidate_boxes = sum(row.candidate for row in rows)
    matched_boxes = sum(row.matched for row in rows)
    per_class = {(names or {}).get(cls, str(cls)): average_precision(ranked.get(cls, []), count)
                 for cls, count in sorted(positives.items())}
    return BoxAgreement(
        images=len(images), reference_boxes=reference_boxes, candidate_boxes=candidate_boxes,
        matched=matched_boxes,
        recall=matched_boxes / reference_boxes if reference_boxes else None,
        precision=matched_boxes / candidate_boxes if candidate_boxes else None,
        map50=sum(per_class.values()) / len(per_class) if per_class else None,
        mean_iou=sum(ious) / len(ious) if ious else None,
        per_class=per_class, per_image=tuple(rows), score_threshold=score_threshold, min_iou=min_iou,
    )


#: the figures a verdict reads, in the order messages name them, and how they are named there
FIGURES = {"recall": "recall", "precision": "precision", "map50": "mAP50", "mean_iou": "mean IoU"}


def value_text(name: str, value: float | None) -> str:
    """A figure's value as messages show it: ratios of boxes in percent, mAP50 and IoU as numbers; n/a when
    there was nothing to count (no box given, none matched)."""
    if value is None:
        return "n/a"
    return f"{value:.1%}" if name in ("recall", "precision") else f"{value:.3f}"


def figure_text(name: str, value: float | None) -> str:
    """``recall 92.0%``, ``mAP50 0.871``, ``mean IoU n/a`` (no value)."""
    return f"{FIGURES[name]} {value_text(name, value)}"


#: the box figures' default minimums by name (FIGURES' keys)
DEFAULT_BOX_MINIMUMS = {"recall": DEFAULT_MIN_RECALL, "precision": DEFAULT_MIN_PRECISION, "map50": DEFAULT_MIN_MAP50,
                        "mean_iou": DEFAULT_MIN_MEAN_IOU}


def shortfalls(agreement: BoxAgreement, minimums: dict[str, float]) -> dict[str, str]:
    """Each figure below its minimum, by name, as ``recall 42.0% < 80.0%``; a figure with no value (no box
    to count) falls short of any minimum above 0, as ``precision n/a``."""
    found = {}
    for name in FIGURES:
        minimum = minimums.get(name, 0.0)
        value = getattr(agreement, name)
        if minimum > 0 and value is None:
            found[name] = figure_text(name, value)
        elif minimum > 0 and value < minimum:
            found[name] = f"{figure_text(name, value)} < {value_text(name, minimum)}"
    return found


@dataclass(frozen=True)
class Top1:
    """One image's top-1 under the reference's class scores and the candidate's."""

    reference: int
    #: -1 when the candidate's two best scores are tied
    candidate: int
    reference_score: float
    candidate_score: float
    #: the reference's top-1 score over its top-2
    margin: float
    #: the reference's top-1 is among the candidate's five best
    in_top5: bool

    @property
    def agrees(self) -> bool:
        """Both put the same class first."""
        return self.reference == self.candidate

    def ambiguous(self, margin: float = DEFAULT_AMBIGUOUS_MARGIN) -> bool:
        """The reference's top-1 beats its top-2 by less than ``margin``: no evidence either way."""
        return self.margin < margin


def compare_top1(reference: Sequence[float], candidate: Sequence[float]) -> Top1:
    """The top-1 of two class-score vectors of one image (ties: the lowest index first, like argmax)."""
    if len(reference) != len(candidate) or not len(reference):
        raise ValueError("two class-score vectors of the same length")
    order_a = sorted(range(len(reference)), key=lambda i: -float(reference[i]))  # stable: ties keep index order
    order_b = sorted(range(len(candidate)), key=lambda i: -float(candidate[i]))
    top_a, top_b = order_a[0], order_b[0]
    margin = float(reference[top_a]) - float(reference[order_a[1]]) if len(reference) > 1 else 1.0
    tied = len(candidate) > 1 and float(candidate[top_b]) == float(candidate[order_b[1]])
    return Top1(top_a, -1 if tied else top_b, float(reference[top_a]), float(candidate[top_b]), margin,
                top_a in order_b[:5])


def top1_agreement(rows: Sequence[Top1],
                   ambiguous_margin: float = DEFAULT_AMBIGUOUS_MARGIN) -> tuple[float | None, int]:
    """The share of decisive images (not ambiguous for the reference) on which the top-1 agrees, and how many
    were decisive; None when none was."""
    decisive = [row for row in rows if not row.ambiguous(ambiguous_margin)]
    return (sum(row.agrees for row in decisive) / len(decisive) if decisive else None), len(decisive)
