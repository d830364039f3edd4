"""The detectors teams bring, against their own implementation's output (``../shared/assets/references``):
Ultralytics YOLO (detect, pose) read from the model's own metadata, and the Coral SSD against LiteRT; then a
YOLO person detector counting people across a line, end to end."""

from __future__ import annotations

import json
import subprocess
import sys

import cv2
import numpy as np
import pytest
from support import scenes
from support.assets import ASSETS, IMAGES, LABELS, MODELS

from edgeinfer import Pipeline
from edgeinfer.pipeline.decoders import DecoderSettings
from edgeinfer.pipeline.decoders.base import box_iou
from edgeinfer.pipeline.labels import Labels
from edgeinfer.pipeline.preprocess import Preprocessor, Transform
from edgeinfer.pipeline.tasks import read_model

YOLO_DETECT = MODELS / "yolo_fall_detection.onnx"
YOLO_POSE = MODELS / "yolo11n-pose.onnx"
COCO_SSD = MODELS / "mobilenet_ssd_v2_coco_quant_postprocess.tflite"
REFERENCES = ASSETS / "references"
#: the settings the Ultralytics references were made with: predict(conf=0.25, iou=0.7)
ULTRALYTICS_SETTINGS = {"score_threshold": 0.25, "iou_threshold": 0.7}



def _reference(name: str) -> dict:
    return json.loads((REFERENCES / name).read_text())["detections"]


def _decode_image(model, image: str, **options):
    """The pipeline's answer for one still image, decoded at full size as the reference implementations do."""
    with Pipeline(model, IMAGES / image, reduced_decode=False, **options) as pipeline:
        (result,) = [r.result for r in pipeline]
        return result, pipeline.options.task


def _match(found, expected: dict):
    """Our detection of ``expected``'s class with the greatest IoU with its box."""
    same = [d for d in found if d.label == expected["label"]]
    assert same, f"no {expected['label']} found for {expected}"
    ious = box_iou(np.array(expected["box_xyxy_px"], np.float32), np.array([d.box for d in same], np.float32))
    return same[int(ious.argmax())], float(ious.max())


@pytest.mark.parametrize("model", [YOLO_DETECT, YOLO_POSE], ids=["detect", "pose"])
def test_ultralytics_yolo_matches_ultralytics_predict_reading_the_model_alone(model):
    """No task, no labels: the task, the class names, the letterbox and the [0, 1] input come from the model's
    metadata; every box Ultralytics found is found, of the same class, where it put it."""
    reference = _reference(f"{model.stem}_ultralytics.json")
    for image, expected in reference.items():
        found, task = _decode_image(model, image, **ULTRALYTICS_SETTINGS)
        assert task == ("pose" if model == YOLO_POSE else "detect")
        assert len(found) == len(expected), (image, found.to_dict())
        for want in expected:
            got, iou = _match(found, want)
            # the same letterbox (grey 114 pad), the same decode: the same numbers, to the references' rounding
            assert iou > 0.99 and np.abs(np.subtract(got.box, want["box_xyxy_px"])).max() < 0.1, (image, want, got)
            assert got.score == pytest.approx(want["score"], abs=0.002)
            if "keypoints_xy_conf" in want:
                _check_keypoints(got, np.array(want["keypoints_xy_conf"]), image)


def _check_keypoints(got, want: np.ndarray, image: str) -> None:
    mine = np.array([[k.x, k.y, k.score] for k in got.keypoints])
    assert [k.name for k in got.keypoints][:3] == ["nose", "left_eye", "right_eye"]
    seen = want[:, 2] > 0.0
    error = np.linalg.norm(mine[seen, :2] - want[seen, :2], axis=1)
    assert error.max() < 0.5, (image, error.round(1))
    assert np.abs(mine[:, 2] - want[:, 2]).max() < 0.002


def test_the_coral_ssd_decodes_exactly_what_litert_gave_on_the_same_input():
    """The reference resized with PIL; fed the same pixels the decoder gives LiteRT's boxes and scores."""
    from PIL import Image

    import edgeinfer

    labels = Labels.load(LABELS / "coco_labels.txt")
    with edgeinfer.load(COCO_SSD, "xnnpack") as engine:
        reading = read_model(engine, task=None, decoder=None, labels=labels,
                             settings=DecoderSettings(score_threshold=0.3))
        assert (reading.task, reading.layout.name, reading.resize) == ("detect", "tflite-ssd", "stretch")
        for image, expected in _reference("mobilenet_ssd_v2_coco_quant_postprocess_litert.json").items():
            photo = Image.open(IMAGES / image).convert("RGB")
            rgb = np.asarray(photo.resize((300, 300), Image.BILINEAR))
            Preprocessor(engine.inputs[0], (300, 300), resize="stretch")(np.ascontiguousarray(rgb[:, :, ::-1]),
                                                                         engine.input_view(0))
            engine.invoke()
            found = reading.decoder(Transform(300 / photo.width, 300 / photo.height, 0, 0, photo.width, photo.height))
            assert len(found) == len(expected)
            for want in expected:
                got, iou = _match(found, want)
                assert iou > 0.99 and got.score == pytest.approx(want["score"], abs=0.01), (image, want, got)


def test_the_coral_ssd_through_the_pipeline_finds_what_litert_found():
    """Through the pipeline (OpenCV's resize, not PIL's): the same objects, boxes within a few pixels."""
    for image, expected in _reference("mobilenet_ssd_v2_coco_quant_postprocess_litert.json").items():
        found, task = _decode_image(COCO_SSD, image, labels=LABELS / "coco_labels.txt", score_threshold=0.25)
        assert task == "detect"
        for want in expected:
            # OpenCV's bilinear shrink of a 1352x900 photo to 300x300 samples other pixels than PIL's filter:
            # the same object, its box within a few pixels (small boxes: IoU says little) or overlapping well
            got, iou = _match(found, want)
            assert iou > 0.65 or np.abs(np.subtract(got.box, want["box_xyxy_px"])).max() < 8, (image, want, got)


def test_explicit_options_win_over_what_the_model_says(tmp_path):
    labels = tmp_path / "labels.txt"
    labels.write_text("upright\nfallen\n")
    found, _ = _decode_image(YOLO_DETECT, "squat.bmp", labels=labels, **ULTRALYTICS_SETTINGS)
    assert [d.label for d in found] == ["upright"]
    with pytest.raises(ValueError, match="decoder 'yolo' does not fit"):
        Pipeline(YOLO_POSE, IMAGES / "squat.bmp", decoder="yolo")  # 56 values a row are not 4 + 1 class
    with pytest.raises(ValueError, match=r"no output layout edgeinfer knows fits .* for task 'segment'"):
        Pipeline(YOLO_POSE, IMAGES / "squat.bmp", task="segment")


def test_a_yolo_person_detector_counts_people_across_a_line_end_to_end(tmp_path):
    """``edgeinfer run`` on a pose model with a line and nothing else: the task (pose, boxes with keypoints)
    from its metadata, tracked, counted; one person walks in, one walks out."""
    clip = scenes.make_people_clip(tmp_path / "people.avi")
    line = "door=" + ",".join(str(v) for v in scenes.PEOPLE_LINE)
    done = subprocess.run([sys.executable, "-m", "edgeinfer", "run", str(YOLO_POSE), "--source", str(clip),
                           "--line", line, "--score-threshold", "0.4", "--json"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    lines = [json.loads(text) for text in done.stdout.splitlines()]
    summary = lines[-1]
    assert summary["type"] == "summary" and summary["analytics"]["lines"]["door"] == scenes.PEOPLE_TRUTH
    tracked = [d for r in lines[:-1] for d in r["result"] if "track_id" in d]
    assert tracked and all(len(d["keypoints"]) == 17 for d in tracked)  # tracking kept each person's keypoints
    assert {d["label"] for d in tracked} == {"person"}


def test_zero_candidates_is_an_empty_result_not_an_error(tmp_path):
    blank = tmp_path / "blank.png"
    cv2.imwrite(str(blank), np.full((480, 640, 3), 128, np.uint8))
    with Pipeline(YOLO_POSE, blank, score_threshold=0.25) as pipeline:
        (result,) = [r.result for r in pipeline]
    assert len(result) == 0 and result.to_dict() == []


def _run_cli(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "edgeinfer", "run", *map(str, args)], capture_output=True,
                          text=True, timeout=300)


def test_edgeinfer_run_says_how_it_read_the_model_and_takes_a_decoder_and_the_normalisation():
    told = _run_cli(YOLO_POSE, "--source", IMAGES / "squat.bmp")
    assert told.returncode == 0, told.stderr
    assert "note: task pose (the model's metadata), outputs read as yolo-pose" in told.stderr
    assert "frames letterbox (centred, 114), RGB, (pixel - 0,0,0) / 255,255,255" in told.stderr
    wrong = _run_cli(YOLO_POSE, "--source", IMAGES / "squat.bmp", "--decoder", "yolo")
    assert wrong.returncode == 1 and wrong.stderr.count("\n") == 1
    assert "decoder 'yolo' does not fit" in wrong.stderr and "output0 [1, 56, 8400]" in wrong.stderr
    # a float model that states no normalisation: --mean/--std are what it was trained with, or not
    float_model = MODELS / "mobilenet_v2_1.0_224_float.onnx"
    top = {}
    for name, values in (("right", ("128", "128")), ("wrong", ("0,0,0", "1,1,1"))):
        done = _run_cli(float_model, "--source", IMAGES / "parrot.jpg", "--labels", LABELS / "imagenet_labels.txt",
                        "--mean", values[0], "--std", values[1], "--json")
        assert done.returncode == 0, done.stderr
        top[name] = json.loads(done.stdout.splitlines()[0])["result"][0]
    assert top["right"]["label"] == "macaw" and top["right"]["score"] > 0.9
    assert top["wrong"]["score"] < top["right"]["score"] - 0.1 or top["wrong"]["label"] != "macaw"
    refused = _run_cli(float_model, "--source", IMAGES / "parrot.jpg", "--std", "1,0,1")
    assert refused.returncode == 2 and "none zero" in refused.stderr
