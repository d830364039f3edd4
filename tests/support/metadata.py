"""Model variants the metadata tests build in their own folders, the way exporters write them."""

from __future__ import annotations

import json
import zipfile
from collections.abc import Mapping
from pathlib import Path

from .assets import ASSETS, LABELS, MODELS

YOLO_POSE = MODELS / "yolo11n-pose.onnx"
YOLO_FALL = MODELS / "yolo_fall_detection.onnx"
FALL_NAMES = {0: "Normal", 1: "Fall"}


def fall_reference(image: str) -> list[dict]:
    """Ultralytics' own detections of ``image`` with yolo_fall_detection.onnx (../shared/assets/references)."""
    data = json.loads((ASSETS / "references" / "yolo_fall_detection_ultralytics.json").read_text())
    return data["detections"][image]


def onnx_variant(path: Path, *, source: Path = YOLO_FALL, dynamic: bool = False,
                 props: Mapping[str, str] | None = None, drop: tuple[str, ...] = ()) -> Path:
    """A copy of ``source`` at ``path``: ``dynamic`` gives its first input symbolic batch, height and width (and
    its first output symbolic batch and anchors, as Ultralytics' ``dynamic=True`` export does); ``props``
    replace its metadata_props (None keeps them), less the keys in ``drop``."""
    import onnx

    model = onnx.load(str(source))
    if dynamic:
        dims = model.graph.input[0].type.tensor_type.shape.dim
        for index, name in ((0, "batch"), (2, "height"), (3, "width")):
            dims[index].dim_param = name  # setting dim_param clears dim_value (a protobuf oneof)
        out = model.graph.output[0].type.tensor_type.shape.dim
        out[0].dim_param, out[len(out) - 1].dim_param = "batch", "anchors"
    pairs = {p.key: p.value for p in model.metadata_props} if props is None else dict(props)
    del model.metadata_props[:]
    for key, value in pairs.items():
        if key not in drop:
            entry = model.metadata_props.add()
            entry.key, entry.value = key, value
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path


def ultralytics_ir(onnx_path: Path, folder: Path, labels: list[str], *, task: str = "detect") -> Path:
    """``onnx_path`` as an OpenVINO IR with the ``model_info`` Ultralytics' OpenVINO export writes
    (ultralytics/engine/exporter.py ``export_openvino``: model_type "YOLO" whatever the task, labels with
    ``_`` for spaces, grey 114 letterbox, scale 255)."""
    import openvino as ov

    model = ov.convert_model(str(onnx_path))
    info = {"model_type": "YOLO", "reverse_input_channels": True, "pad_value": 114, "scale_values": [255.0],
            "iou_threshold": 0.7, "labels": [name.replace(" ", "_") for name in labels]}
    if task != "classify":
        info["resize_type"] = "fit_to_window_letterbox"
    for key, value in info.items():
        model.set_rt_info(value, ["model_info", key])
    folder.mkdir(parents=True, exist_ok=True)
    ov.save_model(model, str(folder / "model.xml"))
    return folder / "model.xml"


def with_metadata_json(tflite: Path, metadata: Mapping | str) -> Path:
    """``metadata`` zipped onto the end of ``tflite`` as ``metadata.json``, as Ultralytics' TFLite export does
    (``zipfile.ZipFile(file, "a")``); a string is written as it is."""
    text = metadata if isinstance(metadata, str) else json.dumps(metadata, indent=2)
    with zipfile.ZipFile(tflite, "a", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("metadata.json", text)
    return tflite


def damage_member(archive_path: Path, member: str) -> None:
    """Flip bytes in the middle of ``member``'s compressed data (its CRC, or the deflate stream, fails)."""
    with zipfile.ZipFile(archive_path) as archive:
        info = archive.getinfo(member)
    data = bytearray(archive_path.read_bytes())
    header = info.header_offset
    name_length = int.from_bytes(data[header + 26:header + 28], "little")
    extra_length = int.from_bytes(data[header + 28:header + 30], "little")
    start = header + 30 + name_length + extra_length
    middle = start + info.compress_size // 2
    for i in range(middle, middle + 8):
        data[i] ^= 0x5A
    archive_path.write_bytes(bytes(data))


def ssd_with_coco_names(folder: Path) -> Path:
    """A copy of the Coral SSD in ``folder`` with COCO's names zipped onto it (Ultralytics' form): a model that
    says its own classes, as the models the fleet deploys do (no labels file beside it)."""
    import shutil

    lines = (LABELS / "coco_labels.txt").read_text().splitlines()
    folder.mkdir(parents=True, exist_ok=True)
    model = Path(shutil.copy(MODELS / "mobilenet_ssd_v2_coco_quant_postprocess.tflite", folder))
    return with_metadata_json(model, {"task": "detect", "names": {str(i): name for i, name in enumerate(lines)}})
