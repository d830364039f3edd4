"""A model whose image input has a dynamic size (an Ultralytics ``dynamic=True`` export): the size its metadata
states is the one ONNX Runtime and OpenVINO load it at, and a pipeline runs it; with no size stated anywhere,
loading it says which input and how to fix it."""

from __future__ import annotations

import pytest
from support.assets import IMAGES
from support.metadata import fall_reference, onnx_variant, ultralytics_ir

import edgeinfer
from edgeinfer import Pipeline
from edgeinfer.errors import UnsizedInput
from edgeinfer.runtime.model import inspect_model

DELEGATES = ["onnxruntime", "openvino"]


@pytest.fixture(scope="module")
def variants(tmp_path_factory) -> dict:
    """yolo_fall_detection.onnx with symbolic batch, height, width (and anchors), its imgsz kept or not,
    and an IR of the one without (each in a folder of its own: a metadata.yaml applies to its folder)."""
    root = tmp_path_factory.mktemp("dynamic")
    sized = onnx_variant(root / "sized" / "fall.onnx", dynamic=True)
    unsized = onnx_variant(root / "unsized" / "fall.onnx", dynamic=True, drop=("imgsz",))
    return {"sized": sized, "unsized": unsized,
            "unsized ir": ultralytics_ir(unsized, root / "unsized_ir", ["Normal", "Fall"])}


def _check_squat(detections) -> None:
    (expected,) = fall_reference("squat.bmp")
    assert [d.label for d in detections] == [expected["label"]]
    assert detections[0].score == pytest.approx(expected["score"], abs=0.03)
    assert detections[0].box == pytest.approx(expected["box_xyxy_px"], abs=4)


def test_inspection_sizes_the_input_from_the_metadata(variants):
    info = inspect_model(variants["sized"])
    assert info.inputs[0].shape == (1, 3, 640, 640) and info.inputs[0].layout == "NCHW"
    assert info.outputs[0].shape == (-1, 6, -1)
    assert any("640x640" in note and "metadata" in note for note in info.notes)


@pytest.mark.parametrize("delegate", DELEGATES)
def test_a_dynamic_input_loads_at_the_metadata_size(variants, delegate):
    with edgeinfer.load(variants["sized"], delegate) as engine:
        assert engine.inputs[0].shape == (1, 3, 640, 640)
        assert engine.outputs[0].shape == (1, 6, 8400)  # the anchors follow the input's size
        engine.invoke()
        assert engine.output_view(0).shape == (1, 6, 8400)
    with Pipeline(variants["sized"], IMAGES / "squat.bmp", delegate=delegate) as pipeline:
        (detections,) = [r.result for r in pipeline]
    _check_squat(detections)


@pytest.mark.parametrize("delegate", [*DELEGATES, None], ids=[*DELEGATES, "selected"])
def test_no_size_anywhere_is_a_typed_error_at_load(variants, delegate):
    assert inspect_model(variants["unsized"]).inputs[0].shape == (-1, 3, -1, -1)
    with pytest.raises(UnsizedInput) as caught:
        edgeinfer.load(variants["unsized"], delegate)
    assert caught.value.input == "images"
    message = str(caught.value)
    assert "'images'" in message and "?x3x?x?" in message
    assert "imgsz" in message and "metadata.yaml" in message


def test_no_size_anywhere_is_a_note_of_the_inspection(variants):
    notes = inspect_model(variants["unsized"]).notes
    assert any("'images'" in note and "loading it fails" in note for note in notes), notes


def test_an_unsized_ir_is_refused_then_runs_with_the_fix_the_error_names(variants):
    model = variants["unsized ir"]
    with pytest.raises(UnsizedInput):
        edgeinfer.load(model, "openvino")
    (model.parent / "metadata.yaml").write_text("imgsz: [640, 640]\n")  # what the message says to do
    try:
        with Pipeline(model, IMAGES / "squat.bmp", delegate="openvino") as pipeline:
            (detections,) = [r.result for r in pipeline]
    finally:
        (model.parent / "metadata.yaml").unlink()
    _check_squat(detections)
