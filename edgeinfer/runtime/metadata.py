"""What a model says about itself: task, class names, input size, normalisation, read from the file.

Exporters leave this where each format keeps free-form metadata:

* ONNX: ``metadata_props`` (Ultralytics writes ``task``, ``names``, ``imgsz``, ``stride``, ``kpt_shape``,
  ``end2end``, ``args`` — values as Python literals);
* TFLite: a ``metadata.json`` zipped onto the end of the flatbuffer (Ultralytics' TFLite exports);
* OpenVINO IR: the ``<rt_info>`` of the XML — ``<framework>`` holds the ``metadata_props`` of the ONNX model it
  was converted from, ``<model_info>`` what OpenVINO's Model API reads (``labels``, ``model_type``,
  ``pad_value``, ``mean_values``, ``scale_values``, ``resize_type``; Ultralytics' OpenVINO export writes it);
* any format: the ``metadata.yaml`` Ultralytics writes beside a model it exports to a folder, which is also
  where a user states what a model of their own does not (the keys above, and edgeinfer's ``mean``, ``std``,
  ``letterbox``, ``pad_value``, ``anchors``, ``channels`` — ``rgb`` or ``bgr`` — and ``pad`` — ``centre`` or
  ``corner``).

Values are read with :func:`ast.literal_eval` and checked; one that does not read as what its key means is
left out and named in :attr:`ModelMetadata.notes` — a model's metadata never stops it from loading. The two
words that say how frames are fed and have no safe default to fall back to, ``channels`` and ``pad``, are
also kept in :attr:`ModelMetadata.refused`: a pipeline will not guess them (``tasks.read_model`` raises
``ModelError`` naming the key), while ``edgeinfer info`` still shows the model and the note. Their choices are
:data:`CHANNEL_ORDERS` and :data:`PAD_PLACES`, the ones ``--channels``, ``--pad`` and agent.yaml take.
"""

from __future__ import annotations

import ast
import json
import reprlib
import zipfile
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: Ultralytics' task words, as edgeinfer's tasks
_TASKS = {"detect": "detect", "segment": "segment", "pose": "pose", "obb": "obb", "classify": "classify"}
#: the folder file Ultralytics writes beside an exported model
SIDECAR = "metadata.yaml"
#: the longest class-name table (or ``args``) read; a sidecar or zipped file larger than this is not read
_MAX_VALUE = 1 << 20
#: a size, a number or a flag longer than this is not one (and is not parsed)
_MAX_SMALL = 256
#: the characters of a value kept in :attr:`ModelMetadata.raw`
_MAX_RAW = 4096
_ULTRALYTICS_PAD = 114
#: the channel orders a model can take its pixels in (OpenCV's frames are BGR)
CHANNEL_ORDERS = ("rgb", "bgr")
#: where a letterbox puts the image: in the middle of the border (Ultralytics, MediaPipe), or at the top-left
#: corner with all the border bottom-right (YOLOX)
PAD_PLACES = ("centre", "corner")
#: the keys a pipeline refuses to run with when they do not read (see the module's docstring)
FEED_WORDS = ("channels", "pad")


@dataclass(frozen=True)
class ModelMetadata:
    """What the model file (or its exporter's sidecar) states; every field None / empty when it says nothing."""

    #: where it was read: "onnx metadata_props", "tflite metadata.json", "openvino rt_info", "metadata.yaml"
    #: (two joined by " + " when an IR's rt_info and its sidecar both said something)
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
    #: the channel order the model takes (:data:`CHANNEL_ORDERS`)
    channels: str | None = None
    #: where the letterbox's border goes (:data:`PAD_PLACES`)
    pad: str | None = None
    #: the SSD anchor scheme, as MediaPipe's SsdAnchorsCalculator options (``strides``, ...): kept as stated and
    #: checked by the decoder that uses it (pipeline/decoders/anchor_schemes.py), which names a wrong key
    anchors: Any = None
    #: the key/value pairs as read (a value cut at 4096 characters)
    raw: Mapping[str, str] = field(default_factory=dict)
    #: what could not be read, in words
    notes: tuple[str, ...] = ()
    #: each of :data:`FEED_WORDS` that did not read, and its note: a pipeline refuses the model while it stands
    refused: Mapping[str, str] = field(default_factory=dict)

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
                "letterbox": self.letterbox, "pad_value": self.pad_value, "channels": self.channels,
                "pad": self.pad, "anchors": _plain(self.anchors), "notes": list(self.notes)}


# --------------------------------------------------------------------------------------- values

def _literal(value: Any) -> Any:
    """A metadata value as Python data: literals (``"{0: 'person'}"``, ``"[640, 640]"``) parsed, others kept.
    Callers bound the length first: a literal is parsed in time and memory that grow with it."""
    if not isinstance(value, str):
        return value
    text = value.strip()
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError, TypeError):
        return {"true": True, "false": False, "yes": True, "no": False}.get(text.lower(), text)


def _integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _class_id(key: Any) -> int | None:
    """A class id: an int, or the digits JSON keeps keys as (``"0"``); bools and floats are not ids."""
    if _integer(key):
        return key if key >= 0 else None
    if isinstance(key, str) and key.strip().isdigit():
        return int(key)
    return None


def _names(value: Any) -> dict[int, str] | None:
    value = _literal(value)
    if isinstance(value, (list, tuple)):
        value = dict(enumerate(value))
    if not isinstance(value, Mapping) or not value:
        return None
    names = {}
    for key, name in value.items():
        class_id = _class_id(key)
        # a name is text (YAML reads an unquoted class called 1 as a number): a list or a dict is not one
        if class_id is None or not isinstance(name, (str, int, float)) or isinstance(name, bool):
            return None
        names[class_id] = str(name)
    return names


def _size(value: Any) -> tuple[int, int] | None:
    value = _literal(value)
    if _integer(value):
        value = (value, value)
    if (isinstance(value, (list, tuple)) and len(value) == 2
            and all(_integer(v) and 0 < v <= 16384 for v in value)):
        return int(value[0]), int(value[1])
    return None


def _kpt_shape(value: Any) -> tuple[int, int] | None:
    value = _literal(value)
    if isinstance(value, (list, tuple)) and len(value) == 2 and all(_integer(v) for v in value) \
            and 0 < value[0] <= 1000 and value[1] in (2, 3):
        return int(value[0]), int(value[1])
    return None


def _positive_int(value: Any) -> int | None:
    value = _literal(value)
    return value if _integer(value) and 0 < value <= 4096 else None


def _pixel(value: Any) -> int | None:
    value = _literal(value)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return value if _integer(value) and 0 <= value <= 255 else None


def _bool(value: Any) -> bool | None:
    value = _literal(value)
    return value if isinstance(value, bool) else None


def _floats(value: Any) -> tuple[float, ...] | None:
    """One number per channel, or one for all: a literal, or OpenVINO's ``"123.7 116.3 103.5"``."""
    value = _literal(value)
    if isinstance(value, str):
        value = value.replace(",", " ").split()
        try:
            value = [float(v) for v in value]
        except ValueError:
            return None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        value = (value,)
    if isinstance(value, (list, tuple)) and len(value) in (1, 3) and all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and abs(v) < 1e6 for v in value):
        return tuple(float(v) for v in value)
    return None


def _std(value: Any) -> tuple[float, ...] | None:
    values = _floats(value)
    return values if values and all(v > 0 for v in values) else None


def _word(choices: tuple[str, ...]) -> Callable[[Any], str | None]:
    """One of ``choices``, in any case."""
    def read(value: Any) -> str | None:
        word = value.strip().lower() if isinstance(value, str) else None
        return word if word in choices else None

    return read


def channel_count(value: Any) -> bool:
    """Whether a ``channels`` value is a number of channels (Ultralytics writes ``channels: 3``), which says nothing
    of their order."""
    return _integer(_literal(value)) if isinstance(value, (str, int)) and not isinstance(value, bool) else False


#: key -> (reader, the longest text read, what the value must be)
_READERS: dict[str, tuple[Callable[[Any], Any], int, str]] = {
    "names": (_names, _MAX_VALUE, "a mapping of class ids to names"),
    "imgsz": (_size, _MAX_SMALL, "an input size: [height, width] in 1..16384"),
    "stride": (_positive_int, _MAX_SMALL, "a positive integer"),
    "kpt_shape": (_kpt_shape, _MAX_SMALL, "a keypoint shape: [keypoints, 2 or 3]"),
    "end2end": (_bool, _MAX_SMALL, "true or false"),
    "mean": (_floats, _MAX_SMALL, "one number, or one per channel"),
    "std": (_std, _MAX_SMALL, "one positive number, or one per channel"),
    "letterbox": (_bool, _MAX_SMALL, "true or false"),
    "pad_value": (_pixel, _MAX_SMALL, "a pixel value in 0..255"),
    "channels": (_word(CHANNEL_ORDERS), _MAX_SMALL, f"one of {', '.join(CHANNEL_ORDERS)}"),
    "pad": (_word(PAD_PLACES), _MAX_SMALL, f"one of {', '.join(PAD_PLACES)}"),
}
_shown = reprlib.Repr()
_shown.maxlevel, _shown.maxdict, _shown.maxlist, _shown.maxstring, _shown.maxother = 3, 64, 64, 200, 200


def _text(value: Any) -> str:
    """A value as text for ``raw`` and notes, bounded (a YAML file's aliases can nest a value exponentially)."""
    return value[:_MAX_RAW] if isinstance(value, str) else _shown.repr(value)


def _read_value(key: str, value: Any, notes: list[str]) -> Any:
    reader, limit, meaning = _READERS[key]
    if isinstance(value, str) and len(value) > limit:
        notes.append(f"metadata {key!r} is {len(value):,} characters long (at most {limit:,} are read): ignored")
        return None
    read = reader(value)
    if read is None:
        notes.append(f"metadata {key!r} = {_text(value)[:80]!r} is not {meaning}: ignored")
    return read


def _anchors(value: Any, notes: list[str]) -> Any:
    """An ``anchors`` value as data (a literal parsed), bounded like a small value; checked where it is used."""
    if isinstance(value, str) and len(value) > _MAX_SMALL * 16:
        notes.append(f"metadata 'anchors' is {len(value):,} characters long (at most {_MAX_SMALL * 16:,} are read): "
                     "ignored")
        return None
    return _literal(value)


def _plain(value: Any, depth: int = 3) -> Any:
    """``value`` as JSON can hold it (a YAML mapping's values kept, 3 levels and 64 items deep; anything else,
    or deeper, as text: a YAML file's aliases can make a value that holds itself)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if depth and isinstance(value, Mapping):
        return {str(k): _plain(v, depth - 1) for k, v in list(value.items())[:64]}
    if depth and isinstance(value, (list, tuple)):
        return [_plain(v, depth - 1) for v in value[:64]]
    return _text(value)


def _task(value: Any, notes: list[str]) -> str | None:
    word = value.strip().lower() if isinstance(value, str) else None
    if word in _TASKS:
        return _TASKS[word]
    notes.append(f"metadata 'task' = {_text(value)[:40]!r} is not a task edgeinfer knows "
                 f"({', '.join(_TASKS)}): ignored")
    return None


def _exported_with_nms(args: Any) -> bool:
    """Ultralytics' ``args`` say ``nms=True``: the graph selects its detections itself."""
    if isinstance(args, str) and len(args) > _MAX_VALUE:
        return False
    args = _literal(args)
    return isinstance(args, Mapping) and args.get("nms") is True


def is_rtdetr(pairs: Mapping[str, Any]) -> bool:
    """Whether Ultralytics' pairs describe an RT-DETR (its description names the model's yaml or weights)."""
    text = f"{_text(pairs.get('description', ''))} {_text(pairs.get('model_type', ''))}".lower()
    return "rtdetr" in text or "rt-detr" in text


def from_pairs(pairs: Mapping[str, Any], source: str, notes: tuple[str, ...] = ()) -> ModelMetadata:
    """Metadata from an exporter's key/value pairs (Ultralytics' keys; a value that does not read is noted).
    ``notes`` are what reading the pairs already found wrong."""
    found_notes = list(notes)
    found: dict[str, Any] = {}
    refused: dict[str, str] = {}
    for key in _READERS:
        if key not in pairs or (key == "channels" and channel_count(pairs[key])):
            continue
        if (value := _read_value(key, pairs[key], found_notes)) is not None:
            found[key] = value
        elif key in FEED_WORDS:
            refused[key] = found_notes[-1]
    if pairs.get("task") is not None and (task := _task(pairs["task"], found_notes)) is not None:
        found["task"] = task
    if found.get("end2end") is None and _exported_with_nms(pairs.get("args")):
        found["end2end"] = True
    author = f"{_text(pairs.get('author', ''))} {_text(pairs.get('docs', ''))}"
    producer = "ultralytics" if "ultralytics" in author.lower() else None
    if producer and is_rtdetr(pairs):  # Ultralytics' RT-DETR: no NMS, and frames stretched, not letterboxed
        found.setdefault("end2end", False)
        found.setdefault("letterbox", False)
    if producer:  # Ultralytics' preprocessing, where the pairs do not say: RGB in [0, 1], letterboxed in grey, centred
        classify = found.get("task") == "classify"  # its classifiers resize and crop
        for key, value in (("mean", (0.0, 0.0, 0.0)), ("std", (255.0, 255.0, 255.0)), ("channels", "rgb"),
                           ("letterbox", not classify), ("pad_value", None if classify else _ULTRALYTICS_PAD),
                           ("pad", None if classify else "centre")):
            found.setdefault(key, value)
    if "anchors" in pairs:
        found["anchors"] = _anchors(pairs["anchors"], found_notes)
    if ("mean" in found) != ("std" in found):  # one stated: the other is the identity (OpenVINO's convention)
        found.setdefault("mean", (0.0,))
        found.setdefault("std", (1.0,))
    raw = {str(k): _text(v) for k, v in pairs.items()}
    return ModelMetadata(source=source, producer=producer, raw=raw, notes=tuple(found_notes), refused=refused,
                         **found)


# -------------------------------------------------------------------------------------- formats

def _from_zip(path: Path, notes: list[str]) -> dict | None:
    """The ``metadata.json`` zipped onto a .tflite (ZipFile finds the archive from its end record). A file
    with no zip says nothing; a zip that cannot be read is noted."""
    if not zipfile.is_zipfile(path):
        return None
    try:
        with zipfile.ZipFile(path) as archive:
            names = [n for n in archive.namelist() if n.rsplit("/", 1)[-1] == "metadata.json"]
            if not names:
                return None
            if archive.getinfo(names[0]).file_size > _MAX_VALUE:
                notes.append(f"the zipped {names[0]} is larger than {_MAX_VALUE:,} bytes: not read")
                return None
            data = json.loads(archive.read(names[0]).decode("utf-8"))
    # a corrupt archive raises any of these (zlib.error from a damaged deflate stream, RuntimeError when
    # encrypted, NotImplementedError for an unknown compression)
    except (zipfile.BadZipFile, zlib.error, OSError, EOFError, KeyError, UnicodeDecodeError, ValueError,
            RecursionError, RuntimeError, NotImplementedError) as exc:
        notes.append(f"the zip appended to the model cannot be read ({type(exc).__name__}: {exc}): "
                     "its metadata.json ignored")
        return None
    if not isinstance(data, dict):
        notes.append("the zipped metadata.json is not a JSON object: ignored")
        return None
    return data


def _from_yaml(path: Path, notes: list[str]) -> dict | None:
    sidecar = path.parent / SIDECAR
    if not sidecar.is_file():
        return None
    if sidecar.stat().st_size > _MAX_VALUE:
        notes.append(f"{sidecar} is larger than {_MAX_VALUE:,} bytes: not read")
        return None
    import yaml

    try:
        data = yaml.safe_load(sidecar.read_text(encoding="utf-8"))
    except (yaml.YAMLError, OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        notes.append(f"{sidecar} cannot be read ({first}): ignored")
        return None
    if not isinstance(data, dict):
        notes.append(f"{sidecar} is not a mapping of keys to values: ignored")
        return None
    return data


_RESIZE_TYPES = {"fit_to_window_letterbox": True, "standard": False}


def _model_info_pairs(info: Any) -> dict[str, Any]:
    """OpenVINO Model API's ``<model_info>`` as pairs: ``labels`` (space-separated; Ultralytics writes its names
    with ``_`` for spaces), ``model_type`` (Ultralytics writes ``YOLO`` whatever the task), ``pad_value``,
    ``mean_values`` / ``scale_values``, ``resize_type``."""
    values = {child.tag: child.get("value", "") for child in info}
    pairs: dict[str, Any] = {}
    if values.get("labels"):
        pairs["names"] = values["labels"].split()
    model_type = values.get("model_type", "").lower()
    if "yolo" in model_type:
        pairs["author"] = "Ultralytics"
    for word, task in (("seg", "segment"), ("pose", "pose"), ("obb", "obb"), ("cls", "classify")):
        if word in model_type:
            pairs["task"] = task
    for key, name in (("pad_value", "pad_value"), ("mean_values", "mean"), ("scale_values", "std")):
        if values.get(key):
            pairs[name] = values[key]
    if values.get("resize_type") in _RESIZE_TYPES:
        pairs["letterbox"] = _RESIZE_TYPES[values["resize_type"]]
    reverse = _bool(values.get("reverse_input_channels", ""))
    if reverse is not None:
        pairs["channels"] = "rgb" if reverse else "bgr"
    return pairs


def _from_rt_info(root: Any) -> dict | None:
    """An IR's ``<rt_info>``: ``<model_info>``, then ``<framework>`` (the source ONNX model's own
    ``metadata_props``, complete where ``model_info`` is lossy) over it."""
    pairs: dict[str, Any] = {}
    info = root.find("rt_info/model_info")
    if info is not None:
        pairs.update(_model_info_pairs(info))
    framework = root.find("rt_info/framework")
    if framework is not None:
        pairs.update({child.tag: child.get("value", "") for child in framework})
    return pairs or None


def _known(pairs: Mapping[str, Any] | None) -> bool:
    """Whether ``pairs`` hold a key edgeinfer reads (a graph's metadata_props often hold only a converter's)."""
    return bool(pairs) and any(key in pairs for key in (*_READERS, "task", "author", "args", "anchors"))


def read_metadata(path: str | Path, fmt: str, *, onnx_props: Mapping[str, str] | None = None,
                  xml_root: Any = None) -> ModelMetadata:
    """What the model at ``path`` (of format ``fmt``, a :class:`~.model.ModelFormat` value) states: from the
    file (``onnx_props`` read with the graph, the IR's parsed ``xml_root``), else ``metadata.yaml`` beside it,
    else nothing. An IR's rt_info and its sidecar are merged, the sidecar's values first: Ultralytics writes
    both, and its ``model_info`` labels have ``_`` for spaces."""
    path = Path(path)
    notes: list[str] = []
    own: dict | None = None
    source = None
    if onnx_props:
        own, source = dict(onnx_props), "onnx metadata_props"
    elif fmt in ("tflite", "edgetpu-tflite"):
        own, source = _from_zip(path, notes), "tflite metadata.json"
    elif xml_root is not None:
        own, source = _from_rt_info(xml_root), "openvino rt_info"
    if not _known(own):
        own = None
    if own is None or xml_root is not None:
        sidecar = _from_yaml(path, notes)
        if _known(sidecar):
            own, source = ({**own, **sidecar}, f"{source} + {SIDECAR}") if own else (sidecar, SIDECAR)
    if own is None:
        return ModelMetadata(notes=tuple(notes))
    return from_pairs(own, source, tuple(notes))
