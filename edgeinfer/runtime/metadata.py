"""What a model says about itself: task, class names, input size, normalisation, read from the file.

Exporters leave this where each format keeps free-form metadata:

* ONNX: ``metadata_props`` (Ultralytics writes ``task``, ``names``, ``imgsz``, ``stride``, ``kpt_shape``,
  ``end2end``, ``args`` — values as Python literals);
* TFLite: a ``metadata.json`` zipped onto the end of the flatbuffer (Ultralytics' TFLite exports);
* OpenVINO IR: the ``<rt_info><model_info>`` of the XML (``labels``, ``model_type``, ``pad_value``,
  ``scale_values``) and the ``metadata.yaml`` Ultralytics writes beside the model (any format).

Values are read with :func:`ast.literal_eval` and checked; one that does not read as what its key means is
left out and named in :attr:`ModelMetadata.notes` — a model's metadata never stops it from loading.
"""

from __future__ import annotations

import ast
import json
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: Ultralytics' task words, as edgeinfer's tasks
_TASKS = {"detect": "detect", "segment": "segment", "pose": "pose", "obb": "obb", "classify": "classify"}
#: the folder file Ultralytics writes beside an exported model
SIDECAR = "metadata.yaml"
#: values longer than this are not parsed (a hostile file with a huge literal)
_MAX_VALUE = 1 << 20


@dataclass(frozen=True)
class ModelMetadata:
    """What the model file (or its exporter's sidecar) states; every field None / empty when it says nothing."""

    #: where it was read: "onnx metadata_props", "tflite metadata.json", "openvino rt_info", "metadata.yaml"
    source: str | None = None
    #: who made the model, when it says ("ultralytics")
    producer: str | None = None
    #: edgeinfer's task word (detect, segment, pose, obb, classify)
    task: str | None = None
    #: class id -> name
    names: Mapping[int, str] = field(default_factory=dict)
    #: the input size it was exported for, (height, width)
    imgsz: tuple[int, int] | None = None
    stride: int | None = None
    #: keypoints per instance and values per keypoint (2: x, y; 3: x, y, visibility)
    kpt_shape: tuple[int, int] | None = None
    #: the graph ends in its own detection selection (YOLOv10 / YOLO26, ``nms=True`` exports): rows of boxes
    end2end: bool | None = None
    #: per-channel normalisation ``(pixel - mean) / std`` the model expects, RGB order
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None
    #: frames are letterboxed (aspect kept, padded with ``pad_value``) rather than stretched
    letterbox: bool | None = None
    pad_value: int | None = None
    #: the key/value pairs as read
    raw: Mapping[str, str] = field(default_factory=dict)
    #: what could not be read, in words
    notes: tuple[str, ...] = ()

    @property
    def empty(self) -> bool:
        return self.source is None

    def to_dict(self) -> dict:
        """JSON-ready: what ``edgeinfer info --json`` prints (``raw`` left out: ``args`` can be long)."""
        return {"source": self.source, "producer": self.producer, "task": self.task,
                "names": {str(k): v for k, v in self.names.items()},
                "imgsz": list(self.imgsz) if self.imgsz else None, "stride": self.stride,
                "kpt_shape": list(self.kpt_shape) if self.kpt_shape else None, "end2end": self.end2end,
                "mean": list(self.mean) if self.mean else None, "std": list(self.std) if self.std else None,
                "letterbox": self.letterbox, "pad_value": self.pad_value, "notes": list(self.notes)}


# --------------------------------------------------------------------------------------- values

def _literal(value: Any) -> Any:
    """A metadata value as Python data: literals (``"{0: 'person'}"``, ``"[640, 640]"``) parsed, others kept."""
    if not isinstance(value, str):
        return value
    text = value.strip()
    if not text or len(text) > _MAX_VALUE:
        return text
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError, TypeError):
        lowered = text.lower()
        return {"true": True, "false": False}.get(lowered, text)


def _names(value: Any) -> dict[int, str] | None:
    value = _literal(value)
    if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        return dict(enumerate(value))
    if isinstance(value, Mapping):
        try:
            names = {int(k): str(v) for k, v in value.items()}
        except (TypeError, ValueError):
            return None
        return names if all(k >= 0 for k in names) else None
    return None


def _size(value: Any) -> tuple[int, int] | None:
    value = _literal(value)
    if isinstance(value, int) and not isinstance(value, bool):
        value = (value, value)
    if (isinstance(value, (list, tuple)) and len(value) == 2
            and all(isinstance(v, int) and not isinstance(v, bool) and 0 < v <= 16384 for v in value)):
        return int(value[0]), int(value[1])
    return None


def _positive_int(value: Any) -> int | None:
    value = _literal(value)
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 < value <= 4096 else None


def _bool(value: Any) -> bool | None:
    value = _literal(value)
    return value if isinstance(value, bool) else None


def _floats(value: Any) -> tuple[float, ...] | None:
    value = _literal(value)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        value = (value,)
    if isinstance(value, (list, tuple)) and value and all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in value):
        return tuple(float(v) for v in value)
    return None


def from_pairs(pairs: Mapping[str, Any], source: str) -> ModelMetadata:
    """Metadata from an exporter's key/value pairs (Ultralytics' keys; a value that does not read is noted)."""
    raw = {str(k): (v if isinstance(v, str) else json.dumps(v, default=str)) for k, v in pairs.items()}
    notes: list[str] = []
    found: dict[str, Any] = {}
    readers = {"names": _names, "imgsz": _size, "stride": _positive_int, "kpt_shape": _size, "end2end": _bool}
    for key, reader in readers.items():
        if key in pairs:
            value = reader(pairs[key])
            if value is None:
                notes.append(f"metadata {key!r} = {raw[key][:80]!r} is not what {key} means: ignored")
            else:
                found[key] = value
    task = pairs.get("task")
    if task is not None:
        if str(task) in _TASKS:
            found["task"] = _TASKS[str(task)]
        else:
            notes.append(f"metadata task {str(task)[:40]!r} is not a task edgeinfer knows: ignored")
    args = _literal(pairs.get("args", ""))
    if found.get("end2end") is None and isinstance(args, Mapping) and args.get("nms") is True:
        found["end2end"] = True  # exported with nms=True: the graph selects its detections itself
    author = str(pairs.get("author", "")) + str(pairs.get("docs", ""))
    producer = "ultralytics" if "ultralytics" in author.lower() else None
    if producer:  # Ultralytics' preprocessing: RGB in [0, 1], letterboxed with grey 114
        found.update(mean=(0.0, 0.0, 0.0), std=(255.0, 255.0, 255.0), letterbox=True, pad_value=114)
    return ModelMetadata(source=source, producer=producer, raw=raw, notes=tuple(notes), **found)


# -------------------------------------------------------------------------------------- formats

def _from_zip(path: Path) -> dict | None:
    """The ``metadata.json`` zipped onto a .tflite (ZipFile finds the archive from its end record)."""
    try:
        with zipfile.ZipFile(path) as archive:
            names = [n for n in archive.namelist() if n.endswith("metadata.json")]
            if not names or archive.getinfo(names[0]).file_size > _MAX_VALUE:
                return None
            data = json.loads(archive.read(names[0]).decode("utf-8"))
    except (zipfile.BadZipFile, OSError, KeyError, UnicodeDecodeError, ValueError, RecursionError):
        return None
    return data if isinstance(data, dict) else None


def _from_yaml(path: Path) -> dict | None:
    sidecar = path.parent / SIDECAR
    if not sidecar.is_file() or sidecar.stat().st_size > _MAX_VALUE:
        return None
    import yaml

    try:
        data = yaml.safe_load(sidecar.read_text(encoding="utf-8"))
    except (yaml.YAMLError, OSError, UnicodeDecodeError):
        return None
    return data if isinstance(data, dict) else None


def _from_rt_info(root: Any) -> dict | None:
    """OpenVINO's ``<rt_info><model_info>``: Ultralytics' ``labels`` (space-separated), ``model_type``,
    ``pad_value``, ``scale_values``."""
    info = root.find("rt_info/model_info")
    if info is None:
        return None
    values = {child.tag: child.get("value", "") for child in info}
    pairs: dict[str, Any] = {}
    if values.get("labels"):
        pairs["names"] = dict(enumerate(values["labels"].split()))
    model_type = values.get("model_type", "").lower()
    if model_type:
        pairs["author"] = "Ultralytics" if "yolo" in model_type else ""
        for word, task in (("seg", "segment"), ("pose", "pose"), ("obb", "obb")):
            if word in model_type:
                pairs["task"] = task
        pairs.setdefault("task", "detect" if "yolo" in model_type else None)
    return {k: v for k, v in pairs.items() if v is not None} or None


def read_metadata(path: str | Path, fmt: str, *, onnx_props: Mapping[str, str] | None = None,
                  xml_root: Any = None) -> ModelMetadata:
    """What the model at ``path`` (of format ``fmt``, a :class:`~.model.ModelFormat` value) states: from the
    file first (``onnx_props`` read with the graph, the IR's parsed ``xml_root``), else ``metadata.yaml`` beside
    it, else nothing."""
    path = Path(path)
    pairs: dict | None = None
    source = None
    if onnx_props:
        pairs, source = dict(onnx_props), "onnx metadata_props"
    elif fmt in ("tflite", "edgetpu-tflite"):
        pairs, source = _from_zip(path), "tflite metadata.json"
    elif xml_root is not None:
        pairs, source = _from_rt_info(xml_root), "openvino rt_info"
    if not pairs:
        pairs, source = _from_yaml(path), SIDECAR
    return from_pairs(pairs, source) if pairs else ModelMetadata()
