"""``yolox``: planted-output ONNX models (tests/support/detr_models.py) of a YOLOX head, raw and decoded, run
by ONNX Runtime through the real pipeline; and the layouts YOLOX must leave alone (YOLOv5, Ultralytics)."""

from __future__ import annotations

import numpy as np
import pytest
from support.detr_models import OBJECTS, assert_found, detect, planted_onnx, reading, write_frame, yolox_output
from support.pipeline import MODELS

import edgeinfer
from edgeinfer.pipeline.decoders import DecoderSettings
from edgeinfer.pipeline.labels import Labels
from edgeinfer.pipeline.preprocess import Transform
from edgeinfer.pipeline.tasks import read_model

COCO = Labels({i: f"c{i}" for i in range(80)})


@pytest.fixture
def frame(tmp_path):
    return write_frame(tmp_path / "frame.png")


def yolox_model(tmp_path, *, decoded: bool, objects=OBJECTS, name: str = "yolox.onnx", **kwargs):
    return planted_onnx(tmp_path / name, {"output": yolox_output(objects, decoded=decoded, **kwargs)})


def decode_once(model):
    """The decoder built for ``model`` and its detections of one invoke, in input pixels."""
    with edgeinfer.load(model, "onnxruntime") as engine:
        chosen = read_model(engine, task=None, decoder=None, labels=None, settings=DecoderSettings())
        engine.invoke()
        return chosen.decoder, chosen.decoder(Transform(1.0, 1.0, 0.0, 0.0, 640, 640))


@pytest.mark.parametrize("decoded", [False, True], ids=["raw", "decoded"])
@pytest.mark.parametrize("resize", ["letterbox", "stretch"])
def test_yolox_objects_come_out_at_their_places(tmp_path, frame, decoded, resize):
    model = yolox_model(tmp_path, decoded=decoded)
    chosen = reading(model)
    assert (chosen.task, chosen.layout.name) == ("detect", "yolox")
    # YOLOX's preproc: 0-255 BGR pixels, aspect kept, the image at the top-left of a 114 border
    assert (chosen.resize, chosen.mean, chosen.std) == ("letterbox", 0.0, 1.0)
    assert (chosen.channels, chosen.pad, chosen.pad_value) == ("bgr", "corner", 114)
    # each object was planted twice (its cell and the next, weaker): NMS leaves one; through the corner letterbox
    # the input's rows 0-360 are the frame, so its boxes come back by YOLOX's ratio alone (and clipped)
    assert_found(detect(model, frame, resize=resize), OBJECTS, resize, pad="corner")


@pytest.mark.parametrize("pad", ["centre", "corner"])
def test_yolox_boxes_follow_the_border_they_were_fed_with(tmp_path, frame, pad):
    """Told where the border goes (--pad), the boxes come back through that letterbox, not the family's."""
    model = yolox_model(tmp_path, decoded=False)
    assert_found(detect(model, frame, pad=pad), OBJECTS, "letterbox", pad=pad)


@pytest.mark.parametrize("decoded", [False, True], ids=["raw", "decoded"])
def test_raw_and_decoded_heads_are_told_apart_from_the_values(tmp_path, decoded):
    decoder, found = decode_once(yolox_model(tmp_path, decoded=decoded))
    assert decoder.decoded is decoded
    assert [d.box for d in found] == [pytest.approx(o.box, abs=0.01) for o in OBJECTS]
    # a frame where nothing is found says the same: the background rows decide, not the objects
    decoder, found = decode_once(yolox_model(tmp_path, decoded=decoded, objects=(), name="empty.onnx"))
    assert decoder.decoded is decoded and len(found) == 0


def test_class_names_must_match_the_columns(tmp_path, frame):
    model = yolox_model(tmp_path, decoded=False)
    found = detect(model, frame, labels=COCO)
    assert [d.label for d in found] == ["c3", "c17", "c0"]
    with pytest.raises(ValueError, match="not 4 box values, objectness and 5 class scores"):
        edgeinfer.Pipeline(model, frame, decoder="yolox", labels=Labels(dict(enumerate("abcde"))))


def test_bad_rows_never_become_boxes(tmp_path, frame):
    output = yolox_output(OBJECTS, decoded=False)
    hot = np.flatnonzero(output[0, :, 4] > 0.5)  # the planted rows: each object's cell and the next
    output[0, hot[0], 0] = np.nan  # the first object's own cell has a NaN centre: its weaker twin stands
    output[0, 100, 4:6] = [0.99, np.nan]  # NaN class score
    output[0, 101, 4] = np.nan  # NaN objectness
    output[0, 102, :6] = [0.5, 0.5, 0.0, 0.0, 0.99, 0.99]  # finite, 8 x 8 px: a box like any other
    model = planted_onnx(tmp_path / "bad.onnx", {"output": output})
    found = detect(model, frame)
    assert len(found) == 4 and all(np.isfinite(d.box).all() for d in found)
    assert sorted(round(d.score, 2) for d in found) == [0.6, 0.8, 0.81, 0.98]  # the twin: 0.9 x 0.9
    assert len(detect(model, frame, score_threshold=0.999)) == 0


def test_yolox_leaves_yolov5_and_ultralytics_models_alone(tmp_path):
    rows = yolox_output(OBJECTS, decoded=True)
    yolov5 = planted_onnx(tmp_path / "yolov5.onnx", {"output": np.concatenate([rows, rows, rows], axis=1)})
    assert reading(yolov5).layout.name == "yolov5"  # 3 anchors a cell: 25200 rows
    ultralytics = planted_onnx(tmp_path / "yolov8.onnx", {"output0": np.zeros((1, 84, 8400), np.float32)})
    assert reading(ultralytics).layout.name == "yolo"  # [1, 4+nc, N]
    assert reading(MODELS / "yolo_fall_detection.onnx").layout.name == "yolo"
    assert reading(MODELS / "yolo11n-pose.onnx").layout.name == "yolo-pose"
    with pytest.raises(ValueError, match="no objectness"):
        reading(MODELS / "yolo_fall_detection.onnx", decoder="yolox")
    with pytest.raises(ValueError, match=r"\[1, 8400, 5\+nc\]"):
        reading(ultralytics, decoder="yolox")
    small = planted_onnx(tmp_path / "small.onnx", {"output": rows[:, :2100]}, size=(320, 320))
    assert reading(small).layout.name == "yolox"  # 2100 rows: the grids of a 320x320 input
