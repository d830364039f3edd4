"""``ssd-anchors``' schemes: derived from the input size and the anchor count, or stated in metadata.yaml.

Planted models (real ONNX graphs whose outputs are constants) put one face at a chosen anchor; the decoded box
lands at that anchor's centre only when the scheme is the right one. The real detectors are proven in
test_mediapipe_detectors.py.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest
from support.detr_models import planted_onnx, reading, write_frame

import edgeinfer
from edgeinfer.errors import AnchorOptionsError
from edgeinfer.pipeline.decoders.anchor_schemes import AnchorScheme, derive_scheme, scheme_from_options


def _planted(tmp_path, size: int, count: int, anchor: int, box=(0.0, 0.0, 30.0, 40.0), name="anchors.onnx"):
    """A BlazeFace-shaped model of a ``size`` x ``size`` input and ``count`` anchors: one face at ``anchor``."""
    regressors = np.zeros((1, count, 16), np.float32)
    logits = np.full((1, count, 1), -20.0, np.float32)
    regressors[0, anchor, :4], logits[0, anchor] = box, 4.0
    folder = tmp_path / name.removesuffix(".onnx")
    folder.mkdir()
    return planted_onnx(folder / name, {"regressors": regressors, "classificators": logits}, size=(size, size))


def _square_frame(tmp_path, size: int):
    import cv2

    path = tmp_path / f"frame{size}.png"
    cv2.imwrite(str(path), np.full((size, size, 3), 90, np.uint8))  # the model's own size: no resize, no border
    return path


def _one_face(model, frame):
    with edgeinfer.Pipeline(model, frame, max_frames=1) as pipeline:
        found = next(iter(pipeline)).result
    assert len(found) == 1
    return found[0]


@pytest.mark.parametrize(("size", "count", "strides", "per_layer"), [
    (128, 896, (8, 16, 16, 16), 2),  # BlazeFace short range
    (192, 2304, (4,), 1),  # BlazeFace full range
    (192, 2016, (8, 16, 16, 16), 2),  # the palm detector
    (224, 2254, (8, 16, 32, 32, 32), 2),  # the pose detector
    (256, 896, (16, 32, 32, 32), 2),  # the back-camera BlazeFace
])
def test_each_mediapipe_detectors_scheme_comes_from_its_input_and_count(size, count, strides, per_layer):
    scheme = derive_scheme(size, size, count)
    assert (scheme.strides, scheme.per_layer) == (strides, (per_layer,) * len(strides))
    assert scheme.centres(size, size).shape == (count, 2)


def test_the_back_camera_blazeface_is_decoded(tmp_path):
    """256x256 with 896 anchors (strides 16/32/32/32), refused before as no known scheme."""
    # the stride-16 map's 16x16 cells of 2 anchors come first (512), then the stride-32 map's 8x8 cells of 6
    model = _planted(tmp_path, 256, 896, 512 + 6 * 9 + 3, box=(2.0, -1.0, 30.0, 40.0))  # cell 9: column 1, row 1
    face = _one_face(model, _square_frame(tmp_path, 256))
    assert face.box == pytest.approx([48 + 2 - 15, 48 - 1 - 20, 48 + 2 + 15, 48 - 1 + 20], abs=0.01)
    assert face.score == pytest.approx(1 / (1 + np.exp(-4.0)))


def test_an_anchor_scheme_stated_in_metadata_yaml_is_used(tmp_path):
    # strides 8/16 with two aspect ratios and the interpolated scale: 3 anchors a layer, offset 0 — no
    # MediaPipe-shaped scheme gives 960 anchors at 128, and none puts them at the cells' corners
    stated = AnchorScheme((8, 16), (3, 3), (0.0, 0.0))
    assert stated.count(128, 128) == 960
    with pytest.raises(ValueError, match="960 anchors is no MediaPipe anchor scheme"):
        derive_scheme(128, 128, 960)
    model = _planted(tmp_path, 128, 960, 768 + 3 * 18)  # the stride-16 map's cell 18: column 2, row 2
    (model.parent / "metadata.yaml").write_text(
        "anchors:\n  strides: [8, 16]\n  aspect_ratios: [1.0, 2.0]\n  interpolated_scale_aspect_ratio: 1.0\n"
        "  anchor_offset_x: 0.0\n  anchor_offset_y: 0.0\n  min_scale: 0.1484375\n  max_scale: 0.75\n")
    assert reading(model).decoder.scheme == stated
    face = _one_face(model, _square_frame(tmp_path, 128))
    assert face.box == pytest.approx([32 - 15, 32 - 20, 32 + 15, 32 + 20], abs=0.01)  # the cell's corner
    with edgeinfer.load(model, "onnxruntime") as engine:
        assert engine.model.metadata.to_dict()["anchors"]["strides"] == [8, 16]


@pytest.mark.parametrize(("anchors", "key", "words"), [
    ("[8, 16]", "anchors", "mapping"),
    ("{strides: [8, sixteen]}", "anchors.strides", "positive integers"),
    ("{strides: []}", "anchors.strides", "positive integers"),
    ("{stride: [8, 16]}", "anchors.stride", "no SsdAnchorsCalculator option"),
    ("{strides: [8, 16], num_layers: 3}", "anchors.num_layers", "number of strides"),
    ("{strides: [8, 16], fixed_anchor_size: false}", "anchors.fixed_anchor_size", "true"),
    ("{strides: [8, 16], feature_map_width: [16, 8]}", "anchors.feature_map_width", "not supported"),
    ("{strides: [8, 16], anchor_offset_x: 2}", "anchors.anchor_offset_x", "0..1"),
    ("{strides: [8, 16], input_size_width: 128}", "anchors.input_size_height", "other input size"),
    ("{strides: [8, 16, 16, 16, 16]}", "anchors.strides", "makes 1024 anchors"),
])
def test_a_wrong_anchors_option_is_an_error_naming_its_key(tmp_path, anchors, key, words):
    model = _planted(tmp_path, 128, 896, 0)
    (model.parent / "metadata.yaml").write_text(f"anchors: {anchors}\n")
    with pytest.raises(AnchorOptionsError, match=words) as raised:
        reading(model)
    assert raised.value.key == key and key in str(raised.value)


def test_options_read_as_mediapipes_graphs_write_them():
    # the palm detector's SsdAnchorsCalculator options, as in palm_detection_cpu.pbtxt
    palm = scheme_from_options({"num_layers": 4, "min_scale": 0.1484375, "max_scale": 0.75,
                                "input_size_width": 192, "input_size_height": 192, "anchor_offset_x": 0.5,
                                "anchor_offset_y": 0.5, "strides": [8, 16, 16, 16], "aspect_ratios": [1.0],
                                "fixed_anchor_size": True})
    assert palm.count(192, 192) == 2016 and palm.placement(192, 192) == derive_scheme(192, 192, 2016).placement(
        192, 192)
    # SSD's lowest layer of 3 anchors (reduce_boxes_in_lowest_layer) and the calculator's stated input size
    reduced = scheme_from_options({"strides": [16, 32], "aspect_ratios": [1.0, 2.0, 0.5],
                                   "reduce_boxes_in_lowest_layer": True, "input_size_width": 300,
                                   "input_size_height": 300})
    assert reduced.per_layer == (3, 4) and reduced.count(64, 64) == 19 * 19 * 3 + 10 * 10 * 4


def test_several_schemes_of_one_count_are_said(tmp_path, caplog):
    """2304 anchors at 192x192: a 48x48 map of one anchor (BlazeFace full range) or a 24x24 map of four, ..."""
    derive_scheme.cache_clear()
    with caplog.at_level(logging.WARNING, logger="edgeinfer.pipeline.decoders.anchor_schemes"):
        scheme = derive_scheme(192, 192, 2304)
    assert scheme.strides == (4,)
    assert "fit 3 MediaPipe anchor schemes" in caplog.text and "strides 4, 1 anchor a layer (taken)" in caplog.text
    assert "anchors:" in caplog.text
    frame = write_frame(tmp_path / "frame.png")
    model = _planted(tmp_path, 192, 2304, 48 * 20 + 20)  # row 20, column 20 of the stride-4 map: centre (82, 82)
    face = _one_face(model, frame)
    scale = 960 / 192  # the 960x540 frame letterboxed into 192x108 at rows 42-150
    assert face.box == pytest.approx([(82 - 15) * scale, (82 - 20 - 42) * scale, (82 + 15) * scale,
                                      (82 + 20 - 42) * scale], abs=0.05)
