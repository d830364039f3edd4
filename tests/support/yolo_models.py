"""Small real ONNX models laid out as Ultralytics' exporters lay out YOLO, with objects planted at known places.

Each model takes ``images`` [1, 3, H, W] float and returns planted constants (+ 0 x the input's mean, so ONNX
Runtime runs a real graph on every frame), with Ultralytics-style ``metadata_props``. Every coordinate of a
:class:`Planted` object is in model-input pixels; the tests map them to the source frame themselves.

Layouts: ``yolo`` ``[1, 4+nc, N]`` (or transposed), normalised to the input (TFLite style), quantised
(a QuantizeLinear at the end); ``yolo-pose``, ``yolo-seg`` (+ prototypes ``[1, nm, H/4, W/4]``), ``yolo-obb``;
``yolov5`` ``[1, 3*N, 5+nc]``; ``yolo-end2end`` ``[1, 300, 6+extra]``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

#: the input the models take, (width, height): not square, so each axis is checked on its own
INPUT = (320, 256)
NAMES = {0: "person", 1: "car"}
#: prototype masks (and so mask coefficients) a segmentation model has
NM = 32
#: rows of an end-to-end model (Ultralytics' max_det)
END2END_ROWS = 300
ONNX_DTYPES = {"uint8": 2, "int8": 3, "float32": 1}


@dataclass(frozen=True)
class Planted:
    """One object in a model's output, in model-input pixels.

    ``box`` is x1, y1, x2, y2 (the rotated rectangle's own extents for an oriented box, turned by ``angle``
    radians about its centre). ``keypoints`` are (x, y[, visibility]). ``mask`` is ``("disc", cx, cy, r)`` or
    ``("rect", x1, y1, x2, y2)``, inside the box. ``objectness`` and ``class_scores`` are YOLOv5's (the score is
    then their product); otherwise the class's score is ``score`` and the other classes' zero.
    """

    box: tuple[float, float, float, float]
    class_id: int
    score: float
    keypoints: tuple[tuple[float, ...], ...] = ()
    angle: float = 0.0
    mask: tuple[Any, ...] | None = None
    objectness: float | None = None
    class_scores: tuple[float, ...] | None = None

    @property
    def xywh(self) -> tuple[float, float, float, float]:
        x1, y1, x2, y2 = self.box
        return (x1 + x2) / 2, (y1 + y2) / 2, x2 - x1, y2 - y1


def candidates(width: int = INPUT[0], height: int = INPUT[1], strides: tuple[int, ...] = (8, 16, 32)) -> int:
    """The candidate count of an anchor-free head (one a grid cell of each stride)."""
    return sum(math.ceil(width / s) * math.ceil(height / s) for s in strides)


def ultralytics_metadata(task: str, *, names: dict[int, str] = NAMES, input_size: tuple[int, int] = INPUT,
                         kpt_shape: tuple[int, int] | None = None, end2end: bool | None = False) -> dict[str, str]:
    """``metadata_props`` as Ultralytics' ONNX exporter writes them (values as Python literals)."""
    props = {"description": f"Ultralytics YOLO11n-{task} test model", "author": "Ultralytics",
             "version": "8.4.190", "license": "AGPL-3.0 License (https://ultralytics.com/license)",
             "docs": "https://docs.ultralytics.com", "stride": "32", "task": task, "batch": "1",
             "imgsz": str([input_size[1], input_size[0]]), "names": str(names), "channels": "3",
             "args": str({"batch": 1, "half": False, "dynamic": False, "nms": bool(end2end)})}
    if end2end is not None:
        props["end2end"] = str(end2end)
    if kpt_shape is not None:
        props["kpt_shape"] = str(list(kpt_shape))
    return props


# ------------------------------------------------------------------------------------ rows

def candidate_rows(objects: list[Planted], *, nc: int, extra: int = 0, count: int | None = None,
                   kpt_shape: tuple[int, int] = (17, 3)) -> np.ndarray:
    """(N, 4 + nc + extra) anchor-free candidates: cx, cy, w, h, class scores, then keypoints, the angle
    or mask coefficient ``i`` = 1 (object ``i`` owns prototype ``i``); zero rows elsewhere."""
    count = count or candidates()
    table = np.zeros((count, 4 + nc + extra), np.float32)
    for i, obj in enumerate(objects):
        row = table[_slot(i, count)]
        row[:4] = obj.xywh
        row[4 + obj.class_id] = obj.score
        _extras(row[4 + nc:], obj, i, kpt_shape)
    return table


def yolov5_rows(objects: list[Planted], *, nc: int, count: int | None = None) -> np.ndarray:
    """(3N, 5 + nc): cx, cy, w, h, objectness, class probabilities (3 anchors a cell)."""
    count = count or 3 * candidates()
    table = np.zeros((count, 5 + nc), np.float32)
    for i, obj in enumerate(objects):
        row = table[_slot(i, count)]
        row[:4] = obj.xywh
        row[4] = obj.objectness if obj.objectness is not None else 1.0
        if obj.class_scores is not None:
            row[5:5 + len(obj.class_scores)] = obj.class_scores
        else:
            row[5 + obj.class_id] = obj.score
    return table


def end2end_rows(objects: list[Planted], *, task: str = "detect", extra: int = 0, rows: int = END2END_ROWS,
                 kpt_shape: tuple[int, int] = (17, 3)) -> np.ndarray:
    """(rows, 6 + extra) selected boxes, best first as a graph's NMS leaves them: x1, y1, x2, y2 (obb: cx, cy, w,
    h), score, class, then keypoints, mask coefficients or the angle; zero rows after the last."""
    table = np.zeros((rows, 6 + extra), np.float32)
    for row, i in enumerate(sorted(range(len(objects)), key=lambda i: -objects[i].score)):
        obj = objects[i]
        table[row, :4] = obj.xywh if task == "obb" else obj.box
        table[row, 4], table[row, 5] = obj.score, obj.class_id
        _extras(table[row, 6:], obj, i, kpt_shape)
    return table


def _slot(i: int, count: int) -> int:
    """Where object ``i`` sits among the candidates: spread over the grid, never the first or last row."""
    return (97 * i + 13) % (count - 2) + 1


def _extras(extra: np.ndarray, obj: Planted, index: int, kpt_shape: tuple[int, int]) -> None:
    if obj.keypoints:
        k, d = kpt_shape
        extra[:k * d] = np.asarray(obj.keypoints, np.float32)[:, :d].reshape(-1)
    elif obj.mask is not None:
        extra[index] = 1.0
    elif extra.size == 1:
        extra[0] = obj.angle


def prototypes(objects: list[Planted], *, nm: int = NM, input_size: tuple[int, int] = INPUT) -> np.ndarray:
    """[1, nm, H/4, W/4]: prototype ``i`` is object ``i``'s mask as a signed distance in input pixels (positive
    inside), sampled at each prototype cell's centre — so the decoded edge lands where the shape's edge is."""
    width, height = input_size
    mh, mw = height // 4, width // 4
    ys, xs = np.meshgrid((np.arange(mh) + 0.5) * height / mh, (np.arange(mw) + 0.5) * width / mw, indexing="ij")
    protos = np.full((1, nm, mh, mw), -10.0, np.float32)
    for i, obj in enumerate(objects):
        if obj.mask is None:
            continue
        kind, *values = obj.mask
        if kind == "disc":
            cx, cy, r = values
            protos[0, i] = r - np.hypot(xs - cx, ys - cy)
        else:
            x1, y1, x2, y2 = values
            protos[0, i] = np.minimum.reduce([xs - x1, x2 - xs, ys - y1, y2 - ys])
    return protos


def normalise(table: np.ndarray, columns: list[int] | slice, *, input_size: tuple[int, int] = INPUT,
              keypoints: tuple[int, int, int] | None = None) -> np.ndarray:
    """Ultralytics' TFLite coordinates: (N, C) rows with x, y, w, h ``columns`` (and keypoints: first column,
    count, values each) divided by the input's width and height, in place."""
    width, height = input_size
    scale = np.array([width, height, width, height], np.float32)
    table[:, columns] /= scale
    if keypoints is not None:
        first, k, d = keypoints
        points = table[:, first:first + k * d].reshape(-1, k, d)
        points[..., 0] /= width
        points[..., 1] /= height
        table[:, first:first + k * d] = points.reshape(-1, k * d)
    return table


# ----------------------------------------------------------------------------------- model

@dataclass(frozen=True)
class Quantized:
    """A QuantizeLinear at the end of an output: real = (q - zero_point) * scale."""

    scale: float
    zero_point: int
    dtype: str = "uint8"

    def grid(self, values: np.ndarray) -> np.ndarray:
        """``values`` as the quantised output will hold them (rounded to its steps, clipped to its range)."""
        info = np.iinfo(self.dtype)
        q = np.clip(np.rint(values / self.scale) + self.zero_point, info.min, info.max)
        return ((q - self.zero_point) * self.scale).astype(np.float32)


def save_model(path: Path, outputs: dict[str, np.ndarray], *, metadata: dict[str, str] | None = None,
               quantized: dict[str, Quantized] | None = None, input_size: tuple[int, int] = INPUT) -> Path:
    """An opset-17 model whose outputs are ``outputs`` (name -> constant) + 0 x mean(images), each quantised
    by a QuantizeLinear when ``quantized`` names it; ``metadata`` as its metadata_props."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    width, height = input_size
    nodes = [helper.make_node("ReduceMean", ["images"], ["mean"], keepdims=0),
             helper.make_node("Mul", ["mean", "zero"], ["nothing"])]
    initializers = [numpy_helper.from_array(np.array(0.0, np.float32), "zero")]
    results = []
    for name, value in outputs.items():
        initializers.append(numpy_helper.from_array(np.ascontiguousarray(value, np.float32), f"{name}_planted"))
        real = f"{name}_real" if quantized and name in quantized else name
        nodes.append(helper.make_node("Add", [f"{name}_planted", "nothing"], [real]))
        dtype = TensorProto.FLOAT
        if quantized and name in quantized:
            q = quantized[name]
            dtype = ONNX_DTYPES[q.dtype]
            initializers += [numpy_helper.from_array(np.array(q.scale, np.float32), f"{name}_scale"),
                             numpy_helper.from_array(np.array(q.zero_point, q.dtype), f"{name}_zero_point")]
            nodes.append(helper.make_node("QuantizeLinear", [real, f"{name}_scale", f"{name}_zero_point"], [name]))
        results.append(helper.make_tensor_value_info(name, dtype, list(value.shape)))
    graph = helper.make_graph(nodes, "planted", [helper.make_tensor_value_info(
        "images", TensorProto.FLOAT, [1, 3, height, width])], results, initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8,
                              producer_name="pytorch")
    if metadata:
        helper.set_model_props(model, metadata)
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


# ------------------------------------------------------------------------ one per layout

def yolo_detect(path: Path, objects: list[Planted], *, names: dict[int, str] = NAMES, transposed: bool = False,
                normalised: bool = False, quantized: Quantized | None = None, metadata: bool = True,
                table: np.ndarray | None = None) -> Path:
    """``yolo``: [1, 4+nc, N] (``transposed``: [1, N, 4+nc]); ``table`` replaces the planted rows."""
    rows = candidate_rows(objects, nc=len(names)) if table is None else table
    if normalised:
        normalise(rows, slice(0, 4))
    if quantized is not None:
        rows = quantized.grid(rows)
    output = rows[None] if transposed else rows.T[None]
    return save_model(path, {"output0": output}, metadata=ultralytics_metadata("detect", names=names)
                      if metadata else None, quantized={"output0": quantized} if quantized else None)


def yolo_pose(path: Path, objects: list[Planted], *, kpt_shape: tuple[int, int] = (17, 3),
              names: dict[int, str] | None = None, normalised: bool = False, table: np.ndarray | None = None) -> Path:
    """``yolo-pose``: [1, 4+nc+K*D, N]."""
    names = names or {0: "person"}
    k, d = kpt_shape
    rows = candidate_rows(objects, nc=len(names), extra=k * d, kpt_shape=kpt_shape) if table is None else table
    if normalised:
        normalise(rows, slice(0, 4), keypoints=(4 + len(names), k, d))
    return save_model(path, {"output0": rows.T[None]},
                      metadata=ultralytics_metadata("pose", names=names, kpt_shape=kpt_shape))


def yolo_seg(path: Path, objects: list[Planted], *, names: dict[int, str] = NAMES, metadata: bool = True,
             quantized: tuple[Quantized, Quantized] | None = None, normalised: bool = False,
             channels_last: bool = False, input_size: tuple[int, int] = INPUT) -> Path:
    """``yolo-seg``: output0 [1, 4+nc+nm, N], output1 prototypes [1, nm, H/4, W/4] (``channels_last``: [1, H/4,
    W/4, nm], as a TFLite export has them)."""
    rows = candidate_rows(objects, nc=len(names), extra=NM, count=candidates(*input_size))
    protos = prototypes(objects, input_size=input_size)
    if normalised:
        normalise(rows, slice(0, 4), input_size=input_size)
    quantize = None
    if quantized is not None:
        rows, protos = quantized[0].grid(rows), quantized[1].grid(protos)
        quantize = {"output0": quantized[0], "output1": quantized[1]}
    if channels_last:
        protos = protos.transpose(0, 2, 3, 1)
    props = ultralytics_metadata("segment", names=names, input_size=input_size) if metadata else None
    return save_model(path, {"output0": rows.T[None], "output1": protos}, metadata=props, quantized=quantize,
                      input_size=input_size)


def yolo_obb(path: Path, objects: list[Planted], *, names: dict[int, str] = NAMES, normalised: bool = False) -> Path:
    """``yolo-obb``: [1, 4+nc+1, N], the angle (radians) last."""
    rows = candidate_rows(objects, nc=len(names), extra=1)
    if normalised:
        normalise(rows, slice(0, 4))
    return save_model(path, {"output0": rows.T[None]}, metadata=ultralytics_metadata("obb", names=names))


def yolov5(path: Path, objects: list[Planted], *, names: dict[int, str] = NAMES, metadata: bool = True) -> Path:
    """``yolov5``: [1, 3*N, 5+nc]; metadata as YOLOv5's own exporter writes it (stride and names only)."""
    rows = yolov5_rows(objects, nc=len(names))
    return save_model(path, {"output0": rows[None]},
                      metadata={"stride": "32", "names": str(names)} if metadata else None)


def yolo_end2end(path: Path, objects: list[Planted], *, task: str = "detect", names: dict[int, str] = NAMES,
                 kpt_shape: tuple[int, int] = (17, 3), metadata: bool = True, table: np.ndarray | None = None,
                 normalised: bool = False) -> Path:
    """``yolo-end2end``: [1, 300, 6] (pose: 6 + K*D; segment: 6 + nm and the prototypes; obb: 7)."""
    extra = {"detect": 0, "pose": kpt_shape[0] * kpt_shape[1], "segment": NM, "obb": 1}[task]
    rows = end2end_rows(objects, task=task, extra=extra, kpt_shape=kpt_shape) if table is None else table
    if normalised:
        normalise(rows, slice(0, 4), keypoints=(6, *kpt_shape) if task == "pose" else None)
    outputs = {"output0": rows[None]}
    if task == "segment":
        outputs["output1"] = prototypes(objects)
    props = ultralytics_metadata(task, names=names, end2end=True,
                                 kpt_shape=kpt_shape if task == "pose" else None) if metadata else None
    return save_model(path, outputs, metadata=props)
