"""``ssd-anchors``: MediaPipe BlazeFace (short range) against MediaPipe 0.10.21's own results.

Two comparisons. The decoder alone, fed the input MediaPipe itself makes (its ImageToTensor: the whole image
scaled by 128 / its longer side about its centre, corner-aligned bilinear warp, black border): boxes,
scores and keypoints must agree to a pixel and a few thousandths — that checks the anchors, the decoding
and the weighted NMS. Then the whole pipeline, whose letterbox resizes with OpenCV's centre-aligned
bilinear: BlazeFace reads a 4-5x downscale without anti-aliasing, so the sampling phase alone moves its
boxes by a few pixels and its scores by a few hundredths (measured: the frontal faces' corners within
7.6 % of their size, IoU >= 0.86, scores within 0.034, keypoints 4 % of the size apart on average; the
squat photo's profile face and torso, both near the threshold in MediaPipe's output, move more: the face's
IoU is 0.69, the torso falls under the threshold).
"""

from __future__ import annotations

import json

import cv2
import numpy as np
import pytest
from support.assets import FACE_DETECTION, FACE_DETECTION_REFERENCE, IMAGES
from support.detr_models import planted_onnx, reading, write_frame
from support.mediapipe_models import mediapipe_input
from support.pipeline import ULTRAFACE

import edgeinfer
from edgeinfer.pipeline.decoders import DecoderSettings
from edgeinfer.pipeline.decoders.anchor_schemes import AnchorScheme, derive_scheme
from edgeinfer.pipeline.decoders.anchors import weighted_nms
from edgeinfer.pipeline.postprocess import FACE_KEYPOINT_NAMES
from edgeinfer.pipeline.preprocess import Transform
from edgeinfer.pipeline.tasks import read_model

REFERENCE = json.loads(FACE_DETECTION_REFERENCE.read_text())["results"][FACE_DETECTION.name]
#: the reference photos the shared assets hold (faces_1.jpg is not among them)
PHOTOS = [name for name in REFERENCE if (IMAGES / name).is_file()]


def _reference(name: str) -> tuple[list[dict], int, int]:
    entry = REFERENCE[name]
    width, height = entry["image_wh"]
    return entry["detections"], width, height


def _mediapipe_input(image: np.ndarray, size: int = 128) -> tuple[np.ndarray, Transform]:
    return mediapipe_input(image, size)


def _keypoints(found) -> np.ndarray:
    return np.array([[k.x, k.y] for k in found.keypoints])


def _iou(a, b) -> float:
    inter = max(0.0, min(a[2], b[2]) - max(a[0], b[0])) * max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union


def test_the_short_range_anchors_are_mediapipes():
    scheme = derive_scheme(128, 128, 896)
    assert scheme == AnchorScheme((8, 16, 16, 16), (2, 2, 2, 2))
    centres = scheme.centres(128, 128)
    assert centres.shape == (896, 2)
    # stride 8 first: 2 anchors a cell at the first cell's centre; then stride 16's 6 a cell
    assert centres[:2].tolist() == [[4.0, 4.0], [4.0, 4.0]] and centres[2].tolist() == [12.0, 4.0]
    assert centres[512:518].tolist() == [[8.0, 8.0]] * 6 and centres[-1].tolist() == [120.0, 120.0]


def test_weighted_nms_averages_the_overlapping_boxes_by_score():
    boxes = np.array([[0, 0, 10, 10], [1, 1, 11, 11], [50, 50, 60, 60], [5, 5, 5, 5]], np.float32)
    points = np.arange(4 * 2 * 2, dtype=np.float32).reshape(4, 2, 2)
    scores = np.array([0.9, 0.3, 0.8, 0.7], np.float32)
    kept, kept_points, kept_scores = weighted_nms(boxes, points, scores, 0.3, 10)
    assert kept_scores.tolist() == pytest.approx([0.9, 0.8, 0.7])  # the best score of each group
    assert kept[0].tolist() == pytest.approx([0.25, 0.25, 10.25, 10.25])  # (0.9 * 0 + 0.3 * 1) / 1.2
    np.testing.assert_allclose(kept_points[0], (points[0] * 0.9 + points[1] * 0.3) / 1.2, rtol=1e-6)
    assert kept[2].tolist() == [5, 5, 5, 5]  # a box with no area is its own group: no endless loop
    assert weighted_nms(boxes, points, scores, 0.3, 1)[0].shape == (1, 4)
    empty = weighted_nms(boxes[:0], points[:0], scores[:0], 0.3, 10)
    assert [a.shape for a in empty] == [(0, 4), (0, 2, 2), (0,)]


@pytest.mark.parametrize("name", PHOTOS)
def test_decoding_matches_mediapipe_on_its_own_input(name):
    expected, width, height = _reference(name)
    image = cv2.imread(str(IMAGES / name))
    with edgeinfer.load(FACE_DETECTION, "xnnpack") as engine:
        reading = read_model(engine, task=None, decoder=None, labels=None, settings=DecoderSettings())
        assert (reading.task, reading.layout.name) == ("detect", "ssd-anchors")
        tensor, transform = _mediapipe_input(image)
        engine.input_view(0)[0] = tensor
        engine.invoke()
        found = reading.decoder(transform)
    assert len(found) == len(expected), found.to_dict()
    for face, ref in zip(found, expected):
        assert face.score == pytest.approx(ref["score"], abs=0.005)
        assert face.box == pytest.approx(ref["px_xyxy"], abs=1.0)
        assert [k.name for k in face.keypoints] == list(FACE_KEYPOINT_NAMES)
        reference_points = np.array(ref["rel_keypoints_xy"]) * (width, height)
        assert np.abs(_keypoints(face) - reference_points).max() < 1.0


@pytest.mark.parametrize("name", PHOTOS)
def test_the_pipeline_finds_mediapipes_faces(name):
    expected, width, height = _reference(name)
    with edgeinfer.Pipeline(FACE_DETECTION, IMAGES / name, max_frames=1) as pipeline:
        results = [result.result for result in pipeline]
    assert len(results) == 1
    found = results[0]
    if name == "squat.bmp":  # a profile face at 0.71 and the torso at 0.68 in MediaPipe's own output
        assert len(found) >= 1 and _iou(found[0].box, expected[0]["px_xyxy"]) > 0.6
        return
    assert len(found) == len(expected), found.to_dict()
    for face, ref in zip(found, expected):
        side = ref["px_xyxy"][2] - ref["px_xyxy"][0]
        assert face.score == pytest.approx(ref["score"], abs=0.05)
        assert face.box == pytest.approx(ref["px_xyxy"], abs=0.08 * side)
        reference_points = np.array(ref["rel_keypoints_xy"]) * (width, height)
        error = np.abs(_keypoints(face) - reference_points)
        assert error.mean() < 0.06 * side and error.max() < 0.15 * side  # the ears' tragions move most
        assert all(k.score == 1.0 for k in face.keypoints)


def test_the_layout_is_guessed_and_leaves_ultraface_to_ssd():
    with edgeinfer.load(FACE_DETECTION, "xnnpack") as engine:
        assert read_model(engine, task="detect", decoder=None, labels=None,
                          settings=DecoderSettings()).layout.name == "ssd-anchors"
    with edgeinfer.load(ULTRAFACE, "onnxruntime") as engine:
        assert read_model(engine, task=None, decoder=None, labels=None,
                          settings=DecoderSettings()).layout.name == "ssd"
        with pytest.raises(ValueError, match=r"not fit.*(regressors|anchor)"):
            read_model(engine, task=None, decoder="ssd-anchors", labels=None, settings=DecoderSettings())


def test_a_threshold_nothing_passes_gives_no_faces():
    with edgeinfer.Pipeline(FACE_DETECTION, IMAGES / "grace_hopper.bmp", max_frames=1,
                            score_threshold=0.999) as pipeline:
        assert [len(result.result) for result in pipeline] == [0]


def _planted_blazeface(tmp_path, regressors, logits, name="blazeface.onnx"):
    outputs = {"regressors": regressors, "classificators": logits}
    return planted_onnx(tmp_path / name, outputs, size=(128, 128))


def test_bad_rows_never_become_faces(tmp_path):
    frame = write_frame(tmp_path / "frame.png")  # 960x540: letterboxed to 128x72 at rows 28-100
    centres = derive_scheme(128, 128, 896).centres(128, 128)
    regressors = np.zeros((1, 896, 16), np.float32)
    logits = np.full((1, 896, 1), -20.0, np.float32)
    face, twin = 680, 681  # two anchors of one stride-16 cell, centre (72, 56)
    regressors[0, face, :4], logits[0, face] = [2, -3, 40, 48], 3.0
    regressors[0, twin, :4], logits[0, twin] = [4, -1, 44, 50], 1.0
    regressors[0, 100, :4], logits[0, 100] = [np.nan, 0, 10, 10], 5.0
    regressors[0, 200, :4], logits[0, 200] = [0, 0, -10, 10], 5.0  # a negative width
    logits[0, 300] = np.nan
    model = _planted_blazeface(tmp_path, regressors, logits)
    with edgeinfer.Pipeline(model, frame, max_frames=1) as pipeline:
        found = next(iter(pipeline)).result
    assert len(found) == 1 and found[0].score == pytest.approx(1 / (1 + np.exp(-3.0)))
    weights = 1 / (1 + np.exp(-np.array([3.0, 1.0])))
    rows = regressors[0, [face, twin], :4]
    corners = np.concatenate([centres[[face, twin]] + rows[:, :2] - rows[:, 2:] / 2,
                              centres[[face, twin]] + rows[:, :2] + rows[:, 2:] / 2], axis=1)
    box = (corners * weights[:, None]).sum(axis=0) / weights.sum()  # input pixels
    expected = [box[0] * 7.5, (box[1] - 28) * 7.5, box[2] * 7.5, (box[3] - 28) * 7.5]
    assert found[0].box == pytest.approx(expected, abs=0.05)
    assert [k.name for k in found[0].keypoints] == list(FACE_KEYPOINT_NAMES)
    quiet = _planted_blazeface(tmp_path, regressors, np.full((1, 896, 1), -100.0, np.float32), "quiet.onnx")
    with edgeinfer.Pipeline(quiet, frame, max_frames=1) as pipeline:
        assert [len(result.result) for result in pipeline] == [0]


def test_outputs_that_are_no_anchor_scheme_are_refused(tmp_path):
    odd = _planted_blazeface(tmp_path, np.zeros((1, 896, 15), np.float32), np.zeros((1, 896, 1), np.float32))
    with pytest.raises(ValueError, match="regressors"):
        reading(odd, decoder="ssd-anchors")
    other = _planted_blazeface(tmp_path, np.zeros((1, 900, 16), np.float32), np.zeros((1, 900, 1), np.float32),
                               "900.onnx")
    with pytest.raises(ValueError, match="900 anchors is no MediaPipe anchor scheme"):
        reading(other, decoder="ssd-anchors")
    two = _planted_blazeface(tmp_path, np.zeros((1, 896, 16), np.float32), np.zeros((1, 896, 2), np.float32),
                             "two.onnx")
    with pytest.raises(ValueError, match="regressors"):
        reading(two, decoder="ssd-anchors")
