"""Model inspection against the real shared models and real broken files."""

from __future__ import annotations

import shutil

import pytest
from support.assets import IMAGES, MODELS

from edgeinfer.errors import ModelFormatError, ModelNotFound
from edgeinfer.runtime.model import ModelFormat, detect_format, inspect_model
from edgeinfer.util.fs import sha256_file


@pytest.mark.parametrize(
    ("name", "fmt"),
    [
        ("mobilenet_v2_1.0_224_quant.tflite", ModelFormat.TFLITE),
        ("mobilenet_v1_0.25_128_quant_edgetpu.tflite", ModelFormat.EDGETPU_TFLITE),
        ("mobilenet_v2_1.0_224_quant.onnx", ModelFormat.ONNX),
        ("ultraface_rfb_320.onnx", ModelFormat.ONNX),
        ("deeplabv3_mnv2_dm05_pascal_quant.tflite", ModelFormat.TFLITE),
    ],
)
def test_format_is_detected_by_content_not_name(tmp_path, name, fmt):
    renamed = tmp_path / "model.bin"  # a misleading name on purpose
    shutil.copy(MODELS / name, renamed)
    assert inspect_model(renamed).format is fmt


def test_tflite_specs_and_quantisation():
    info = inspect_model(MODELS / "mobilenet_v2_1.0_224_quant.tflite")
    (inp,) = info.inputs
    (out,) = info.outputs
    assert (inp.shape, inp.dtype, inp.layout) == ((1, 224, 224, 3), "uint8", "NHWC")
    assert inp.scale == pytest.approx(1 / 128) and inp.zero_point == 128
    assert (out.shape, out.dtype) == ((1, 1001), "uint8")
    assert out.scale == pytest.approx(1 / 256) and out.zero_point == 0
    assert info.sha256 == sha256_file(MODELS / "mobilenet_v2_1.0_224_quant.tflite")
    assert len(info.sha256) == 64


def test_onnx_quantisation_is_read_from_the_graph():
    info = inspect_model(MODELS / "mobilenet_v2_1.0_224_quant.onnx")
    assert info.inputs[0].scale == pytest.approx(1 / 128) and info.inputs[0].zero_point == 128
    assert info.outputs[0].scale == pytest.approx(1 / 256)


def test_onnx_nchw_float_and_multiple_outputs():
    info = inspect_model(MODELS / "ultraface_rfb_320.onnx")
    assert [(s.name, s.shape) for s in info.inputs] == [("input", (1, 3, 240, 320))]
    assert info.inputs[0].layout == "NCHW" and not info.inputs[0].quantized
    assert [s.name for s in info.outputs] == ["scores", "boxes"]


def test_custom_ops_are_listed():
    assert inspect_model(MODELS / "mobilenet_v1_0.25_128_quant_edgetpu.tflite").custom_ops == ("edgetpu-custom-op",)
    assert inspect_model(MODELS / "model_invoking_error.tflite").custom_ops == ("fake-op-double",)


def test_openvino_ir_is_detected_and_read(tmp_path):
    import openvino as ov
    xml = tmp_path / "mobilenet.xml"
    ov.save_model(ov.convert_model(str(MODELS / "mobilenet_v2_1.0_224_quant.onnx")), str(xml))
    info = inspect_model(xml)
    assert info.format is ModelFormat.OPENVINO_IR
    assert info.weights_path and info.weights_path.endswith("mobilenet.bin")
    assert info.inputs[0].shape == (1, 224, 224, 3)
    xml.with_suffix(".bin").unlink()
    with pytest.raises(ModelFormatError, match="no weights file"):
        inspect_model(xml)


@pytest.mark.parametrize("name", ["mobilenet_v2_1.0_224_quant.tflite", "mobilenet_v2_1.0_224_quant.onnx"])
@pytest.mark.parametrize("fraction", [0.3, 0.9, 0.999])
def test_truncated_models_are_rejected(tmp_path, name, fraction):
    data = (MODELS / name).read_bytes()
    cut = tmp_path / name
    cut.write_bytes(data[: int(len(data) * fraction)])
    with pytest.raises(ModelFormatError, match="truncated"):
        inspect_model(cut)


def test_missing_empty_and_foreign_files(tmp_path):
    with pytest.raises(ModelNotFound):
        inspect_model(tmp_path / "absent.tflite")
    with pytest.raises(ModelNotFound):
        inspect_model(tmp_path)
    (tmp_path / "empty.onnx").write_bytes(b"")
    with pytest.raises(ModelFormatError, match="empty"):
        inspect_model(tmp_path / "empty.onnx")
    (tmp_path / "notes.txt").write_text("not a model at all\n")
    with pytest.raises(ModelFormatError, match="not a model"):
        inspect_model(tmp_path / "notes.txt")
    with pytest.raises(ModelFormatError, match="JPEG image"):
        inspect_model(IMAGES / "parrot.jpg")
    (tmp_path / "page.xml").write_text("<?xml version='1.0'?><html/>")
    with pytest.raises(ModelFormatError, match="not an OpenVINO IR"):
        inspect_model(tmp_path / "page.xml")


def test_tensorrt_plan_header_is_recognised(tmp_path):
    # A serialized TensorRT engine carries its 'ftrt' tag in the first bytes; the rest is opaque.
    plan = tmp_path / "model.engine"
    plan.write_bytes(b"\x00" * 16 + b"ftrt" + b"\x00" * 200)
    assert detect_format(plan) is ModelFormat.TENSORRT_PLAN
    assert inspect_model(plan).notes
