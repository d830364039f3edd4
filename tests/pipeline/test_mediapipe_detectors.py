"""Every stride set MediaPipe's detectors use, each proven with MediaPipe's own model of that input size.

The models come out of the wheels that ship them (support/mediapipe_models.py: cached, never committed):
BlazeFace short range (128x128, strides 8/16/16/16), full range (192x192, stride 4 with one anchor a cell),
the palm detector full and lite (192x192, 8/16/16/16), the pose detector (224x224, 8/16/32/32/32) and the
back-camera BlazeFace (256x256, 16/32/32/32). None of them carries its anchors: the decoder derives each
scheme from the input size and the anchor count alone. Fed the input MediaPipe itself makes (its
ImageToTensor, reproduced), ``ssd-anchors`` must give MediaPipe's own detections — tests/data/
mediapipe_detections.json, made by MediaPipe 0.10.21's own graphs on the same photos (support/
mediapipe_reference.py) — every one of them, boxes and keypoints within a pixel, scores within 1e-3.
"""

from __future__ import annotations

import json

import cv2
import numpy as np
import pytest
from support.assets import IMAGES
from support.mediapipe_models import REFERENCE, mediapipe_input, mediapipe_model, sha256, square

import edgeinfer
from edgeinfer.pipeline.decoders import DecoderSettings
from edgeinfer.pipeline.preprocess import Transform
from edgeinfer.pipeline.tasks import read_model

RESULTS = json.loads(REFERENCE.read_text())["results"]

#: per detector: input size, the strides the scheme must come out as, anchors a layer, MediaPipe's score
#: threshold (its graph's min_score_thresh; the face solution's min_detection_confidence), its input's range
DETECTORS = {
    "face_short_range": (128, (8, 16, 16, 16), 2, 0.5, (-1.0, 1.0)),
    "face_full_range": (192, (4,), 1, 0.5, (-1.0, 1.0)),
    "palm_full": (192, (8, 16, 16, 16), 2, 0.5, (0.0, 1.0)),  # PalmDetectionCpu feeds [0, 1]
    "palm_lite": (192, (8, 16, 16, 16), 2, 0.5, (0.0, 1.0)),
    "pose": (224, (8, 16, 32, 32, 32), 2, 0.5, (-1.0, 1.0)),
    "face_back": (256, (16, 32, 32, 32), 2, 0.65, (-1.0, 1.0)),
}
#: how close edgeinfer's detections must be to MediaPipe's — pixels (boxes, keypoints) and score — fed the same
#: numbers ("squares") and fed MediaPipe's warp as another OpenCV makes it ("photos"; measured: see below)
EXACT = (0.01, 1e-4)
WARPED = (2.5, 0.02)  # measured 2.23 px (full range, a face of 100 px), 0.014 (a palm_lite false hit at 0.52)


def _detect(name: str, photo: str, kind: str):
    size, strides, per_layer, threshold, value_range = DETECTORS[name]
    model = mediapipe_model(name)
    assert sha256(model) == RESULTS[name]["model_sha256"], "the reference was made with another model"
    image = cv2.imread(str(IMAGES / photo))
    with edgeinfer.load(model, "xnnpack") as engine:
        reading = read_model(engine, task=None, decoder=None, labels=None,
                             settings=DecoderSettings(score_threshold=threshold))
        assert (reading.task, reading.layout.name) == ("detect", "ssd-anchors")
        scheme = reading.decoder.scheme
        assert (scheme.strides, set(scheme.per_layer)) == (strides, {per_layer})
        if kind == "squares":
            low, high = value_range
            tensor = square(image, size)[..., ::-1].astype(np.float32) * ((high - low) / 255.0) + low
            transform = Transform(1.0, 1.0, 0.0, 0.0, size, size)
        else:
            tensor, transform = mediapipe_input(image, size, value_range)
        engine.input_view(0)[0] = tensor
        engine.invoke()
        return reading.decoder(transform)


def _within(found, entry: dict) -> tuple[float, float]:
    """The largest pixel and score differences between ``found`` and MediaPipe's ``entry`` (same count first).
    edgeinfer keeps boxes and keypoints inside the image; MediaPipe does not: its are clipped to compare."""
    expected = entry["detections"]
    width, height = entry["image_wh"]
    assert len(found) == len(expected), (found.to_dict(), expected)
    pixels = scores = 0.0
    for detection, reference in zip(found, expected):
        x, y, w, h = reference["rel_xywh"]
        box = np.clip([x * width, y * height, (x + w) * width, (y + h) * height], 0, [width, height] * 2)
        points = np.clip(np.array(reference["rel_keypoints_xy"]) * (width, height), 0, (width, height))
        found_points = np.array([[k.x, k.y] for k in detection.keypoints])
        assert found_points.shape == points.shape
        pixels = max(pixels, np.abs(np.array(detection.box) - box).max(), np.abs(found_points - points).max())
        scores = max(scores, abs(detection.score - reference["score"]))
    return pixels, scores


CASES = [(name, kind, photo) for name in DETECTORS for kind in ("squares", "photos")
         for photo in RESULTS[name][kind]]


@pytest.mark.parametrize(("name", "kind", "photo"), CASES, ids=[f"{n}-{k}-{p}" for n, k, p in CASES])
def test_the_derived_anchors_give_mediapipes_own_detections(name, kind, photo):
    pixels, scores = _within(_detect(name, photo, kind), RESULTS[name][kind][photo])
    most_pixels, most_score = EXACT if kind == "squares" else WARPED
    assert pixels <= most_pixels and scores <= most_score, (pixels, scores)


def test_every_detector_finds_something_in_the_reference():
    """The photos prove each scheme only where MediaPipe finds something: every detector does, somewhere."""
    for name in DETECTORS:
        for kind in ("squares", "photos"):
            assert sum(len(p["detections"]) for p in RESULTS[name][kind].values()) >= 1, (name, kind)
