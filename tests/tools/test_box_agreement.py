"""The box agreement that judges an optimised detector, on hand-made boxes: each figure made to fail alone."""

from __future__ import annotations

import pytest

from edgeinfer.pipeline.agreement import (
    Box,
    average_precision,
    box_agreement,
    box_iou,
    match_boxes,
    shortfalls,
)

PERSON, DOG = 0, 1
MINIMUMS = {"recall": 0.8, "precision": 0.8, "map50": 0.8, "mean_iou": 0.8}


def box(x: float, y: float, size: float = 100, score: float = 0.9, cls: int = PERSON) -> Box:
    return Box((x, y, x + size, y + size), score, cls)


def agree(reference, candidate, threshold: float = 0.25):
    """One image per pair of lists."""
    return box_agreement([f"image{i}" for i in range(len(reference))], reference, candidate,
                         score_threshold=threshold, names={PERSON: "person", DOG: "dog"})


FIVE = [box(0, 0), box(200, 0), box(400, 0), box(600, 0), box(800, 0)]


def test_iou_of_known_overlaps():
    assert box_iou((0, 0, 10, 10), (0, 0, 10, 10)) == 1.0
    assert box_iou((0, 0, 10, 10), (20, 20, 30, 30)) == 0.0
    assert box_iou((0, 0, 10, 10), (5, 0, 15, 10)) == pytest.approx(1 / 3)
    assert box_iou((0, 0, 0, 10), (0, 0, 10, 10)) == 0.0  # no area


def test_identical_boxes_agree_on_every_figure():
    result = agree([FIVE, [box(0, 0, cls=DOG)]], [FIVE, [box(0, 0, cls=DOG)]])
    assert (result.recall, result.precision, result.map50, result.mean_iou) == (1.0, 1.0, 1.0, 1.0)
    assert result.per_class == {"person": 1.0, "dog": 1.0}
    assert all(row.agrees for row in result.per_image) and shortfalls(result, MINIMUMS) == {}


def test_missing_boxes_fail_recall_only():
    result = agree([FIVE], [FIVE[:3]])
    assert result.recall == 0.6 and result.precision == 1.0 and result.mean_iou == 1.0
    assert result.map50 == pytest.approx(0.6)  # a box never given is never ranked
    assert result.per_image[0].missed == 2 and result.per_image[0].extra == 0
    assert set(shortfalls(result, MINIMUMS)) == {"recall", "map50"}
    assert shortfalls(result, MINIMUMS)["recall"] == "recall 60.0% < 80.0%"


def test_extra_boxes_fail_precision_only():
    extra = [box(0, 500, score=0.3), box(300, 500, score=0.3), box(600, 500, score=0.3)]
    result = agree([FIVE], [FIVE + extra])
    assert result.recall == 1.0 and result.precision == 5 / 8 and result.mean_iou == 1.0
    assert result.map50 == 1.0  # every extra box ranks below every match
    assert result.per_image[0].extra == 3
    assert list(shortfalls(result, MINIMUMS)) == ["precision"]


def test_a_confident_false_box_fails_map50_alone():
    # 4 of 5 found, one extra box ranked first: 80% recall and precision at the threshold, but the
    # ranking is wrong from the top
    result = agree([FIVE], [[box(0, 500, score=0.99), *FIVE[:4]]])
    assert result.recall == 0.8 and result.precision == 0.8 and result.mean_iou == 1.0
    assert result.map50 == pytest.approx(0.64)
    assert list(shortfalls(result, MINIMUMS)) == ["map50"]
    assert shortfalls(result, MINIMUMS)["map50"] == "mAP50 0.640 < 0.800"


def test_shifted_boxes_still_match_but_fail_mean_iou():
    shifted = [box(b.box[0] + 20, b.box[1]) for b in FIVE]  # IoU 80/120 = 0.667 each
    result = agree([FIVE], [shifted])
    assert result.recall == 1.0 and result.precision == 1.0 and result.map50 == 1.0
    assert result.mean_iou == pytest.approx(2 / 3)
    assert list(shortfalls(result, MINIMUMS)) == ["mean_iou"]


def test_below_half_overlap_is_no_match():
    result = agree([[box(0, 0)]], [[box(40, 0)]])  # IoU 60/140 = 0.43
    assert result.matched == 0 and result.recall == 0.0 and result.precision == 0.0 and result.mean_iou is None


def test_the_right_place_with_the_wrong_class_is_no_match():
    result = agree([[box(0, 0, cls=PERSON)]], [[box(0, 0, cls=DOG)]])
    assert result.recall == 0.0 and result.precision == 0.0 and result.map50 == 0.0
    assert result.per_class == {"person": 0.0}  # averaged over the classes the reference has


def test_mean_ap_averages_the_reference_classes():
    result = agree([[box(0, 0, cls=PERSON), box(200, 0, cls=DOG)]], [[box(0, 0, cls=PERSON)]])
    assert result.per_class == {"person": 1.0, "dog": 0.0} and result.map50 == 0.5


def test_greedy_matching_goes_by_score_and_claims_a_box_once():
    reference = [box(0, 0)]
    # the better-placed box scores lower: the higher score claims the reference box
    candidate = [box(0, 0, score=0.5), box(10, 0, score=0.9)]
    assert match_boxes(reference, candidate) == [None, pytest.approx(90 / 110)]
    result = agree([reference], [candidate])
    assert result.matched == 1 and result.precision == 0.5


def test_boxes_below_the_threshold_rank_for_map50_but_are_not_counted():
    low = box(400, 0, score=0.1)
    result = agree([FIVE[2:3] + FIVE[:2]], [[*FIVE[:2], low]])
    assert result.candidate_boxes == 2 and result.matched == 2
    assert result.recall == pytest.approx(2 / 3) and result.precision == 1.0
    assert result.map50 == 1.0  # found, ranked last, no false box above it


def test_no_reference_box_leaves_recall_and_map50_undefined():
    result = agree([[]], [[box(0, 0)]])
    assert result.recall is None and result.map50 is None and result.precision == 0.0
    assert shortfalls(result, MINIMUMS)["recall"] == "recall n/a"


def test_a_candidate_that_finds_nothing():
    result = agree([FIVE], [[]])
    assert result.recall == 0.0 and result.precision is None and result.map50 == 0.0 and result.mean_iou is None
    assert set(shortfalls(result, MINIMUMS)) == {"recall", "precision", "map50", "mean_iou"}
    assert shortfalls(result, {"recall": 0.0}) == {}  # a threshold of 0 checks nothing


def test_average_precision_is_the_area_under_the_precision_envelope():
    # ranks: hit, miss, hit over 2 positives -> 0.5 * 1 + 0.5 * 2/3
    assert average_precision([(0.9, True), (0.8, False), (0.7, True)], 2) == pytest.approx(5 / 6)
    assert average_precision([(0.7, True), (0.9, True), (0.8, False)], 2) == pytest.approx(5 / 6)  # sorted first
    assert average_precision([], 3) == 0.0
    with pytest.raises(ValueError):
        average_precision([(0.9, True)], 0)


def test_lists_must_line_up():
    with pytest.raises(ValueError, match="one list of boxes per image"):
        box_agreement(["a"], [[]], [], score_threshold=0.25)
