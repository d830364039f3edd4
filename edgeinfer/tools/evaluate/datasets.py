"""Labelled datasets read from a folder: COCO JSON + images, Ultralytics YOLO, or one sub-folder per class.

Every reader gives a :class:`Dataset`: class names and one :class:`Sample` per image, its boxes by class
*name* (matched to a model's names later, :mod:`.names`), a pose dataset's boxes with their keypoints (COCO
keypoints; YOLO pose lines under ``data.yaml``'s ``kpt_shape``), one keypoint count for the whole dataset. COCO
files are read by pycocotools' own ``COCO``; a malformed file, a missing image or a label line that does not
parse is an :class:`DatasetError` naming the file (and line).
"""

from __future__ import annotations

import contextlib
import io
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...errors import DatasetError

FORMATS = ("coco", "yolo", "classify")


@dataclass(frozen=True)
class Box:
    """One labelled box: corners in pixels, or in [0, 1] of the image when ``normalised``; a pose label's
    keypoints (x, y as the corners are, and COCO's flag: 0 not labelled, 1 hidden, 2 visible)."""

    name: str
    xyxy: tuple[float, float, float, float]
    normalised: bool = False
    keypoints: tuple[tuple[float, float, int], ...] = ()


@dataclass(frozen=True)
class Sample:
    """One labelled image: its boxes (detection) or its class name (classification)."""

    path: Path
    boxes: tuple[Box, ...] = ()
    label: str | None = None


@dataclass
class Dataset:
    """A labelled dataset: what it is, its class names (in its own order) and its images."""

    kind: str  # "detect" or "classify"
    format: str
    root: Path
    names: list[str]
    samples: list[Sample] = field(default_factory=list)
    #: where it came from, in words, when not a folder of the user's (the fleet's samples); reports say this
    source: str = ""
    #: how many keypoints its pose labels carry (0: boxes only)
    keypoints: int = 0


def read_dataset(folder: str | Path, fmt: str | None = None) -> Dataset:
    """The dataset in ``folder``, its format ``fmt`` or guessed: data.yaml → yolo, a .json → coco, else classes."""
    root = Path(folder)
    if not root.is_dir():
        raise DatasetError(f"dataset folder not found: {root} — pass a folder (COCO JSON + images, "
                              "YOLO images/ + labels/ + data.yaml, or one sub-folder of images per class)")
    fmt = fmt or _guess_format(root)
    if fmt not in FORMATS:
        raise DatasetError(f"unknown dataset format {fmt!r}; known: {', '.join(FORMATS)}")
    dataset = {"coco": read_coco, "yolo": read_yolo, "classify": read_class_folders}[fmt](root)
    if not dataset.samples:
        raise DatasetError(f"dataset {root} ({fmt}) holds no labelled images")
    return dataset


def _guess_format(root: Path) -> str:
    if _yaml_file(root):
        return "yolo"
    if sorted(root.glob("*.json")):
        return "coco"
    return "classify"


def _yaml_file(root: Path) -> Path | None:
    return next((p for p in (root / "data.yaml", root / "data.yml", root / "dataset.yaml") if p.is_file()), None)


def _images_in(folder: Path) -> list[Path]:
    from ...capture.images import IMAGE_SUFFIXES

    return sorted(p for p in folder.rglob("*") if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)


# --- COCO -----------------------------------------------------------------------------------------------

def read_coco(root: Path) -> Dataset:
    """A COCO JSON (``annotations.json``, or the only .json) and its images, beside it or under ``images/``."""
    from ...util.optional import import_optional

    coco_module = import_optional("pycocotools.coco", "evaluate", "reading a COCO dataset")
    path = _coco_file(root)
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # pycocotools prints its progress
            coco = coco_module.COCO(str(path))
    except (OSError, ValueError, KeyError, TypeError, AssertionError) as exc:
        raise DatasetError(f"{path} is not a COCO annotation file pycocotools can read: "
                              f"{type(exc).__name__}: {exc}") from None
    categories = {c["id"]: str(c["name"]) for c in coco.dataset.get("categories", []) if "id" in c and "name" in c}
    samples = [_coco_sample(coco, image, categories, root, path) for image in coco.dataset.get("images", [])]
    return Dataset("detect", "coco", root, list(categories.values()), samples, keypoints=_keypoint_count(samples, path))


def _keypoint_count(samples: list[Sample], path: Path) -> int:
    """The dataset's one keypoint count (0: none); DatasetError when its boxes carry different ones."""
    counts = {len(box.keypoints) for sample in samples for box in sample.boxes if box.keypoints}
    if len(counts) > 1:
        raise DatasetError(f"{path}: its boxes carry {' and '.join(map(str, sorted(counts)))} keypoints; a dataset "
                           "is scored on one keypoint count")
    return counts.pop() if counts else 0


def _coco_keypoints(values: Any) -> tuple[tuple[float, float, int], ...]:
    """An annotation's flat x, y, v list as (x, y, flag) triples; ValueError when it is not one."""
    if not isinstance(values, list) or len(values) % 3:
        raise ValueError("keypoints is a flat list of x, y, v (3 numbers a keypoint)")
    points = tuple((float(values[i]), float(values[i + 1]), int(values[i + 2])) for i in range(0, len(values), 3))
    if any(v not in (0, 1, 2) for _, _, v in points):
        raise ValueError("a keypoint's v is 0 (not labelled), 1 (hidden) or 2 (visible)")
    return points


def _coco_file(root: Path) -> Path:
    candidates = sorted(root.glob("*.json"))
    named = [p for p in candidates if p.name in ("annotations.json", "_annotations.coco.json", "instances.json")]
    if named:
        return named[0]
    if len(candidates) != 1:
        raise DatasetError(f"{root} holds {len(candidates)} .json files; name the COCO one annotations.json")
    return candidates[0]


def _coco_sample(coco: Any, image: dict, categories: dict[int, str], root: Path, path: Path) -> Sample:
    try:
        name = str(image["file_name"])
        boxes = []
        for ann in coco.imgToAnns.get(image["id"], []):
            x, y, w, h = (float(v) for v in ann["bbox"])
            if ann["category_id"] not in categories:
                raise DatasetError(f"{path}: annotation {ann.get('id')} names category {ann['category_id']}, "
                                      "which the file does not define")
            boxes.append(Box(categories[ann["category_id"]], (x, y, x + w, y + h),
                             keypoints=_coco_keypoints(ann["keypoints"]) if ann.get("keypoints") else ()))
    except (KeyError, TypeError, ValueError) as exc:
        raise DatasetError(f"{path}: image {image.get('id', '?')} or one of its annotations is malformed "
                              f"({type(exc).__name__}: {exc})") from None
    found = next((p for p in (root / name, root / "images" / name) if p.is_file()), None)
    if found is None:
        raise DatasetError(f"{path} names image {name}, which is neither in {root} nor in {root / 'images'}")
    return Sample(found, tuple(boxes))


# --- Ultralytics YOLO -----------------------------------------------------------------------------------

def read_yolo(root: Path) -> Dataset:
    """``data.yaml`` (``names``: a list or an id → name mapping), ``images/**`` and ``labels/**/*.txt`` beside them."""
    data, path = _yolo_yaml(root)
    names, kpt_shape = _yolo_names(data, path), _yolo_kpt_shape(data, path)
    images = _images_in(root / "images")
    return Dataset("detect", "yolo", root, [names[i] for i in sorted(names)],
                   [_yolo_sample(root, image, names, kpt_shape) for image in images], keypoints=kpt_shape[0])


def _yolo_yaml(root: Path) -> tuple[Any, Path]:
    import yaml

    path = _yaml_file(root)
    if path is None:
        raise DatasetError(f"{root} has no data.yaml naming the classes")
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8")), path
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise DatasetError(f"cannot read {path}: {exc}") from None


def _yolo_names(data: Any, path: Path) -> dict[int, str]:
    names = data.get("names") if isinstance(data, dict) else None
    if isinstance(names, list):
        names = dict(enumerate(names))
    if not isinstance(names, dict) or not names or not all(isinstance(k, int) for k in names):
        raise DatasetError(f"{path}: 'names' must be a list of class names or a mapping of ids to names")
    return {k: str(v) for k, v in names.items()}


def _yolo_kpt_shape(data: Any, path: Path) -> tuple[int, int]:
    """``kpt_shape``: (keypoints, 2 or 3) of a pose dataset, (0, 0) without."""
    shape = data.get("kpt_shape") if isinstance(data, dict) else None
    if shape is None:
        return 0, 0
    whole = isinstance(shape, list) and len(shape) == 2 and all(isinstance(v, int) and not isinstance(v, bool)
                                                                for v in shape)
    if not whole or shape[0] <= 0 or shape[1] not in (2, 3):
        raise DatasetError(f"{path}: 'kpt_shape' must be [keypoints, 2 or 3], e.g. [17, 3]")
    return shape[0], shape[1]


def _yolo_sample(root: Path, image: Path, names: dict[int, str], kpt_shape: tuple[int, int]) -> Sample:
    label = root / "labels" / image.relative_to(root / "images").with_suffix(".txt")
    if not label.is_file():  # an image without a label file is an image with no object (Ultralytics' rule)
        return Sample(image)
    try:
        lines = label.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise DatasetError(f"cannot read {label}: {exc}") from None
    return Sample(image, tuple(_yolo_box(label, number, line, names, kpt_shape)
                               for number, line in enumerate(lines, 1) if line.strip()))


def _yolo_box(label: Path, number: int, line: str, names: dict[int, str], kpt_shape: tuple[int, int]) -> Box:
    fields = line.split()
    count, dims = kpt_shape
    form = "class cx cy w h" + (f" and {count} keypoints of {'x y v' if dims == 3 else 'x y'}" if count else "")
    try:
        if count and len(fields) != 5 + count * dims:
            raise ValueError
        class_id, (cx, cy, w, h) = int(fields[0]), (float(v) for v in fields[1:5])
        values = [float(v) for v in fields[5:5 + count * dims]]
    except (ValueError, IndexError):
        raise DatasetError(f"{label}:{number}: expected '{form}', got {line.strip()!r}") from None
    if class_id not in names:
        raise DatasetError(f"{label}:{number}: class {class_id} is not among data.yaml's {len(names)} names")
    points = []
    for i in range(0, len(values), dims or 1):
        x, y = values[i], values[i + 1]
        v = values[i + 2] if dims == 3 else (0.0 if x == y == 0 else 2.0)  # 2-D: 0, 0 is not labelled
        if v not in (0, 1, 2):
            raise DatasetError(f"{label}:{number}: keypoint {i // dims}'s v is 0, 1 or 2, not {v:g}")
        points.append((x, y, int(v)))
    return Box(names[class_id], (cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2), normalised=True,
               keypoints=tuple(points))


# --- class folders --------------------------------------------------------------------------------------

def read_class_folders(root: Path) -> Dataset:
    """One sub-folder per class, named as the class; its images (at any depth) are of that class."""
    folders = sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not folders:
        raise DatasetError(f"{root} holds no data.yaml, no COCO .json and no class sub-folders")
    samples = [Sample(image, label=folder.name) for folder in folders for image in _images_in(folder)]
    return Dataset("classify", "classify", root, [f.name for f in folders], samples)

