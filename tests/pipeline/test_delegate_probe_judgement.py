"""The delegate probe's judgement of a runtime's answers against the reference's, in-process on real models.

The answers are read as the probe reads them (the pipeline's preprocessing, the task's decoder down to the ranking
floor); the candidate's are the reference's own (which must agree) or the reference's changed the way a runtime
that changes the answer would (which must not). The rule is ``edgeinfer optimize``'s (pipeline/agreement.py).
"""

from __future__ import annotations

import dataclasses

import pytest
from support.assets import IMAGES, MODELS

from edgeinfer.pipeline.agreement import Box
from edgeinfer.pipeline.delegate_probe import answers, judge, judgement_frames, judgement_reading, synthetic_frame
from edgeinfer.pipeline.options import PipelineOptions
from edgeinfer.runtime.selection import load


def read(model: str, *sources: str):
    """``model``'s answers on the judgement frames of ``sources`` (ONNX Runtime or XNNPACK), and the frames."""
    judged = judgement_frames([str(IMAGES / s) for s in sources])
    engine = load(MODELS / model)
    try:
        return answers(engine, judgement_reading(engine, PipelineOptions()), judged), judged
    finally:
        engine.close()


@pytest.fixture(scope="module")
def fall():
    """The fall detector on kite_and_cold.jpg: two people at score >= 0.25, many more boxes below it."""
    return read("yolo_fall_detection.onnx", "kite_and_cold.jpg")


def test_the_same_boxes_agree_counted_at_the_operating_score_the_lower_ones_only_ranked(fall):
    reference, judged = fall
    assert judged.real and judged.names == ("kite_and_cold.jpg", "synthetic")
    first = reference.per_frame[0]
    assert sum(box.score >= 0.25 for box in first) == 2 and len(first) > 2  # boxes under the score are there
    agrees, verdict = judge(reference, reference, judged)
    assert agrees is True
    assert verdict == "agrees: 2 of 2 boxes found, 2 given, mAP50 1.000, mean IoU 1.000"


def test_boxes_that_moved_disagree_and_the_verdict_names_the_figures(fall):
    reference, judged = fall
    moved = [[Box((b.box[0] + (b.box[2] - b.box[0]) * 0.6, b.box[1], b.box[2] + (b.box[2] - b.box[0]) * 0.6,
                   b.box[3]), b.score, b.class_id) for b in boxes] for boxes in reference.per_frame]
    agrees, verdict = judge(reference, dataclasses.replace(reference, per_frame=moved), judged)
    assert agrees is False
    assert verdict.startswith("disagrees: 0 of 2 boxes found, 2 given; recall 0.0% < 80.0%, precision 0.0% < 80.0%")


def test_another_class_for_the_same_box_disagrees(fall):
    reference, judged = fall
    other = [[Box(b.box, b.score, 1 - b.class_id) for b in boxes] for boxes in reference.per_frame]
    agrees, verdict = judge(reference, dataclasses.replace(reference, per_frame=other), judged)
    assert agrees is False and verdict.startswith("disagrees: 0 of 2 boxes found")


def test_nothing_to_judge_by_is_not_judged_but_a_box_added_there_disagrees():
    reference, judged = read("yolo11n-pose.onnx")  # no file: the synthetic frame alone
    assert not judged.real and judged.names == ("synthetic",)
    assert not [box for box in reference.per_frame[0] if box.score >= 0.25]
    assert judge(reference, reference, judged) == (
        None, "not judged: the reference finds no box at score >= 0.25")
    added = dataclasses.replace(reference, per_frame=[[Box((10.0, 10.0, 200.0, 300.0), 0.9, 0)]])
    assert judge(reference, added, judged) == (
        False, "disagrees: finds 1 box(es) at score >= 0.25 where the reference finds none")


def test_a_classifier_is_judged_by_its_top1_on_the_decisive_frames():
    reference, judged = read("mobilenet_v2_1.0_224_float.onnx", "parrot.jpg")
    assert reference.kind == "top1" and judged.names == ("parrot.jpg", "synthetic")
    agrees, verdict = judge(reference, reference, judged)
    assert agrees is True and verdict.startswith("agrees: the top-1 is the reference's on")
    parrot = reference.per_frame[0]
    best = max(range(len(parrot)), key=parrot.__getitem__)
    swapped = list(parrot)
    swapped[best], swapped[0] = swapped[0], swapped[best]  # another class first on the parrot
    tied = list(parrot)
    tied[(best + 1) % len(tied)] = tied[best]  # two classes first: which one a user sees depends on the sort
    for changed in (swapped, tied):
        candidate = dataclasses.replace(reference, per_frame=[changed, *reference.per_frame[1:]])
        agrees, verdict = judge(reference, candidate, judged)
        assert agrees is False and verdict.startswith("disagrees: the top-1 is the reference's on")


def test_results_that_are_neither_boxes_nor_classes_are_not_judged():
    reference, judged = read("deeplabv3_mnv2_dm05_pascal_quant.tflite", "dog_segmentation.bmp")
    assert reference.kind == ""
    assert judge(reference, reference, judged) == (None, "not judged: its results are neither boxes nor class scores")


def test_the_synthetic_frame_is_fixed_and_not_flat():
    frame = synthetic_frame()
    assert frame.shape == (480, 640, 3) and frame.dtype.name == "uint8"
    assert (frame == synthetic_frame()).all()  # the same frame every time: choices compare on one input
    assert frame.std() > 30 and len({tuple(p) for p in frame[::37, ::41].reshape(-1, 3)}) > 100
