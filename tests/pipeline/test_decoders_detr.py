"""``detr``, ``rf-detr`` and ``dfine``: small real ONNX models (tests/support/detr_models.py) whose outputs
are planted objects, run by ONNX Runtime through the real pipeline on a 960x540 frame: each object must come
out at its place in source pixels, through the stretch or the letterbox."""

from __future__ import annotations

import numpy as np
import pytest
from support.detr_models import (
    FRAME,
    OBJECTS,
    ULTRALYTICS_METADATA,
    Planted,
    assert_found,
    detect,
    detr_outputs,
    dfine_outputs,
    in_source,
    planted_onnx,
    reading,
    ultralytics_rtdetr_output,
    write_frame,
)
from support.pipeline import ULTRAFACE

import edgeinfer
from edgeinfer.pipeline.labels import Labels


@pytest.fixture
def frame(tmp_path):
    return write_frame(tmp_path / "frame.png")


def sigmoid_model(tmp_path, objects=OBJECTS, names=("logits", "pred_boxes"), **kwargs):
    boxes, logits = detr_outputs(objects, queries=300, classes=80, **kwargs)
    return planted_onnx(tmp_path / "rtdetr.onnx", {names[0]: logits, names[1]: boxes})


@pytest.mark.parametrize("resize", ["stretch", "letterbox"])
def test_sigmoid_detr_queries_come_out_at_their_places(tmp_path, frame, resize):
    model = sigmoid_model(tmp_path)
    chosen = reading(model)
    assert (chosen.task, chosen.layout.name, chosen.decoder.activation) == ("detect", "detr", "sigmoid")
    assert (chosen.resize, chosen.mean, chosen.std) == ("stretch", 0.0, 255.0)  # RT-DETR: [0, 1], stretched
    assert_found(detect(model, frame, resize=resize), OBJECTS, resize)


def test_a_sigmoid_query_may_hold_two_classes(tmp_path, frame):
    boxes, logits = detr_outputs(OBJECTS[:1], queries=300, classes=80)
    logits[0, 0, 9] = np.log(0.7 / 0.3)  # the same query, a second class above the threshold
    model = planted_onnx(tmp_path / "two.onnx", {"pred_boxes": boxes, "logits": logits})
    found = detect(model, frame)
    assert [(d.class_id, round(d.score, 4)) for d in found] == [(3, 0.9), (9, 0.7)]
    assert found[0].box == found[1].box


def test_facebook_detr_softmax_head_with_its_no_object_class(tmp_path, frame):
    boxes, logits = detr_outputs(OBJECTS, queries=100, classes=92, softmax=True)
    model = planted_onnx(tmp_path / "detr.onnx", {"pred_logits": logits, "pred_boxes": boxes})
    assert reading(model).decoder.activation == "softmax"  # 92 = COCO's 91 ids + no object
    found = detect(model, frame)
    assert [(d.class_id, round(d.score, 3)) for d in found] == [(o.class_id, o.score) for o in OBJECTS]
    for detection, obj in zip(found, OBJECTS):
        assert detection.box == pytest.approx(in_source(obj.box, "stretch"), abs=0.01)


def test_the_names_decide_sigmoid_or_softmax(tmp_path):
    boxes, logits = detr_outputs(OBJECTS[:1], queries=100, classes=6, softmax=True)
    model = planted_onnx(tmp_path / "six.onnx", {"logits": logits, "pred_boxes": boxes})
    five = Labels(dict(enumerate("abcde")))
    assert reading(model, labels=five).decoder.activation == "softmax"  # 5 names + no object
    assert reading(model, labels=Labels(dict(enumerate("abcdef")))).decoder.activation == "sigmoid"
    assert reading(model).decoder.activation == "sigmoid"  # no names, and not DETR's COCO head


def test_rf_detr_by_its_output_names_with_imagenet_normalisation(tmp_path, frame):
    boxes, logits = detr_outputs(OBJECTS, queries=300, classes=91)
    model = planted_onnx(tmp_path / "rfdetr.onnx", {"dets": boxes, "labels": logits})
    chosen = reading(model)
    assert (chosen.layout.name, chosen.decoder.activation, chosen.resize) == ("rf-detr", "sigmoid", "stretch")
    assert chosen.mean == pytest.approx((123.675, 116.28, 103.53))  # ImageNet's, on 0-255 pixels
    assert chosen.std == pytest.approx((58.395, 57.12, 57.375))
    assert_found(detect(model, frame), OBJECTS, "stretch")


def test_ultralytics_rtdetr_single_output(tmp_path, frame):
    model = planted_onnx(tmp_path / "rtdetr-l.onnx", {"output0": ultralytics_rtdetr_output(OBJECTS)},
                         metadata=ULTRALYTICS_METADATA)
    chosen = reading(model)
    assert (chosen.layout.name, chosen.decoder.activation) == ("detr", "none")
    assert chosen.resize == "stretch"  # its metadata says RT-DETR: Ultralytics stretches those frames
    names = [f"c{i}" for i in range(80)]
    assert_found(detect(model, frame), OBJECTS, "stretch", labels=names)
    assert_found(detect(model, frame, resize="letterbox"), OBJECTS, "letterbox", labels=names)
    # two classes: [1, 300, 6] is also the shape of an end-to-end YOLO's selected boxes; the metadata tells
    rows = ultralytics_rtdetr_output([Planted((100, 200, 300, 400), 1, 0.9)], classes=2)
    two = planted_onnx(tmp_path / "rtdetr-2.onnx", {"output0": rows},
                       metadata={**ULTRALYTICS_METADATA, "names": "{0: 'a', 1: 'b'}"})
    assert reading(two).layout.name == "detr"
    unlabelled = planted_onnx(tmp_path / "plain.onnx", {"output0": ultralytics_rtdetr_output(OBJECTS)})
    with pytest.raises(ValueError, match="Ultralytics"):
        reading(unlabelled, decoder="detr")


@pytest.mark.parametrize("resize", ["stretch", "letterbox"])
def test_dfine_boxes_scaled_by_the_size_input_the_pipeline_fills(tmp_path, frame, resize):
    model = planted_onnx(tmp_path / "dfine.onnx", dfine_outputs(OBJECTS), sized=["boxes"])
    chosen = reading(model)
    assert (chosen.layout.name, chosen.decoder.size_inputs, chosen.resize) == ("dfine", (1,), "stretch")
    # orig_target_sizes left at 0 would give boxes of 0: the planted places prove (640, 640) went in
    assert_found(detect(model, frame, resize=resize), OBJECTS, resize)


def test_dfine_without_a_size_input_reads_normalised_boxes(tmp_path, frame):
    model = planted_onnx(tmp_path / "dfine-plain.onnx", dfine_outputs(OBJECTS))
    assert reading(model).decoder.size_inputs == ()
    assert_found(detect(model, frame), OBJECTS, "stretch")


def test_dfine_bad_rows_never_become_boxes(tmp_path, frame):
    outputs = dfine_outputs(OBJECTS)
    outputs["labels"][0, 3:6] = [-1, 500, 2]
    outputs["scores"][0, 3:6] = 0.95
    outputs["boxes"][0, 5] = [np.nan, 0.1, 0.2, 0.3]
    model = planted_onnx(tmp_path / "bad.onnx", outputs, sized=["boxes"])
    found = detect(model, frame, labels=Labels({3: "three"}))
    assert [(d.class_id, d.label, round(d.score, 2)) for d in found] == [
        (500, "class 500", 0.95), (3, "three", 0.9), (17, "class 17", 0.8), (0, "class 0", 0.6)]
    assert all(np.isfinite(d.box).all() for d in found)
    assert len(detect(model, frame, max_detections=2)) == 2


def test_detr_bad_rows_never_become_boxes(tmp_path, frame):
    boxes, logits = detr_outputs(OBJECTS, queries=300, classes=80)
    boxes[0, 0] = [np.nan, 0.5, 0.1, 0.1]  # the first object's box is NaN
    logits[0, 1, :] = np.nan  # the second object's logits are NaN
    logits[0, 5, 7] = np.inf  # a background query with an infinite logit: score 1, a finite box
    boxes[0, 6] = [0.5, 0.5, -0.1, 0.2]  # a negative width
    logits[0, 6, 2] = 5.0
    model = planted_onnx(tmp_path / "bad.onnx", {"logits": logits, "pred_boxes": boxes})
    found = detect(model, frame, labels=Labels({0: "zero"}))
    assert [(d.class_id, d.label) for d in found] == [(7, "class 7"), (0, "zero")]
    assert all(np.isfinite(d.box).all() and 0 <= d.box[0] <= d.box[2] <= FRAME[0] for d in found)


def test_no_query_above_the_threshold_gives_an_empty_result(tmp_path, frame):
    assert len(detect(sigmoid_model(tmp_path), frame, score_threshold=0.95)) == 0
    boxes, logits = detr_outputs((), queries=100, classes=92, softmax=True)
    softmax = planted_onnx(tmp_path / "empty.onnx", {"logits": logits, "pred_boxes": boxes})
    assert len(detect(softmax, frame)) == 0


def test_shapes_that_are_not_detr_are_refused_with_a_reason(tmp_path):
    boxes, logits = detr_outputs(OBJECTS, queries=300, classes=80)
    uneven = planted_onnx(tmp_path / "uneven.onnx", {"logits": logits[:, :100], "pred_boxes": boxes})
    with pytest.raises(ValueError, match="same Q"):
        reading(uneven, decoder="detr")
    with pytest.raises(ValueError, match="anchors, not DETR queries"):
        reading(ULTRAFACE, decoder="detr")
    assert reading(ULTRAFACE).layout.name == "ssd"  # 4420 scores + boxes stay SSD's
    dfine = planted_onnx(tmp_path / "dfine.onnx", dfine_outputs(OBJECTS), sized=["boxes"])
    with pytest.raises(ValueError, match="not 3 outputs"):
        reading(dfine, decoder="detr")
    with pytest.raises(ValueError, match="needs 3 outputs"):
        reading(sigmoid_model(tmp_path), decoder="dfine")
    with pytest.raises(ValueError, match="dets and labels"):
        reading(sigmoid_model(tmp_path), decoder="rf-detr")


def test_an_input_no_layout_names_is_refused_before_the_run(tmp_path, frame):
    boxes, logits = detr_outputs(OBJECTS, queries=300, classes=80)
    model = planted_onnx(tmp_path / "mask.onnx", {"logits": logits, "pred_boxes": boxes},
                         extra_inputs={"pixel_mask": (1, 640)})
    with pytest.raises(ValueError, match="pixel_mask"):
        edgeinfer.Pipeline(model, frame, max_frames=1)
