"""The three CPU delegates on the real models: reference top-1, agreement, zero copy, errors."""

from __future__ import annotations

import numpy as np
import pytest
from support.assets import IMAGES, LABELS, MODELS, REFERENCE_TOP1
from support.pipeline import allocations_per_frame

import edgeinfer
from edgeinfer.errors import (
    ClosedError,
    DelegateUnavailable,
    EdgeInferError,
    InputMismatch,
    NoDelegateAvailable,
    UnsupportedOperator,
)
from edgeinfer.pipeline.classify import ImageClassifier
from edgeinfer.pipeline.labels import Labels
from edgeinfer.pipeline.postprocess import class_scores

TFLITE = MODELS / "mobilenet_v2_1.0_224_quant.tflite"
ONNX = MODELS / "mobilenet_v2_1.0_224_quant.onnx"
RUNS = [(TFLITE, "xnnpack"), (TFLITE, "openvino"), (ONNX, "onnxruntime"), (ONNX, "openvino")]
#: 12 steps of the output's 1/256 quantisation: runtimes round intermediate values differently
SCORE_TOLERANCE = 12 / 256


@pytest.fixture(scope="module")
def labels() -> Labels:
    return Labels.load(LABELS / "imagenet_labels.txt")


@pytest.fixture(scope="module")
def score_vectors() -> dict:
    vectors = {}
    for model, delegate in RUNS:
        with edgeinfer.load(model, delegate, threads=2) as engine:
            classifier = ImageClassifier(engine)
            for image in REFERENCE_TOP1:
                classifier.classify_file(IMAGES / image)
                vectors[(model.suffix, delegate, image)] = class_scores(engine.output_view(0), engine.outputs[0])
    return vectors


@pytest.mark.parametrize(("model", "delegate"), RUNS, ids=[f"{m.suffix[1:]}-{d}" for m, d in RUNS])
def test_reference_top1(model, delegate, labels):
    with edgeinfer.load(model, delegate) as engine:
        assert engine.delegate == delegate
        classifier = ImageClassifier(engine, labels, top_k=3)
        for image, (label, score) in REFERENCE_TOP1.items():
            top = classifier.classify_file(IMAGES / image)
            assert top[0].label.startswith(label), (image, top)
            assert top[0].score == pytest.approx(score, abs=0.06)
            assert top[0].score >= top[1].score >= top[2].score


def test_delegates_agree_within_quantisation_tolerance(score_vectors):
    reference_key = (".tflite", "xnnpack")
    for image in REFERENCE_TOP1:
        reference = score_vectors[(*reference_key, image)]
        assert reference.shape == (1001,) and abs(reference.sum() - 1.0) < 0.05
        for model, delegate in RUNS:
            other = score_vectors[(model.suffix, delegate, image)]
            worst = float(np.abs(other - reference).max())
            assert worst <= SCORE_TOLERANCE, (model.name, delegate, image, worst)


@pytest.mark.parametrize(("model", "delegate"), RUNS, ids=[f"{m.suffix[1:]}-{d}" for m, d in RUNS])
def test_input_view_is_the_runtime_buffer(model, delegate):
    """Writing into the view changes the result with no set call: the view *is* the input."""
    with edgeinfer.load(model, delegate) as engine:
        view = engine.input_view(0)
        assert view.flags.writeable and view.shape == (1, 224, 224, 3) and view.dtype == np.uint8
        assert engine.input_view(0).ctypes.data == view.ctypes.data  # same buffer every time
        view[...] = 0
        engine.invoke()
        black = engine.output_view(0).copy()
        view[...] = 255
        engine.invoke()
        white = engine.output_view(0).copy()
        assert not np.array_equal(black, white)
        view[...] = 0
        engine.invoke()
        np.testing.assert_array_equal(engine.output_view(0), black)
        assert engine.output_view(0).ctypes.data == engine.output_view(0).ctypes.data


def test_run_checks_shape_and_dtype():
    with edgeinfer.load(TFLITE, "xnnpack") as engine:
        good = np.zeros((1, 224, 224, 3), np.uint8)
        (out,) = engine.run(good)
        assert out.shape == (1, 1001)
        with pytest.raises(InputMismatch, match="shape"):
            engine.run(np.zeros((1, 128, 128, 3), np.uint8))
        with pytest.raises(InputMismatch, match="dtype"):
            engine.run(good.astype(np.float32))
        with pytest.raises(InputMismatch, match="1 input"):
            engine.run(good, good)
        assert isinstance(InputMismatch("x"), ValueError)


def test_close_is_idempotent_and_final():
    engine = edgeinfer.load(ONNX, "onnxruntime")
    with engine:
        engine.invoke()
    assert engine.closed
    engine.close()
    with pytest.raises(ClosedError, match="closed"):
        engine.invoke()
    with pytest.raises(ClosedError, match="closed"):
        engine.input_view(0)


def test_threads_option_reaches_the_engine():
    with edgeinfer.load(TFLITE, "xnnpack", threads=1) as engine:
        assert engine.threads == 1


def test_default_delegate_follows_the_format():
    with edgeinfer.load(TFLITE) as engine:
        assert engine.delegate == "xnnpack"
    with edgeinfer.load(ONNX) as engine:
        assert engine.delegate == "onnxruntime"


def test_unresolved_custom_op_is_a_typed_error():
    with pytest.raises(UnsupportedOperator, match="fake-op-double") as info:
        edgeinfer.load(MODELS / "model_invoking_error.tflite", "xnnpack")
    assert info.value.operators == ("fake-op-double",)
    assert isinstance(info.value.__cause__, RuntimeError)  # mapped from LiteRT's own error


def test_custom_op_on_openvino_is_a_typed_error():
    with pytest.raises(EdgeInferError):
        edgeinfer.load(MODELS / "model_invoking_error.tflite", "openvino")


def test_edgetpu_model_without_a_tpu_names_its_cpu_twin():
    model = MODELS / "mobilenet_v1_0.25_128_quant_edgetpu.tflite"
    with pytest.raises(UnsupportedOperator, match=r"mobilenet_v1_0\.25_128_quant\.tflite"):
        edgeinfer.load(model, "xnnpack")
    with pytest.raises(NoDelegateAvailable) as info:
        edgeinfer.load(model)
    assert "xnnpack" in info.value.reasons


def test_wrong_format_for_delegate():
    with pytest.raises(DelegateUnavailable, match="cannot read onnx"):
        edgeinfer.load(ONNX, "xnnpack")
    with pytest.raises(DelegateUnavailable, match="cannot read tflite"):
        edgeinfer.load(TFLITE, "onnxruntime")


def test_missing_openvino_device_is_unavailable():
    with pytest.raises(DelegateUnavailable, match="NPU") as info:
        edgeinfer.load(ONNX, "openvino:NPU")
    assert "available: CPU" in info.value.reason


def test_unknown_delegate_is_a_value_error():
    with pytest.raises(ValueError, match="known: xnnpack"):
        edgeinfer.load(TFLITE, "bogus")


def test_openvino_runs_ir(tmp_path, labels):
    import openvino as ov
    xml = tmp_path / "mobilenet.xml"
    ov.save_model(ov.convert_model(str(ONNX)), str(xml))
    with edgeinfer.load(xml) as engine:
        assert engine.delegate == "openvino"
        top = ImageClassifier(engine, labels).classify_file(IMAGES / "parrot.jpg")
        assert top[0].label == "macaw"


def test_float_onnx_model_classifies(labels):
    model = MODELS / "mobilenet_v2_1.0_224_float.onnx"
    for delegate in ("onnxruntime", "openvino"):
        with edgeinfer.load(model, delegate) as engine:
            top = ImageClassifier(engine, labels, mean=128.0, std=128.0).classify_file(IMAGES / "cat.bmp")
            assert top[0].label == "Egyptian cat", (delegate, top)


@pytest.mark.parametrize(("model", "delegate"), RUNS, ids=[f"{m.suffix[1:]}-{d}" for m, d in RUNS])
def test_invoke_allocates_under_1_kib(model, delegate):
    """The pipeline's per-frame budget is 1 KiB in all; invoke itself must stay well inside it."""
    with edgeinfer.load(model, delegate, threads=2) as engine:
        for _ in range(5):
            engine.invoke()
        # tracemalloc sees every thread: a thread left by an earlier test can only add to a window,
        # while invoke's own allocations show in each — so the least of three windows is invoke's
        per_invoke = min(allocations_per_frame((engine.invoke() for _ in range(30)), frames=30)[0]
                         for _ in range(3))
    assert per_invoke < 512, f"{per_invoke:.0f} B per invoke on {delegate}"
