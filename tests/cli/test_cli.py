"""The CLI as a user runs it: real subprocesses, real models, exit codes and stderr."""

from __future__ import annotations

import json
import subprocess

import pytest
from support.assets import IMAGES, LABELS, MODELS, REFERENCE_TOP1
from support.processes import edgeinfer_cmd

TFLITE = MODELS / "mobilenet_v2_1.0_224_quant.tflite"
ONNX = MODELS / "mobilenet_v2_1.0_224_quant.onnx"


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(edgeinfer_cmd(*args), capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize(
    ("model", "delegate"),
    [(TFLITE, "xnnpack"), (TFLITE, "openvino"), (ONNX, "onnxruntime"), (ONNX, "openvino")],
)
def test_classify_json_gives_reference_top1(model, delegate):
    images = [str(IMAGES / name) for name in REFERENCE_TOP1]
    result = run("classify", str(model), *images, "--labels", str(LABELS / "imagenet_labels.txt"),
                 "--top-k", "3", "--delegate", delegate, "--json")
    assert result.returncode == 0, result.stderr
    rows = json.loads(result.stdout)
    assert [r["image"] for r in rows] == images
    for row, (label, _score) in zip(rows, REFERENCE_TOP1.values()):
        assert row["delegate"].split(":")[0] == delegate
        assert len(row["top"]) == 3
        best = row["top"][0]
        assert best["label"].startswith(label)
        assert 0.0 <= best["score"] <= 1.0 and isinstance(best["index"], int)


def test_classify_without_any_labels_uses_indices():
    result = run("classify", str(ONNX), str(IMAGES / "parrot.jpg"), "--top-k", "1", "--json")
    assert result.returncode == 0, result.stderr
    best = json.loads(result.stdout)[0]["top"][0]
    assert best == {"index": 89, "label": "89", "score": best["score"]}


def test_info_json():
    result = run("info", str(ONNX), "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["format"] == "onnx"
    assert data["inputs"][0]["shape"] == [1, 224, 224, 3]
    assert data["outputs"][0]["scale"] == pytest.approx(1 / 256)


def test_info_human():
    result = run("info", str(MODELS / "mobilenet_v1_0.25_128_quant_edgetpu.tflite"))
    assert result.returncode == 0
    assert "edgetpu-tflite" in result.stdout and "edgetpu-custom-op" in result.stdout


def _bad_inputs(tmp):
    truncated = tmp / "truncated.tflite"
    truncated.write_bytes(TFLITE.read_bytes()[:900_000])
    text = tmp / "notes.txt"
    text.write_text("hello")
    cut_jpeg = tmp / "cut.jpg"
    cut_jpeg.write_bytes((IMAGES / "parrot.jpg").read_bytes()[:20_000])  # libjpeg complains on stderr
    return {
        "missing": (str(tmp / "absent.tflite"), str(IMAGES / "cat.bmp"), "not found"),
        "truncated": (str(truncated), str(IMAGES / "cat.bmp"), "truncated"),
        "wrong format": (str(text), str(IMAGES / "cat.bmp"), "not a model"),
        "custom op": (str(MODELS / "model_invoking_error.tflite"), str(IMAGES / "cat.bmp"), "fake-op-double"),
        "edgetpu": (str(MODELS / "mobilenet_v1_0.25_128_quant_edgetpu.tflite"), str(IMAGES / "cat.bmp"), "coral"),
        "bad image": (str(TFLITE), str(text), "cannot decode image"),
        "truncated jpeg": (str(TFLITE), str(cut_jpeg), "cannot decode image"),
        "missing image": (str(TFLITE), str(tmp / "none.jpg"), "image not found"),
    }


@pytest.mark.parametrize("case", ["missing", "truncated", "wrong format", "custom op", "edgetpu", "bad image",
                                  "truncated jpeg", "missing image"])
def test_errors_are_one_line_and_exit_1(tmp_path, case):
    model, image, expected = _bad_inputs(tmp_path)[case]
    result = run("classify", model, image)
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("edgeinfer: error:") and expected in lines[0]
    assert "Traceback" not in result.stderr and result.stdout == ""


def test_unknown_delegate_is_a_usage_error():
    result = run("classify", str(TFLITE), str(IMAGES / "cat.bmp"), "--delegate", "bogus")
    assert result.returncode == 2
    assert "unknown delegate" in result.stderr and "Traceback" not in result.stderr


def test_labels_packed_in_the_model_are_the_default():
    result = run("classify", str(TFLITE), str(IMAGES / "parrot.jpg"), "--top-k", "1", "--json")
    assert json.loads(result.stdout)[0]["top"][0]["label"] == "macaw"
