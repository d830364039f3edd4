"""Task decoders on the real models and shared photos, plus their geometry on constructed tensors."""

from __future__ import annotations

import csv
import json

import cv2
import numpy as np
import pytest
from support.assets import IMAGENET_LABELS, MOBILENET_V2
from support.pipeline import (
    DEEPLAB,
    GRACE_HOPPER_FACE,
    IMAGES,
    MOVENET,
    MOVENET_ONNX,
    MOVENET_REFERENCE,
    PASCAL_DOG,
    PASCAL_LABELS,
    ULTRAFACE,
)

import edgeinfer
from edgeinfer.pipeline.decoders import DecoderInput, DecoderSettings, LayoutMismatch, get_layout
from edgeinfer.pipeline.decoders.base import nms
from edgeinfer.pipeline.decoders.classify import ClassificationDecoder
from edgeinfer.pipeline.labels import Labels
from edgeinfer.pipeline.postprocess import KEYPOINT_NAMES, class_scores, top_k
from edgeinfer.pipeline.preprocess import Preprocessor, Transform
from edgeinfer.runtime.metadata import ModelMetadata
from edgeinfer.runtime.model import TensorSpec


def _decoder(layout, outputs, specs, input_size, labels=None, **settings):
    """The named layout's decoder over these outputs (what the pipeline builds from an engine)."""
    source = DecoderInput(list(outputs), tuple(specs), input_size, labels, DecoderSettings(**settings),
                          ModelMetadata())
    return get_layout(layout).build(source)


def _run(engine, image, resize, **options):
    pre = Preprocessor(engine.inputs[0], (image.shape[1], image.shape[0]), resize=resize, **options)
    transform = pre(image, engine.input_view(0))
    engine.invoke()
    return transform


@pytest.mark.parametrize("delegate", ["onnxruntime", "openvino"])
@pytest.mark.parametrize("resize", ["stretch", "letterbox"])
def test_ultraface_finds_grace_hoppers_face(delegate, resize):
    image = cv2.imread(str(IMAGES / "grace_hopper.bmp"))
    with edgeinfer.load(ULTRAFACE, delegate) as engine:
        transform = _run(engine, image, resize, mean=127.0, std=128.0)
        outputs = [engine.output_view(i) for i in range(2)]
        found = _decoder("ssd", outputs, engine.outputs, (320, 240))(transform)
    assert len(found) == 1, found.to_dict()
    face = found[0]
    assert face.score > 0.99 and face.class_id == 1
    assert face.box == pytest.approx(GRACE_HOPPER_FACE, abs=12)  # source pixels, through the letterbox


def _movenet_reference(width, height):
    with MOVENET_REFERENCE.open() as handle:
        rows = list(csv.DictReader(handle))
    return np.array([[float(r["keypoint_x"]) * width, float(r["keypoint_y"]) * height] for r in rows])


@pytest.mark.parametrize(("model", "delegate"), [(MOVENET, "xnnpack"), (MOVENET_ONNX, "onnxruntime")])
@pytest.mark.parametrize("resize", ["stretch", "letterbox"])
def test_movenet_keypoints_match_the_reference(model, delegate, resize):
    image = cv2.imread(str(IMAGES / "squat.bmp"))
    height, width = image.shape[:2]
    with edgeinfer.load(model, delegate) as engine:
        transform = _run(engine, image, resize)
        people = _decoder("movenet", [engine.output_view(0)], engine.outputs, (192, 192))(transform)
    assert len(people) == 1  # single-pose: a list of one
    pose = people[0]
    assert [k.name for k in pose.keypoints] == list(KEYPOINT_NAMES)
    found = np.array([[k.x, k.y] for k in pose.keypoints])
    error = np.linalg.norm(found - _movenet_reference(width, height), axis=1) / max(width, height)
    assert error.mean() < 0.025 and error.max() < 0.06, error.round(3)
    assert 0.3 < pose.score <= 1.0
    assert pose.keypoint("left_ankle").y > pose.keypoint("left_hip").y > pose.keypoint("left_shoulder").y  # standing
    assert pose.box[1] <= min(k.y for k in pose.keypoints) and pose.box[3] >= max(k.y for k in pose.keypoints)


def _iou(a, b):
    return (a & b).sum() / max((a | b).sum(), 1)


def test_deeplab_mask_overlaps_the_dog_mask():
    image = cv2.imread(str(IMAGES / "dog_segmentation.bmp"))
    # the reference is a trimap: 0 = the dog, 1 = background, 2 = the uncertain border
    reference = cv2.imread(str(IMAGES / "dog_segmentation_mask.bmp"), cv2.IMREAD_GRAYSCALE)
    labels = Labels.load(PASCAL_LABELS)
    with edgeinfer.load(DEEPLAB, "xnnpack") as engine:
        transform = _run(engine, image, "letterbox")
        result = _decoder("semantic", [engine.output_view(0)], engine.outputs, (513, 513), labels)(transform)
    assert result.mask.shape == image.shape[:2] and result.mask.dtype == np.uint8
    assert PASCAL_DOG in result.class_ids and "dog" in result.labels
    sure = reference != 2
    dog = result.class_mask(PASCAL_DOG)
    assert _iou(dog & sure, (reference == 0) & sure) > 0.8
    assert _iou(dog & sure, (reference == 1) & sure) < 0.05
    assert sum(result.fractions) == pytest.approx(1.0)


def test_segmentation_maps_back_through_a_letterbox():
    """A 100x50 frame letterboxed into 64x64: rows 16..47 of the model map hold the frame."""
    model_map = np.zeros((1, 64, 64), np.int64)
    model_map[0, 16:48, 32:64] = 5  # the right half of the frame
    transform = Transform(0.64, 0.64, 0.0, 16.0, 100, 50)
    result = _decoder("semantic", [model_map], [TensorSpec("m", (1, 64, 64), "int64")], (64, 64))(transform)
    assert result.mask.shape == (50, 100)
    assert (result.mask[:, 52:] == 5).all() and (result.mask[:, :48] == 0).all()
    assert result.class_ids == (0, 5) and result.fractions[1] == pytest.approx(0.5, abs=0.03)


def test_classification_decoder_matches_top_k_and_allocates_nothing_big():
    labels = Labels.load(IMAGENET_LABELS)
    image = cv2.imread(str(IMAGES / "parrot.jpg"))
    with edgeinfer.load(MOBILENET_V2, "xnnpack") as engine:
        _run(engine, image, "stretch")
        decoder = ClassificationDecoder(engine.output_view(0), engine.outputs[0], labels, k=3)
        found = decoder()
        expected = top_k(class_scores(engine.output_view(0), engine.outputs[0]), 3, labels)
    assert [c.index for c in found][:1] == [c.index for c in expected][:1] == [89]
    assert found[0].label == "macaw" and [c.score for c in found] == pytest.approx([c.score for c in expected])


def test_classification_decoder_softmaxes_logits():
    logits = np.array([[2.0, 1.0, 0.1, -3.0]], np.float32)
    found = ClassificationDecoder(logits, TensorSpec("logits", (1, 4), "float32"), None, k=2)()
    expected = np.exp(logits[0]) / np.exp(logits[0]).sum()
    assert [c.index for c in found] == [0, 1] and found[0].label == "0"
    assert [c.score for c in found] == pytest.approx(expected[:2].tolist(), rel=1e-5)


def test_an_unsigned_integer_output_with_no_scale_is_read_as_shares_not_softmaxed():
    """A quantised softmax whose scale the model does not carry (inspect_model notes it): its steps are
    shares of their sum; a softmax of the raw integers would give the top class ~1.0 whatever they were."""
    steps = np.array([[0, 64, 192, 0]], np.uint8)
    spec = TensorSpec("probabilities", (1, 4), "uint8")  # no scale, no zero point
    found = ClassificationDecoder(steps, spec, None, k=2)()
    assert [(c.index, c.score) for c in found] == [(2, pytest.approx(0.75)), (1, pytest.approx(0.25))]
    assert class_scores(steps, spec).tolist() == pytest.approx([0.0, 0.25, 0.75, 0.0])
    assert ClassificationDecoder(np.zeros((1, 4), np.uint8), spec, None, k=1)()[0].score == 0.0  # nothing: 0


def test_nms_suppresses_overlaps_within_a_class_only():
    boxes = np.array([[0, 0, 10, 10], [1, 1, 11, 11], [0, 0, 10, 10], [50, 50, 60, 60]], np.float32)
    scores = np.array([0.9, 0.8, 0.7, 0.6], np.float32)
    classes = np.array([1, 1, 2, 1])
    assert nms(boxes, scores, classes, 0.5, 10) == [0, 2, 3]
    assert nms(boxes, scores, classes, 0.5, 2) == [0, 2]
    assert nms(boxes, scores, np.ones(4, int), 0.99, 10) == [0, 1, 3]  # only the identical box goes


def test_ssd_decoder_thresholds_and_maps_boxes():
    scores = np.array([[[0.1, 0.9], [0.6, 0.4], [0.2, 0.8]]], np.float32)
    boxes = np.array([[[0.25, 0.5, 0.75, 1.0], [0, 0, 1, 1], [0.25, 0.5, 0.75, 0.98]]], np.float32)
    specs = (TensorSpec("scores", scores.shape, "float32"), TensorSpec("boxes", boxes.shape, "float32"))
    # 200x100 source letterboxed into a 100x100 input: scale 0.5, 25 px bands above and below
    transform = Transform(0.5, 0.5, 0.0, 25.0, 200, 100)
    found = _decoder("ssd", [scores, boxes], specs, (100, 100), Labels({1: "face"}))(transform)
    assert len(found) == 1  # box 2 overlaps box 0 and scores lower; box 1 is below the threshold
    assert found[0].label == "face" and found[0].score == pytest.approx(0.9)
    assert found[0].box == pytest.approx((50.0, 50.0, 150.0, 100.0))  # clipped to the frame
    json.dumps(found.to_dict())


def test_tflite_postprocessed_layout():
    boxes = np.array([[[0.1, 0.2, 0.5, 0.6], [0.0, 0.0, 0.2, 0.2], [0, 0, 0, 0]]], np.float32)  # y1, x1, y2, x2
    classes = np.array([[17.0, 3.0, 0.0]], np.float32)
    scores = np.array([[0.4, 0.85, 0.0]], np.float32)
    count = np.array([2.0], np.float32)
    specs = tuple(TensorSpec(n, a.shape, "float32") for n, a in
                  (("boxes", boxes), ("classes", classes), ("scores", scores), ("count", count)))
    decoder = _decoder("tflite-ssd", [boxes, classes, scores, count], specs, (300, 300), score_threshold=0.3)
    found = decoder(Transform(1.0, 1.0, 0.0, 0.0, 300, 300))
    assert [d.class_id for d in found] == [3, 17]
    assert found[1].box == pytest.approx((60.0, 30.0, 180.0, 150.0))


def test_a_model_that_does_not_fit_a_layout_says_why():
    with edgeinfer.load(MOBILENET_V2, "xnnpack") as engine:
        outputs = [engine.output_view(0)]
        for layout, reason in (("ssd", "needs 2 outputs"), ("tflite-ssd", "needs 4 outputs"),
                               ("movenet", "MoveNet 1x1x17x3"), ("semantic", "class map"),
                               ("yolo", "candidate"), ("yolo-end2end", "rows")):
            with pytest.raises(LayoutMismatch, match=reason):
                _decoder(layout, outputs, engine.outputs, (224, 224))


def test_nan_or_inf_in_an_output_is_never_a_box():
    scores = np.array([[[0.1, 0.9], [0.0, np.nan], [0.1, 0.95]]], np.float32)
    boxes = np.array([[[0.1, 0.1, 0.2, 0.2], [0.5, 0.5, 0.6, 0.6], [np.inf, 0.0, 1.0, 1.0]]], np.float32)
    specs = (TensorSpec("scores", scores.shape, "float32"), TensorSpec("boxes", boxes.shape, "float32"))
    found = _decoder("ssd", [scores, boxes], specs, (100, 100))(Transform(1.0, 1.0, 0.0, 0.0, 100, 100))
    assert [d.box for d in found] == [pytest.approx((10.0, 10.0, 20.0, 20.0))]
    people = _decoder("movenet", [np.full((1, 1, 17, 3), np.nan, np.float32)],
                      [TensorSpec("p", (1, 1, 17, 3), "float32")], (192, 192))(Transform(1, 1, 0, 0, 192, 192))
    assert len(people) == 0


def test_results_are_frozen_and_serialise():
    people = _decoder("movenet", [np.full((1, 1, 17, 3), 0.5, np.float32)], [TensorSpec("p", (1, 1, 17, 3), "float32")],
                      (192, 192))(Transform(1.0, 1.0, 0.0, 0.0, 192, 192))
    data = json.loads(json.dumps(people.to_dict()))
    assert data[0]["score"] == 0.5 and data[0]["label"] == "person"
    assert data[0]["keypoints"][0] == {"name": "nose", "x": 96.0, "y": 96.0, "score": 0.5}
    with pytest.raises(AttributeError):
        people[0].score = 1.0  # type: ignore[misc]


@pytest.mark.parametrize("resize", ["stretch", "letterbox", "crop"])
def test_transforms_map_model_pixels_back_to_the_frame(resize):
    """A white square in a 400x200 frame lands where the recorded transform says, both ways."""
    frame = np.zeros((200, 400, 3), np.uint8)
    frame[80:120, 180:220] = 255
    spec = TensorSpec("x", (1, 100, 100, 3), "uint8", "NHWC")
    pre = Preprocessor(spec, (400, 200), resize=resize)
    model_input = np.zeros(spec.shape, np.uint8)
    transform = pre(frame, model_input)
    ys, xs = np.nonzero(model_input[0, :, :, 0] > 128)
    x0, y0 = transform.to_source(xs.min(), ys.min())
    x1, y1 = transform.to_source(xs.max() + 1, ys.max() + 1)
    assert (x0, y0, x1, y1) == pytest.approx((180, 80, 220, 120), abs=5)
    if resize == "letterbox":  # padding above and below, none at the sides
        assert transform.pad_y == 25 and transform.pad_x == 0 and (model_input[0, :20] == 114).all()
    if resize == "crop":  # the centre 200x200 of the frame fills the input
        assert transform.to_source(0, 0) == pytest.approx((100.0, 0.0))
