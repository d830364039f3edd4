"""What a model says about itself, read from real files: Ultralytics' ONNX exports (through our own protobuf
reader and through the ``onnx`` package), a .tflite with metadata.json zipped onto it, OpenVINO IRs with the
rt_info Ultralytics' export writes, a metadata.yaml beside a model — and hostile values, which are noted and
ignored, never raised."""

from __future__ import annotations

import shutil

import onnx
import pytest
from support.assets import IMAGES, MODELS
from support.metadata import (
    FALL_NAMES,
    YOLO_FALL,
    YOLO_POSE,
    damage_member,
    fall_reference,
    onnx_variant,
    ultralytics_ir,
    with_metadata_json,
)

import edgeinfer
from edgeinfer import Pipeline
from edgeinfer.runtime import _onnx_schema
from edgeinfer.runtime.metadata import ModelMetadata, from_pairs, read_metadata
from edgeinfer.runtime.model import inspect_model

#: what Ultralytics' ONNX exports state, and the preprocessing edgeinfer infers from who made them
ULTRALYTICS = {"producer": "ultralytics", "imgsz": (640, 640), "stride": 32, "mean": (0.0, 0.0, 0.0),
               "std": (255.0, 255.0, 255.0), "letterbox": True, "pad_value": 114, "notes": ()}
EXPECTED = {
    YOLO_POSE: {**ULTRALYTICS, "task": "pose", "names": {0: "person"}, "kpt_shape": (17, 3), "end2end": False},
    YOLO_FALL: {**ULTRALYTICS, "task": "detect", "names": FALL_NAMES, "kpt_shape": None, "end2end": None},
}
TFLITE = MODELS / "mobilenet_ssd_v2_coco_quant_postprocess.tflite"  # no zip of its own
TFLITE_WITH_LABELS = MODELS / "mobilenet_v1_0.25_128_quant.tflite"  # TFLite metadata: labels zipped on


def _fields(meta: ModelMetadata, expected: dict) -> dict:
    return {key: getattr(meta, key) for key in expected}


# ------------------------------------------------------------------------------------------ ONNX

@pytest.mark.parametrize("model", [YOLO_POSE, YOLO_FALL], ids=["pose", "fall"])
@pytest.mark.parametrize("reader", ["own protobuf reader", "onnx package"])
def test_ultralytics_onnx_metadata(model, reader):
    graph = (_onnx_schema.parse_model(model.read_bytes()) if reader == "own protobuf reader"
             else _onnx_schema.graph_from_onnx(onnx.load(str(model), load_external_data=False)))
    meta = read_metadata(model, "onnx", onnx_props=graph.metadata)
    assert meta.source == "onnx metadata_props"
    assert _fields(meta, EXPECTED[model]) == EXPECTED[model]
    assert meta.raw["author"] == "Ultralytics"


@pytest.mark.parametrize("model", [YOLO_POSE, YOLO_FALL], ids=["pose", "fall"])
def test_inspection_carries_the_metadata(model):
    info = inspect_model(model)
    assert _fields(info.metadata, EXPECTED[model]) == EXPECTED[model]
    assert info.to_dict()["metadata"]["names"] == {str(k): v for k, v in EXPECTED[model]["names"].items()}


def test_both_onnx_readers_agree_on_unusual_text(tmp_path):
    props = {"author": "Ultralytics", "task": "detect", "names": "{0: 'café au lait', 1: 'ü\\tb', 2: ''}",
             "empty": "", "imgsz": " [480, 640] "}
    path = onnx_variant(tmp_path / "m.onnx", props=props)
    ours = _onnx_schema.parse_model(path.read_bytes()).metadata
    theirs = _onnx_schema.graph_from_onnx(onnx.load(str(path))).metadata
    assert ours == theirs == props
    meta = inspect_model(path).metadata
    assert meta.names == {0: "café au lait", 1: "ü\tb", 2: ""} and meta.imgsz == (480, 640)


def test_a_converters_keys_alone_are_no_metadata():
    assert read_metadata(YOLO_FALL, "onnx", onnx_props={"converted_by": "tf2onnx"}).empty


# ---------------------------------------------------------------------------------------- TFLite

def _ultralytics_json(**changes) -> dict:
    """The metadata.json Ultralytics zips onto a .tflite: its metadata dict through json.dumps (int keys
    become strings)."""
    return {"description": "Ultralytics YOLO11n-pose model", "author": "Ultralytics", "license": "AGPL-3.0",
            "docs": "https://docs.ultralytics.com", "stride": 32, "task": "pose", "batch": 1,
            "imgsz": [640, 640], "names": {"0": "person"}, "args": {"nms": False, "int8": False},
            "channels": 3, "end2end": False, "kpt_shape": [17, 3], **changes}


@pytest.mark.parametrize("source", [TFLITE, TFLITE_WITH_LABELS], ids=["plain", "with packed labels"])
def test_tflite_with_metadata_json_zipped_on(tmp_path, source):
    model = with_metadata_json(shutil.copy(source, tmp_path / "model.tflite"), _ultralytics_json())
    info = inspect_model(model)
    assert info.metadata.source == "tflite metadata.json"
    assert _fields(info.metadata, EXPECTED[YOLO_POSE]) == EXPECTED[YOLO_POSE]
    assert info.inputs == inspect_model(source).inputs  # the flatbuffer reads as before
    with edgeinfer.load(model, "xnnpack") as engine:  # and LiteRT runs it, zip and all
        engine.invoke()


def test_tflite_nms_export_is_end2end(tmp_path):
    meta = inspect_model(with_metadata_json(shutil.copy(TFLITE, tmp_path / "m.tflite"), _ultralytics_json(
        end2end=None, args={"nms": True}))).metadata
    assert meta.end2end is True


def test_tflite_corrupt_zip_is_noted(tmp_path):
    model = with_metadata_json(shutil.copy(TFLITE, tmp_path / "m.tflite"), _ultralytics_json())
    damage_member(model, "metadata.json")
    info = inspect_model(model)
    assert info.metadata.empty
    assert any("zip appended to the model cannot be read" in n for n in info.notes), info.notes
    with edgeinfer.load(model, "xnnpack") as engine:
        engine.invoke()


@pytest.mark.parametrize(("text", "note"), [("[1, 2]", "not a JSON object"),
                                            ("{not json", "cannot be read")])
def test_tflite_metadata_json_that_is_not_an_object(tmp_path, text, note):
    info = inspect_model(with_metadata_json(shutil.copy(TFLITE, tmp_path / "m.tflite"), text))
    assert info.metadata.empty and any(note in n for n in info.notes), info.notes


# -------------------------------------------------------------------------------------- OpenVINO

@pytest.fixture(scope="module")
def plain_fall_onnx(tmp_path_factory):
    """yolo_fall_detection.onnx without metadata_props: what Ultralytics' OpenVINO export converts (from
    PyTorch, so no ``<framework>`` section)."""
    return onnx_variant(tmp_path_factory.mktemp("plain") / "fall.onnx", props={})


def test_openvino_rt_info_as_ultralytics_writes_it(tmp_path, plain_fall_onnx):
    model = ultralytics_ir(plain_fall_onnx, tmp_path / "ir", ["Normal", "Fall"])
    meta = inspect_model(model).metadata
    assert meta.source == "openvino rt_info" and meta.producer == "ultralytics"
    assert dict(meta.names) == FALL_NAMES
    assert (meta.letterbox, meta.pad_value, meta.std) == (True, 114, (255.0,))
    assert meta.task is None and meta.imgsz is None  # "YOLO" names no task; model_info has no size
    with Pipeline(model, IMAGES / "squat.bmp", delegate="openvino") as pipeline:
        (detections,) = [r.result for r in pipeline]
    (expected,) = fall_reference("squat.bmp")
    assert [d.label for d in detections] == [expected["label"]]
    assert detections[0].box == pytest.approx(expected["box_xyxy_px"], abs=4)


def test_openvino_rt_info_and_its_sidecar(tmp_path, plain_fall_onnx):
    """Ultralytics writes metadata.yaml beside the IR: its values come first (names with their spaces)."""
    model = ultralytics_ir(plain_fall_onnx, tmp_path / "ir", ["Normal person", "Fall"])
    (tmp_path / "ir" / "metadata.yaml").write_text(
        "author: Ultralytics\ntask: detect\nstride: 32\nimgsz:\n- 640\n- 640\nnames:\n  0: Normal person\n  1: Fall\n")
    meta = inspect_model(model).metadata
    assert meta.source == "openvino rt_info + metadata.yaml"
    assert (meta.task, meta.imgsz, dict(meta.names)) == ("detect", (640, 640), {0: "Normal person", 1: "Fall"})


def test_openvino_ir_converted_from_an_ultralytics_onnx(tmp_path):
    """OpenVINO keeps the ONNX model's metadata_props in the IR's ``<rt_info><framework>``."""
    model = ultralytics_ir(YOLO_POSE, tmp_path / "ir", ["person"])
    meta = inspect_model(model).metadata
    assert meta.source == "openvino rt_info"
    expected = {**EXPECTED[YOLO_POSE], "std": (255.0,)}  # model_info's scale_values: one for every channel
    assert _fields(meta, expected) == expected


# ------------------------------------------------------------------------------------- sidecar

SIDECAR_TEXT = """\
task: detect
names: {0: face}
imgsz: [240, 320]
mean: [127, 127, 127]
std: 128
letterbox: false
"""


def test_sidecar_beside_a_model_with_no_metadata(tmp_path):
    model = shutil.copy(MODELS / "ultraface_rfb_320.onnx", tmp_path / "faces.onnx")
    assert inspect_model(model).metadata.empty
    (tmp_path / "metadata.yaml").write_text(SIDECAR_TEXT)
    meta = inspect_model(model).metadata  # the sidecar is part of the inspection's cache key
    assert meta.source == "metadata.yaml" and meta.producer is None
    assert (meta.task, dict(meta.names), meta.imgsz) == ("detect", {0: "face"}, (240, 320))
    assert (meta.mean, meta.std, meta.letterbox, meta.pad_value) == ((127.0, 127.0, 127.0), (128.0,), False, None)


def test_a_models_own_metadata_wins_over_a_sidecar(tmp_path):
    model = shutil.copy(YOLO_POSE, tmp_path / "pose.onnx")
    (tmp_path / "metadata.yaml").write_text("task: detect\nnames: {0: cat}\n")
    meta = inspect_model(model).metadata
    assert meta.source == "onnx metadata_props" and meta.task == "pose" and dict(meta.names) == {0: "person"}


# --------------------------------------------------------------------------------- bad metadata

HOSTILE = [
    ("names", "'person'", "names"),
    ("names", "[['a'], 'b']", "names"),
    ("names", "{0: 'a', True: 'b'}", "names"),
    ("names", "{-1: 'a'}", "names"),
    ("imgsz", "[-1, 5]", "imgsz"),
    ("imgsz", "[640, 640, 3]", "imgsz"),
    ("imgsz", "__import__('os').system('true')", "imgsz"),
    ("stride", "1e9", "stride"),
    ("kpt_shape", "[17, 7]", "kpt_shape"),
    ("end2end", "maybe", "end2end"),
    ("std", "[0, 1, 1]", "std"),
    ("names", "{" + ", ".join(f"{i}: 'class {i}'" for i in range(150_000)) + "}", "characters long"),
    ("imgsz", "[" * 100_000, "characters long"),
    ("task", "segmentation-ish", "not a task edgeinfer knows"),
    ("task", "['detect']", "not a task edgeinfer knows"),
]


@pytest.mark.parametrize(("key", "value", "note"), HOSTILE,
                         ids=[f"{key}-{value[:16]}" for key, value, _ in HOSTILE])
def test_a_bad_value_is_noted_and_ignored(key, value, note):
    pairs = {"task": "detect", "names": "{0: 'person'}", "imgsz": "[640, 640]",
             key: value}
    meta = from_pairs(pairs, "onnx metadata_props")
    assert getattr(meta, key) in (None, {}, ())
    assert len(meta.notes) == 1 and note in meta.notes[0] and len(meta.notes[0]) < 300, meta.notes
    others = {"task": "detect", "names": {0: "person"}, "imgsz": (640, 640)}
    assert {k: v for k, v in _fields(meta, others).items() if k != key} == {k: v for k, v in others.items()
                                                                           if k != key}


def test_hostile_onnx_metadata_still_loads_and_runs(tmp_path):
    props = {"author": "Ultralytics", "task": "segmentation-ish", "names": "x" * 2_000_000, "imgsz": "[-1, 5]",
             "kpt_shape": "{'a': 1}", "args": "[" * 200_000}
    model = onnx_variant(tmp_path / "hostile.onnx", props=props)
    info = inspect_model(model)
    meta = info.metadata
    assert (meta.task, meta.names, meta.imgsz, meta.kpt_shape) == (None, {}, None, None)
    assert len(meta.notes) == 4 and set(meta.notes) <= set(info.notes)
    assert len(meta.raw["names"]) <= 4096
    with edgeinfer.load(model, "onnxruntime") as engine:
        assert engine.inputs[0].shape == (1, 3, 640, 640)


BILLION_LAUGHS = "\n".join([
    'a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]',
    *(f"{x}: &{x} [*{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}]" for p, x in zip("abcdefgh", "bcdefghi")),
    "names: *i", "imgsz: *i", "mean: *i", "task: detect", ""])


@pytest.mark.parametrize(("text", "expected_task", "note"), [
    (BILLION_LAUGHS, "detect", "'names'"),
    ("task: [detect\n", None, "cannot be read"),
    ("- detect\n- pose\n", None, "not a mapping"),
    ("task: 12\n", None, "not a task"),
], ids=["billion laughs", "syntax error", "a list", "a number"])
def test_hostile_sidecar_is_noted(tmp_path, text, expected_task, note):
    model = shutil.copy(MODELS / "ultraface_rfb_320.onnx", tmp_path / "faces.onnx")
    (tmp_path / "metadata.yaml").write_text(text)
    info = inspect_model(model)
    assert info.metadata.task == expected_task
    assert any(note in n for n in info.notes), info.notes
    assert all(len(n) < 400 for n in info.notes)
