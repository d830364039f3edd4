"""Samples as datasets for the labelling tools teams already use, and their corrected labels back.

Export (a zip, ``GET /api/samples/export``; ``edgeinfer fleet dataset export``), each sample's JPEG at
``images/<device>/<sample>.jpg`` and its boxes — the corrected ``labels`` where a person set them, else the
model's ``detections`` — with their keypoints where a pose model gave them (a model's confidence becomes COCO's
visibility flag, ``forms.samples.visibility``):

- ``coco``: ``annotations.json`` (COCO detection: ``bbox`` is x, y, width, height in pixels; categories
  numbered from 1 in the order of their names; a prediction's ``score`` kept; COCO keypoints: ``keypoints``
  x, y, v flat and ``num_keypoints`` per annotation, the category's ``keypoints`` names and ``skeleton``; a
  segmentation model's mask outline as COCO's ``segmentation`` polygons, the ``area`` theirs);
- ``yolo``: Ultralytics' layout — ``labels/<device>/<sample>.txt`` (``class cx cy w h``, normalised to
  0..1, then ``x y v`` per keypoint for a pose dataset), ``data.yaml`` (``names``, classes numbered from 0;
  ``kpt_shape`` and, for COCO's 17, ``flip_idx``);
- ``label-studio``: ``tasks.json``, one task per sample with the model's detections as ``predictions``
  (rectanglelabels in percent of the image, ``from_name`` "label", ``to_name`` "image"; each seen keypoint a
  keypointlabels result, ``from_name`` "keypoint", whose ``parentID`` is its box) and the corrected labels, if
  any, as ``annotations``.

Import (``POST /api/samples/import``): a COCO ``annotations.json`` or a zip of YOLO ``labels/**.txt`` with
its ``data.yaml``, matched to the samples by file name, keypoints included; every file is checked before
anything is stored (``DatasetError`` names the first fault; a file naming no stored sample is a ``LookupError``),
and all the samples change in one transaction.
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
from ..forms.samples import COCO_FLIP, keypoint_names, skeleton_for, visibility

FORMATS = ("coco", "yolo", "label-studio")
IMPORT_FORMATS = ("coco", "yolo")
#: the largest import this manager parses (a label file is text: far below this)
MAX_IMPORT_BYTES = 64 << 20
#: a name in ``data.yaml``'s names: ``  0: "person"`` or ``- person``
_NAME_LINE = re.compile(r"^\s*(?:(\d+)\s*:|-)\s*(.+?)\s*$")
#: ``data.yaml``'s keypoint shape: ``kpt_shape: [17, 3]``
_KPT_SHAPE = re.compile(r"^kpt_shape:\s*\[\s*(\d+)\s*,\s*([23])\s*\]\s*$", re.MULTILINE)


def file_stem(sample: dict) -> str:
    return f"{sample['device_id']}/{sample['sample_id']}"


def boxes_of(sample: dict) -> list[dict]:
    """The boxes a dataset gets: the corrected labels where set, else the model's detections."""
    labels = sample.get("labels")
    return list(labels if labels is not None else sample.get("detections") or [])


def categories(samples: Sequence[dict]) -> list[str]:
    return sorted({str(box["label"]) for sample in samples for box in boxes_of(sample)})


def keypoint_counts(samples: Sequence[dict]) -> dict[str, int]:
    """How many keypoints each class's boxes carry (classes without any left out); DatasetError when one class's
    boxes carry different counts (two pose models' samples: export them apart)."""
    counts: dict[str, int] = {}
    for sample in samples:
        for box in boxes_of(sample):
            count = len(box.get("keypoints") or ())
            if count and counts.setdefault(str(box["label"]), count) != count:
                fewer, more = sorted((counts[str(box["label"])], count))
                raise DatasetError(f"the {box['label']!r} boxes carry {fewer} and {more} keypoints: export the "
                                   "samples of each pose model apart (filter by pipeline or model version)")
    return counts


def flags(sample: dict, box: dict, count: int) -> list[tuple[float, float, int]]:
    """``count`` keypoints of ``box`` as (x, y, COCO's flag) in pixels, the unlabelled ones (0, 0, 0): a label's
    flag as set, a model's confidence read as seen or not (a box without keypoints: all unlabelled)."""
    labelled = sample.get("labels") is not None
    out = []
    for x, y, v in (box.get("keypoints") or [])[:count]:
        flag = visibility(v, labelled=labelled)
        out.append((float(x), float(y), flag) if flag else (0.0, 0.0, 0))
    return out + [(0.0, 0.0, 0)] * (count - len(out))


# -------------------------------------------------------------------------------------------- export
def coco(samples: Sequence[dict]) -> dict[str, Any]:
    """A COCO detection document of ``samples`` (with COCO keypoints where their boxes carry any)."""
    names = categories(samples)
    counts = keypoint_counts(samples)
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
            if box.get("polygons"):  # a segmentation model's mask: COCO's polygons, x, y flat; its area theirs
                entry["segmentation"] = [[value for point in polygon for value in point] for polygon in box["polygons"]]
                entry["area"] = sum(_polygon_area(polygon) for polygon in box["polygons"])
            if box["label"] in counts:
                points = flags(sample, box, counts[box["label"]])
                entry["keypoints"] = [value for point in points for value in point]
                entry["num_keypoints"] = sum(1 for point in points if point[2])
            annotations.append(entry)
    return {"info": {"description": "edgeinfer samples"}, "images": images, "annotations": annotations,
            "categories": [_category(ids[name], name, counts.get(name)) for name in names]}


def _polygon_area(polygon: Sequence[Sequence[float]]) -> float:
    """The area a polygon encloses (the shoelace formula), in square pixels."""
    closed = [*polygon[1:], polygon[0]]
    return abs(sum(x1 * y2 - x2 * y1 for (x1, y1), (x2, y2) in zip(polygon, closed))) / 2


def _category(number: int, name: str, keypoints: int | None) -> dict[str, Any]:
    """A COCO category; a pose class's with its keypoints' names and limbs (COCO's ``skeleton`` counts from 1)."""
    category: dict[str, Any] = {"id": number, "name": name, "supercategory": ""}
    if keypoints:
        category["keypoints"] = list(keypoint_names(keypoints))
        category["skeleton"] = [[a + 1, b + 1] for a, b in skeleton_for(keypoints)]
    return category


def yolo_lines(sample: dict, ids: dict[str, int], keypoints: int = 0) -> str:
    """A sample's YOLO label file: ``class cx cy w h`` a box, normalised by the frame's size, then ``keypoints``
    times ``x y v`` (normalised; v COCO's flag, an unlabelled keypoint ``0 0 0``)."""
    width, height = sample["width"], sample["height"]
    lines = []
    for box in boxes_of(sample):
        x1, y1, x2, y2 = box["box"]
        line = (f"{ids[box['label']]} {(x1 + x2) / 2 / width:.6f} {(y1 + y2) / 2 / height:.6f} "
                f"{(x2 - x1) / width:.6f} {(y2 - y1) / height:.6f}")
        for x, y, flag in flags(sample, box, keypoints):
            line += f" {x / width:.6f} {y / height:.6f} {flag}"
        lines.append(line)
    return "".join(line + "\n" for line in lines)


def yolo_keypoints(samples: Sequence[dict]) -> int:
    """The one keypoint count of a YOLO pose dataset (0: no pose); DatasetError when classes carry different ones
    (Ultralytics' ``kpt_shape`` is one for the whole dataset)."""
    counts = set(keypoint_counts(samples).values())
    if len(counts) > 1:
        raise DatasetError(f"the boxes carry {' and '.join(map(str, sorted(counts)))} keypoints: a YOLO pose dataset "
                           "has one kpt_shape; export each pose model's samples apart, or as COCO")
    return counts.pop() if counts else 0


def data_yaml(names: Sequence[str], keypoints: int = 0) -> str:
    """Ultralytics' dataset file (JSON strings are YAML strings: any label survives quoting); a pose dataset's
    ``kpt_shape`` (and for COCO's 17 keypoints ``flip_idx``, which Ultralytics' flip augmentation needs)."""
    listed = "".join(f"  {index}: {json.dumps(name)}\n" for index, name in enumerate(names))
    pose = ""
    if keypoints:
        pose = f"kpt_shape: [{keypoints}, 3]\n"
        if keypoints == len(COCO_FLIP):
            pose += f"flip_idx: {list(COCO_FLIP)}\n"
    return f"path: .\ntrain: images\nval: images\n{pose}names:\n{listed}"


def _rectangles(sample: dict, boxes: Iterable[dict], labelled: bool) -> list[dict]:
    """Label Studio results: a rectangle a box, and a keypoint result a seen keypoint (its ``parentID`` the box)."""
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
        points = box.get("keypoints") or []
        for number, (name, (x, y, v)) in enumerate(zip(keypoint_names(len(points)), points)):
            if visibility(v, labelled=labelled):
                result.append({"id": f"b{index}k{number}", "parentID": f"b{index}", "type": "keypointlabels",
                               "from_name": "keypoint", "to_name": "image", "original_width": width,
                               "original_height": height, "image_rotation": 0,
                               "value": {"x": 100 * x / width, "y": 100 * y / height, "width": 0.5,
                                         "keypointlabels": [name]}})
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
                             "result": _rectangles(sample, sample["detections"], False)}]}
        if sample.get("labels") is not None:
            task["annotations"] = [{"result": _rectangles(sample, sample["labels"], True)}]
        tasks.append(task)
    return tasks


def export_zip(samples: Sequence[dict], fmt: str, out: Any, jpeg_of: Callable[[dict], bytes]) -> None:
    """Write ``samples`` as a ``fmt`` dataset, zipped, to the binary file ``out``; ``jpeg_of``: a sample's JPEG
    (read one at a time: an export never holds every frame in memory). DatasetError before anything is written
    when the samples' keypoints do not fit the format (:func:`keypoint_counts`)."""
    if fmt == "coco":
        keypoint_counts(samples)
    elif fmt == "yolo":
        yolo_keypoints(samples)
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as archive:  # JPEGs do not compress
        for sample in samples:
            archive.writestr(f"images/{file_stem(sample)}.jpg", jpeg_of(sample))
        if fmt == "coco":
            archive.writestr("annotations.json", json.dumps(coco(samples), indent=1))
        elif fmt == "yolo":
            names, keypoints = categories(samples), yolo_keypoints(samples)
            ids = {name: index for index, name in enumerate(names)}
            archive.writestr("data.yaml", data_yaml(names, keypoints))
            for sample in samples:
                archive.writestr(f"labels/{file_stem(sample)}.txt", yolo_lines(sample, ids, keypoints))
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


def _flag(v: Any, where: str) -> int:
    """COCO's visibility flag: 0, 1 or 2 (a whole float as written by a YOLO file counts)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v not in (0, 1, 2):
        raise DatasetError(f"{where}: a keypoint's visibility is 0 (not labelled), 1 (hidden) or 2 (visible), "
                           f"not {v!r}")
    return int(v)


def _point(x: Any, y: Any, v: Any, where: str) -> list[float]:
    flag = _flag(v, where)
    if not all(isinstance(c, (int, float)) and not isinstance(c, bool) and math.isfinite(c) and c >= 0
               for c in (x, y)):
        raise DatasetError(f"{where}: a keypoint is x, y in pixels: finite, not negative")
    return [float(x), float(y), float(flag)]


def _with_keypoints(box: dict, points: list[list[float]]) -> None:
    """``box``'s keypoints, unless none is labelled (a YOLO pose file pads a class without keypoints with 0 0 0)."""
    if any(v for _, _, v in points):
        box["keypoints"] = points


def _coco_keypoints(values: Any, count: int | None, where: str) -> list[list[float]]:
    """An annotation's ``keypoints`` (x, y, v flat) as ``[[x, y, v], ...]``, ``count`` of them when its category
    names its keypoints."""
    if not isinstance(values, list) or len(values) % 3 or (count is not None and len(values) != 3 * count):
        expected = f"3 x {count}" if count is not None else "3 per keypoint"
        raise DatasetError(f"{where}: keypoints is a flat list of x, y, v ({expected} numbers)")
    return [_point(*values[i:i + 3], f"{where} keypoint {i // 3}") for i in range(0, len(values), 3)]


def parse_coco(data: bytes) -> dict[tuple[str, str], list[dict]]:
    """{(device, sample): labels} of a COCO document (keypoints too); DatasetError for a malformed one."""
    try:
        document = json.loads(data)
        names = {c["id"]: c["name"] for c in document["categories"]}
        counts = {c["id"]: len(c["keypoints"]) for c in document["categories"] if c.get("keypoints") is not None}
        files = {image["id"]: _key_of(str(image["file_name"]), ".jpg") for image in document["images"]}
        found: dict[tuple[str, str], list[dict]] = {key: [] for key in files.values()}
        for index, ann in enumerate(document["annotations"]):
            where = f"annotations[{index}]"
            if ann["image_id"] not in files or ann["category_id"] not in names:
                raise DatasetError(f"{where}: its image_id or category_id is not in images / categories")
            box = _box(names[ann["category_id"]], *ann["bbox"], where=where)
            if ann.get("keypoints") is not None:
                _with_keypoints(box, _coco_keypoints(ann["keypoints"], counts.get(ann["category_id"]), where))
            found[files[ann["image_id"]]].append(box)
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
        text = yaml.decode()
        names = _yaml_names(text)
    except (UnicodeDecodeError, ValueError) as exc:
        raise DatasetError(f"data.yaml: its names cannot be read: {exc}") from None
    shape = _KPT_SHAPE.search(text)
    if shape is None and re.search(r"^kpt_shape:", text, re.MULTILINE):
        raise DatasetError("data.yaml: kpt_shape is [keypoints, 2 or 3], e.g. kpt_shape: [17, 3]")
    kpt_shape = (int(shape[1]), int(shape[2])) if shape else (0, 0)
    found = {}
    for name, body in files.items():
        if name.endswith(".txt"):
            key = _key_of(name, ".txt")
            found[key] = _yolo_file(name, body, names, size_of(key), kpt_shape)
    return found


def _yolo_file(name: str, body: bytes, names: dict[int, str], size: tuple[int, int] | None,
               kpt_shape: tuple[int, int] = (0, 0)) -> list[dict]:
    """A label file's boxes in pixels; with ``kpt_shape`` (K, D) each line's K keypoints too."""
    if size is None:
        raise LookupError(f"{name}: no such sample is stored")
    width, height = size
    count, dims = kpt_shape
    form = "class cx cy w h" + (f" and {count} keypoints of {'x y v' if dims == 3 else 'x y'}" if count else "")
    boxes = []
    for number, line in enumerate(body.decode(errors="replace").splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{name}:{number}"
        fields = line.split()
        try:
            if len(fields) != 5 + count * dims:
                raise ValueError
            cls, (cx, cy, w, h), rest = int(fields[0]), (float(v) for v in fields[1:5]), [float(v) for v in fields[5:]]
        except (ValueError, TypeError):
            raise DatasetError(f"{where}: a line is `{form}` ({5 + count * dims} numbers)") from None
        if cls not in names or not all(0 <= v <= 1 for v in (cx, cy, w, h)):
            raise DatasetError(f"{where}: class {cls} is not in data.yaml, or a value is outside 0..1")
        # a box at the frame's edge, its centre and size rounded to 6 places, may reach past it by a hair: cut
        x1, y1, x2, y2 = max(0.0, cx - w / 2), max(0.0, cy - h / 2), min(1.0, cx + w / 2), min(1.0, cy + h / 2)
        box = _box(names[cls], x1 * width, y1 * height, (x2 - x1) * width, (y2 - y1) * height, where)
        if count:
            _with_keypoints(box, _yolo_keypoints(rest, dims, width, height, where))
        boxes.append(box)
    return boxes


def _yolo_keypoints(values: list[float], dims: int, width: int, height: int, where: str) -> list[list[float]]:
    """A line's keypoints, normalised ``x y [v]`` each, in pixels; without v a keypoint at 0, 0 is unlabelled."""
    points = []
    for index in range(0, len(values), dims):
        x, y = values[index], values[index + 1]
        v = values[index + 2] if dims == 3 else (0.0 if x == y == 0 else 2.0)
        here = f"{where} keypoint {index // dims}"
        if not (0 <= x <= 1 and 0 <= y <= 1):
            raise DatasetError(f"{here}: x and y are normalised to 0..1")
        points.append(_point(x * width, y * height, v, here))
    return points
