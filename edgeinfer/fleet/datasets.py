"""Samples as datasets for the labelling tools teams already use, and their corrected labels back.

Export (a zip, ``GET /api/samples/export``; ``edgeinfer fleet dataset export``), each sample's JPEG at
``images/<device>/<sample>.jpg`` and its boxes — the corrected ``labels`` where a person set them, else the
model's ``detections``:

- ``coco``: ``annotations.json`` (COCO detection: ``bbox`` is x, y, width, height in pixels; categories
  numbered from 1 in the order of their names; a prediction's ``score`` kept);
- ``yolo``: Ultralytics' layout — ``labels/<device>/<sample>.txt`` (``class cx cy w h``, normalised to
  0..1), ``data.yaml`` (``names``, classes numbered from 0);
- ``label-studio``: ``tasks.json``, one task per sample with the model's detections as ``predictions``
  (rectanglelabels in percent of the image, ``from_name`` "label", ``to_name`` "image") and the corrected
  labels, if any, as ``annotations``.

Import (``POST /api/samples/import``): a COCO ``annotations.json`` or a zip of YOLO ``labels/**.txt`` with
its ``data.yaml``, matched to the samples by file name; every file is checked before anything is stored
(``DatasetError`` names the first fault; a file naming no stored sample is a ``LookupError``), and all the samples
change in one transaction.
"""

from __future__ import annotations

import io
import json
import math
import re
import zipfile
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from ..errors import DatasetError

FORMATS = ("coco", "yolo", "label-studio")
IMPORT_FORMATS = ("coco", "yolo")
#: the largest import this manager parses (a label file is text: far below this)
MAX_IMPORT_BYTES = 64 << 20
#: a name in ``data.yaml``'s names: ``  0: "person"`` or ``- person``
_NAME_LINE = re.compile(r"^\s*(?:(\d+)\s*:|-)\s*(.+?)\s*$")


def file_stem(sample: dict) -> str:
    return f"{sample['device_id']}/{sample['sample_id']}"


def boxes_of(sample: dict) -> list[dict]:
    """The boxes a dataset gets: the corrected labels where set, else the model's detections."""
    labels = sample.get("labels")
    return list(labels if labels is not None else sample.get("detections") or [])


def categories(samples: Sequence[dict]) -> list[str]:
    return sorted({str(box["label"]) for sample in samples for box in boxes_of(sample)})


# -------------------------------------------------------------------------------------------- export
def coco(samples: Sequence[dict]) -> dict[str, Any]:
    """A COCO detection document of ``samples``."""
    names = categories(samples)
    ids = {name: index + 1 for index, name in enumerate(names)}
    images, annotations = [], []
    for image_id, sample in enumerate(samples, start=1):
        images.append({"id": image_id, "file_name": f"{file_stem(sample)}.jpg", "width": sample["width"],
                       "height": sample["height"], "date_captured": sample["captured_at"]})
        for box in boxes_of(sample):
            x1, y1, x2, y2 = box["box"]
            entry = {"id": len(annotations) + 1, "image_id": image_id, "category_id": ids[box["label"]],
                     "bbox": [x1, y1, x2 - x1, y2 - y1], "area": (x2 - x1) * (y2 - y1), "iscrowd": 0}
            if box.get("score") is not None:
                entry["score"] = box["score"]
            annotations.append(entry)
    return {"info": {"description": "edgeinfer samples"}, "images": images, "annotations": annotations,
            "categories": [{"id": ids[name], "name": name, "supercategory": ""} for name in names]}


def yolo_lines(sample: dict, ids: dict[str, int]) -> str:
    """A sample's YOLO label file: ``class cx cy w h`` a box, normalised by the frame's size."""
    width, height = sample["width"], sample["height"]
    lines = []
    for box in boxes_of(sample):
        x1, y1, x2, y2 = box["box"]
        lines.append(f"{ids[box['label']]} {(x1 + x2) / 2 / width:.6f} {(y1 + y2) / 2 / height:.6f} "
                     f"{(x2 - x1) / width:.6f} {(y2 - y1) / height:.6f}")
    return "".join(line + "\n" for line in lines)


def data_yaml(names: Sequence[str]) -> str:
    """Ultralytics' dataset file (JSON strings are YAML strings: any label survives quoting)."""
    listed = "".join(f"  {index}: {json.dumps(name)}\n" for index, name in enumerate(names))
    return f"path: .\ntrain: images\nval: images\nnames:\n{listed}"


def _rectangles(sample: dict, boxes: Iterable[dict]) -> list[dict]:
    width, height = sample["width"], sample["height"]
    result = []
    for index, box in enumerate(boxes):
        x1, y1, x2, y2 = box["box"]
        entry = {"id": f"b{index}", "type": "rectanglelabels", "from_name": "label", "to_name": "image",
                 "original_width": width, "original_height": height, "image_rotation": 0,
                 "value": {"x": 100 * x1 / width, "y": 100 * y1 / height, "width": 100 * (x2 - x1) / width,
                           "height": 100 * (y2 - y1) / height, "rotation": 0, "rectanglelabels": [box["label"]]}}
        if box.get("score") is not None:
            entry["score"] = box["score"]
        result.append(entry)
    return result


def label_studio(samples: Sequence[dict]) -> list[dict]:
    """Label Studio tasks: the image, the model's detections as a prediction, corrected labels as annotation."""
    tasks = []
    for sample in samples:
        scores = [d["score"] for d in sample["detections"] if d.get("score") is not None]
        task: dict[str, Any] = {
            "data": {"image": f"images/{file_stem(sample)}.jpg", "device_id": sample["device_id"],
                     "sample_id": sample["sample_id"]},
            "predictions": [{"model_version": sample["model_version"] or sample["model_name"],
                             "score": min(scores) if scores else None,
                             "result": _rectangles(sample, sample["detections"])}]}
        if sample.get("labels") is not None:
            task["annotations"] = [{"result": _rectangles(sample, sample["labels"])}]
        tasks.append(task)
    return tasks


def export_zip(samples: Sequence[dict], fmt: str, out: Any, jpeg_of: Callable[[dict], bytes]) -> None:
    """Write ``samples`` as a ``fmt`` dataset, zipped, to the binary file ``out``; ``jpeg_of``: a sample's JPEG
    (read one at a time: an export never holds every frame in memory)."""
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as archive:  # JPEGs do not compress
        for sample in samples:
            archive.writestr(f"images/{file_stem(sample)}.jpg", jpeg_of(sample))
        if fmt == "coco":
            archive.writestr("annotations.json", json.dumps(coco(samples), indent=1))
        elif fmt == "yolo":
            names = categories(samples)
            ids = {name: index for index, name in enumerate(names)}
            archive.writestr("data.yaml", data_yaml(names))
            for sample in samples:
                archive.writestr(f"labels/{file_stem(sample)}.txt", yolo_lines(sample, ids))
        else:
            archive.writestr("tasks.json", json.dumps(label_studio(samples), indent=1))


# -------------------------------------------------------------------------------------------- import
def sample_file_pattern(suffix: str) -> str:
    """How an imported file names its sample, ``[./][images/|labels/]<device>/<sample><suffix>`` (``/`` or ``\\``),
    as a regular expression: what the import reads, and what the OpenAPI document says it reads."""
    return rf"^(?:\.[/\\])?(?:(?:images|labels)[/\\])?([^/\\]+)[/\\]([^/\\]+){re.escape(suffix)}$"


def _key_of(file_name: str, suffix: str) -> tuple[str, str]:
    """(device_id, sample_id) of ``[images/|labels/]<device>/<sample><suffix>``."""
    match = re.match(sample_file_pattern(suffix), file_name)
    if match is None:
        raise DatasetError(f"{file_name!r} is not <device>/<sample>{suffix}: exported by edgeinfer?")
    return match.group(1), match.group(2)


def _box(label: Any, x: float, y: float, w: float, h: float, where: str) -> dict:
    values = (x, y, w, h)
    if not isinstance(label, str) or not label or len(label) > 128:
        raise DatasetError(f"{where}: the class must be a name of 1-128 characters")
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in values) \
            or w < 0 or h < 0 or x < 0 or y < 0:
        raise DatasetError(f"{where}: a box is x, y, width, height: finite, not negative")
    return {"label": label, "score": None, "box": [float(x), float(y), float(x + w), float(y + h)]}


def parse_coco(data: bytes) -> dict[tuple[str, str], list[dict]]:
    """{(device, sample): labels} of a COCO document; DatasetError for a malformed one."""
    try:
        document = json.loads(data)
        names = {c["id"]: c["name"] for c in document["categories"]}
        files = {image["id"]: _key_of(str(image["file_name"]), ".jpg") for image in document["images"]}
        found: dict[tuple[str, str], list[dict]] = {key: [] for key in files.values()}
        for index, ann in enumerate(document["annotations"]):
            where = f"annotations[{index}]"
            if ann["image_id"] not in files or ann["category_id"] not in names:
                raise DatasetError(f"{where}: its image_id or category_id is not in images / categories")
            found[files[ann["image_id"]]].append(_box(names[ann["category_id"]], *ann["bbox"], where=where))
    except DatasetError:
        raise
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise DatasetError(f"not a COCO detection document: {type(exc).__name__}: {exc}") from None
    return found


def _yaml_names(text: str) -> dict[int, str]:
    names: dict[int, str] = {}
    inside = False
    for line in text.splitlines():
        if line.startswith("names:"):
            inside = True
            continue
        if inside and (match := _NAME_LINE.match(line)) and line.startswith((" ", "-")):
            raw = match.group(2)
            names[int(match.group(1)) if match.group(1) else len(names)] = (
                json.loads(raw) if raw.startswith('"') else raw.strip("'"))
        elif inside and line.strip():
            inside = False
    return names


SizeOf = Callable[[tuple[str, str]], "tuple[int, int] | None"]


def parse_yolo(data: bytes, size_of: SizeOf) -> dict[tuple[str, str], list[dict]]:
    """{(device, sample): labels} of a zip of ``data.yaml`` and ``labels/<device>/<sample>.txt``; ``size_of``:
    a stored sample's (width, height), to turn normalised boxes into pixels (None: not stored, a LookupError)."""
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            files = {info.filename: archive.read(info) for info in archive.infolist()
                     if info.filename.endswith((".txt", "data.yaml")) and not info.is_dir()}
    except (zipfile.BadZipFile, ValueError, OSError) as exc:
        raise DatasetError(f"a YOLO import is a zip of data.yaml and labels/: {exc}") from None
    yaml = next((body for name, body in files.items() if name.endswith("data.yaml")), None)
    if yaml is None:
        raise DatasetError("the zip has no data.yaml (the class names)")
    try:
        names = _yaml_names(yaml.decode())
    except (UnicodeDecodeError, ValueError) as exc:
        raise DatasetError(f"data.yaml: its names cannot be read: {exc}") from None
    found = {}
    for name, body in files.items():
        if name.endswith(".txt"):
            key = _key_of(name, ".txt")
            found[key] = _yolo_file(name, body, names, size_of(key))
    return found


def _yolo_file(name: str, body: bytes, names: dict[int, str], size: tuple[int, int] | None) -> list[dict]:
    if size is None:
        raise LookupError(f"{name}: no such sample is stored")
    width, height = size
    boxes = []
    for number, line in enumerate(body.decode(errors="replace").splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{name}:{number}"
        fields = line.split()
        try:
            cls, cx, cy, w, h = int(fields[0]), *(float(v) for v in fields[1:])
        except (ValueError, TypeError):
            raise DatasetError(f"{where}: a line is `class cx cy w h` (5 numbers)") from None
        if cls not in names or not all(0 <= v <= 1 for v in (cx, cy, w, h)):
            raise DatasetError(f"{where}: class {cls} is not in data.yaml, or a value is outside 0..1")
        boxes.append(_box(names[cls], (cx - w / 2) * width, (cy - h / 2) * height, w * width, h * height, where))
    return boxes
