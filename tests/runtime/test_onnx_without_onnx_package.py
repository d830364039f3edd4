"""Quantised ONNX models without the ``onnx`` package (``pip install onnxruntime`` alone): the scale and
zero point come from our own protobuf reader, so ONNX Runtime's uint8 scores are dequantised and read
as the reference probabilities — not 1.0 for every top-1."""

from __future__ import annotations

import json

import pytest
from support.assets import IMAGENET_LABELS, IMAGES, MODELS, REFERENCE_TOP1
from support.processes import run_without

from edgeinfer.errors import ModelFormatError
from edgeinfer.runtime import _onnx_schema
from edgeinfer.runtime.model import inspect_model

ONNX_MODELS = sorted(MODELS.glob("*.onnx"))
#: as tests/runtime/test_delegates.py: runtimes round intermediate values differently
SCORE_TOLERANCE = 0.06

CLASSIFY_WITHOUT_ONNX = """
import json, sys
try:
    import onnx
except ImportError:
    pass
else:
    sys.exit("onnx is still importable")
import edgeinfer
from edgeinfer.pipeline.classify import ImageClassifier
from edgeinfer.pipeline.labels import Labels

model, labels, images, others = {model!r}, {labels!r}, {images!r}, {others!r}
specs = {{str(path): [spec.__dict__ for spec in (*info.inputs, *info.outputs)]
         for path in others for info in [edgeinfer.inspect_model(path)]}}
top1 = {{}}
with edgeinfer.load(model, "onnxruntime") as engine:
    classifier = ImageClassifier(engine, Labels.load(labels), top_k=2)
    for image in images:
        best = classifier.classify_file(image)
        top1[image] = [(c.label, c.score) for c in best]
print(json.dumps({{"specs": specs, "top1": top1}}))
"""


@pytest.fixture(scope="module")
def without_onnx() -> dict:
    """Specs of every shared ONNX model and MobileNet v2's reference classifications, in a child
    interpreter where ``onnx`` cannot be imported and the real ONNX Runtime runs the model."""
    images = [str(IMAGES / name) for name in REFERENCE_TOP1]
    code = CLASSIFY_WITHOUT_ONNX.format(model=str(MODELS / "mobilenet_v2_1.0_224_quant.onnx"),
                                        labels=str(IMAGENET_LABELS), images=images,
                                        others=[str(p) for p in ONNX_MODELS])
    result = run_without({"onnx"}, code, timeout=240)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_reference_scores_through_onnxruntime_without_onnx(without_onnx):
    for name, (label, score) in REFERENCE_TOP1.items():
        (best_label, best_score), (_, second_score) = without_onnx["top1"][str(IMAGES / name)]
        assert best_label.startswith(label), (name, best_label)
        assert best_score == pytest.approx(score, abs=SCORE_TOLERANCE), (name, best_score)
        assert best_score >= second_score
    scores = [without_onnx["top1"][str(IMAGES / name)][0][1] for name in REFERENCE_TOP1]
    assert min(scores) < 0.9  # not every top-1 at 1.0 (the bug: uint8 scores never dequantised)


def test_quantisation_is_read_without_onnx(without_onnx):
    specs = without_onnx["specs"][str(MODELS / "mobilenet_v2_1.0_224_quant.onnx")]
    source, probabilities = specs
    assert (source["dtype"], source["scale"], source["zero_point"]) == ("uint8", 1 / 128, 128)
    assert (probabilities["dtype"], probabilities["scale"], probabilities["zero_point"]) == ("uint8", 1 / 256, 0)
    tiny = without_onnx["specs"][str(MODELS / "mobilenet_v1_0.25_128_quant.onnx")]
    assert tiny[0]["shape"] == [1, 128, 128, 3] and tiny[-1]["scale"] == 1 / 256


def test_specs_are_the_same_with_and_without_onnx(without_onnx):
    import onnx  # noqa: F401 - this interpreter reads the graph with the onnx package (the onnx extra)
    for path in ONNX_MODELS:
        info = inspect_model(path)  # this interpreter reads the graph with the onnx package
        expected = [{**spec.__dict__, "shape": list(spec.shape)} for spec in (*info.inputs, *info.outputs)]
        assert without_onnx["specs"][str(path)] == expected, path.name


@pytest.mark.parametrize("path", ONNX_MODELS, ids=[p.name for p in ONNX_MODELS])
def test_own_reader_agrees_with_the_onnx_package(path):
    import onnx
    ours = _onnx_schema.parse_model(path.read_bytes())
    assert ours == _onnx_schema.graph_from_onnx(onnx.load(str(path)))
    assert ours.nodes and ours.inputs and ours.outputs


def test_own_reader_on_typed_fields_constants_and_symbolic_dims():
    """tf2onnx stores scalars in raw_data; other exporters use float_data / int32_data / int64_data
    and Constant nodes — the same values must come out."""
    import onnx
    from onnx import TensorProto, helper

    initializers = [
        helper.make_tensor("scale_f", TensorProto.FLOAT, [], [0.5]),  # float_data
        helper.make_tensor("zp_u8", TensorProto.UINT8, [1], [7]),  # int32_data
        helper.make_tensor("zp_i8", TensorProto.INT8, [], [-3]),  # negative in int32_data
        helper.make_tensor("big_i64", TensorProto.INT64, [], [-(2 ** 40)]),
        helper.make_tensor("half", TensorProto.FLOAT16, [], [0.25]),
        helper.make_tensor("double", TensorProto.DOUBLE, [], [0.125]),
        helper.make_tensor("flag", TensorProto.BOOL, [], [True]),
        helper.make_tensor("vector", TensorProto.FLOAT, [2], [1.0, 2.0]),  # not a scalar
    ]
    nodes = [
        helper.make_node("Constant", [], ["c_tensor"], value=helper.make_tensor("v", TensorProto.FLOAT, [], [0.75])),
        helper.make_node("Constant", [], ["c_float"], value_float=1.5),
        helper.make_node("Constant", [], ["c_int"], value_int=-9),
        helper.make_node("QuantizeLinear", ["x", "scale_f", "zp_u8"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes, "typed", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.UINT8, ["batch", 4])], initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    ours = _onnx_schema.parse_model(model.SerializeToString())
    assert ours == _onnx_schema.graph_from_onnx(onnx.load_from_string(model.SerializeToString()))
    assert ours.scalars == {"scale_f": 0.5, "zp_u8": 7, "zp_i8": -3, "big_i64": -(2 ** 40), "half": 0.25,
                            "double": 0.125, "flag": True, "c_tensor": 0.75, "c_float": 1.5, "c_int": -9}
    assert ours.inputs == (_onnx_schema.ValueInfo("x", TensorProto.FLOAT, (-1, 4)),)
    assert "vector" in ours.initializers


def test_integer_output_without_a_scale_is_said_not_pretended(tmp_path):
    """A uint8 output no QuantizeLinear makes has no knowable scale: inspection says so."""
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Cast", ["x"], ["y"], to=TensorProto.UINT8)], "cast",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 10])],
        [helper.make_tensor_value_info("y", TensorProto.UINT8, [1, 10])])
    path = tmp_path / "cast.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    info = inspect_model(path)
    assert not info.outputs[0].quantized
    assert any("no QuantizeLinear scale" in note for note in info.notes)


def test_own_reader_rejects_a_corrupt_graph():
    with pytest.raises(ModelFormatError, match="varint"):
        _onnx_schema.parse_model(b"\x08\x08" + b"\x3a\x02\xff\xff")  # ir_version 8, graph: a cut varint
    with pytest.raises(ModelFormatError, match="runs past"):
        _onnx_schema.parse_model(b"\x08\x08" + b"\x3a\x02\x0a\x05")  # graph: a node longer than the graph
    with pytest.raises(ModelFormatError, match="no graph"):
        _onnx_schema.parse_model(b"\x08\x08")
