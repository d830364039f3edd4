"""Small real ONNX detectors with planted outputs, for the layouts no shared asset has (DETR, D-FINE, YOLOX),
and what their tests share: a 960x540 frame, the planted objects, where they must land in it.

Each graph's outputs are constants plus ``ReduceMean(image) * 0``: they depend on the input only trivially,
so whatever frame goes in, the planted objects come out, and ONNX Runtime runs the graph like any model.
Objects are planted in model-input pixels (640x640); :func:`in_source` maps them to the frame by its own
arithmetic, not the pipeline's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

#: a planted object: (x1, y1, x2, y2) in model-input pixels, its class and score
Box = tuple[float, float, float, float]


@dataclass(frozen=True)
class Planted:
    box: Box
    class_id: int
    score: float


#: the source frame's (width, height): not square, so stretch and letterbox differ
FRAME = (960, 540)
#: planted in model-input pixels (640x640), inside the letterboxed image (rows 140-500)
OBJECTS = (Planted((100, 200, 300, 400), 3, 0.9), Planted((400, 150, 600, 480), 17, 0.8),
           Planted((20, 300, 80, 360), 0, 0.6))


def write_frame(path: Path) -> Path:
    """A FRAME-sized noise image at ``path`` (the planted models ignore what they see)."""
    import cv2

    cv2.imwrite(str(path), np.random.default_rng(7).integers(0, 255, (FRAME[1], FRAME[0], 3), np.uint8))
    return path


def in_source(box: Box, resize: str, pad: str = "centre") -> list[float]:
    """A box in 640x640 input pixels in FRAME's pixels, through a stretch or the letterbox (its border centred, or
    all of it bottom-right: ``pad="corner"``), clipped to the frame."""
    x1, y1, x2, y2 = box
    if resize == "stretch":
        sx, sy, pad_y = FRAME[0] / 640, FRAME[1] / 640, 0.0
    else:  # letterbox: scale 2/3, the image 360 rows high, centred (140 rows above) or at the top
        sx = sy = FRAME[0] / 640
        pad_y = 140.0 if pad == "centre" else 0.0
    xs = [min(max(x * sx, 0.0), FRAME[0]) for x in (x1, x2)]
    ys = [min(max((y - pad_y) * sy, 0.0), FRAME[1]) for y in (y1, y2)]
    return [xs[0], ys[0], xs[1], ys[1]]


def detect(model: Path, frame: Path, **options: Any) -> Any:
    """The detections of one frame through a real Pipeline."""
    import edgeinfer

    with edgeinfer.Pipeline(model, frame, max_frames=1, **options) as pipeline:
        results = [result.result for result in pipeline]
    assert len(results) == 1
    return results[0]


def reading(model: Path, *, task: str | None = None, decoder: str | None = None, labels: Any = None) -> Any:
    """How the pipeline reads ``model`` (its ModelReading: layout, decoder, resize, mean, std)."""
    import edgeinfer
    from edgeinfer.pipeline.decoders import DecoderSettings
    from edgeinfer.pipeline.tasks import read_model

    with edgeinfer.load(model, "onnxruntime") as engine:
        return read_model(engine, task=task, decoder=decoder, labels=labels, settings=DecoderSettings())


def assert_found(found: Any, objects: Sequence[Planted], resize: str, *, labels: Sequence[str] = (),
                 pad: str = "centre") -> None:
    """``found`` are ``objects``, best first, at their places in FRAME's pixels (``pad``: the letterbox's border)."""
    import pytest

    assert [(d.class_id, round(d.score, 4)) for d in found] == [(o.class_id, o.score) for o in objects]
    for detection, obj in zip(found, objects):
        assert detection.box == pytest.approx(in_source(obj.box, resize, pad), abs=0.01)
        assert detection.label == (labels[obj.class_id] if labels else str(obj.class_id))


def planted_onnx(path: Path, outputs: Mapping[str, np.ndarray], *, size: tuple[int, int] = (640, 640),
                 sized: Sequence[str] = (), metadata: Mapping[str, str] | None = None,
                 extra_inputs: Mapping[str, Sequence[int]] | None = None) -> Path:
    """An ONNX model at ``path`` with input ``images`` [1, 3, H, W] whose outputs are ``outputs`` (float32 or
    int64 arrays). Outputs named in ``sized`` are multiplied by a second input ``orig_target_sizes`` [1, 2]
    int64 as (w, h, w, h) — D-FINE's post-processor. ``extra_inputs`` adds unused float inputs."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    width, height = size
    inputs = [helper.make_tensor_value_info("images", TensorProto.FLOAT, [1, 3, height, width])]
    nodes = [helper.make_node("ReduceMean", ["images"], ["mean"], keepdims=0),
             helper.make_node("Mul", ["mean", "zero_f"], ["nothing_f"]),
             helper.make_node("Cast", ["nothing_f"], ["nothing_i"], to=TensorProto.INT64)]
    initializers = [numpy_helper.from_array(np.array(0.0, np.float32), "zero_f")]
    if sized:
        inputs.append(helper.make_tensor_value_info("orig_target_sizes", TensorProto.INT64, [1, 2]))
        initializers.append(numpy_helper.from_array(np.array([1, 2], np.int64), "repeat"))
        initializers.append(numpy_helper.from_array(np.array([1], np.int64), "axis1"))
        nodes += [helper.make_node("Cast", ["orig_target_sizes"], ["sizes_f"], to=TensorProto.FLOAT),
                  helper.make_node("Tile", ["sizes_f", "repeat"], ["whwh"]),
                  helper.make_node("Unsqueeze", ["whwh", "axis1"], ["whwh_q"])]
    for name, shape in (extra_inputs or {}).items():
        inputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, list(shape)))
    graph_outputs = []
    for name, value in outputs.items():
        integer = np.issubdtype(value.dtype, np.integer)
        value = value.astype(np.int64 if integer else np.float32)
        initializers.append(numpy_helper.from_array(value, f"{name}_planted"))
        planted = f"{name}_planted"
        if name in sized:
            nodes.append(helper.make_node("Mul", [planted, "whwh_q"], [f"{name}_scaled"]))
            planted = f"{name}_scaled"
        nodes.append(helper.make_node("Add", [planted, "nothing_i" if integer else "nothing_f"], [name]))
        graph_outputs.append(helper.make_tensor_value_info(
            name, TensorProto.INT64 if integer else TensorProto.FLOAT, list(value.shape)))
    graph = helper.make_graph(nodes, "planted", inputs, graph_outputs, initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="edgeinfer-tests")
    model.ir_version = 8
    if metadata:
        helper.set_model_props(model, dict(metadata))
    onnx.checker.check_model(model)
    path.write_bytes(model.SerializeToString())
    return path


def _cxcywh(box: Box, size: tuple[int, int]) -> list[float]:
    x1, y1, x2, y2 = box
    width, height = size
    return [(x1 + x2) / 2 / width, (y1 + y2) / 2 / height, (x2 - x1) / width, (y2 - y1) / height]


def detr_outputs(objects: Sequence[Planted], *, queries: int, classes: int, size: tuple[int, int] = (640, 640),
                 softmax: bool = False, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(boxes [1, Q, 4] cx, cy, w, h normalised, logits [1, Q, C]): the objects in the first queries, the rest
    background (low logits; with ``softmax`` the last column, "no object", wins). Background queries get
    random boxes."""
    rng = np.random.default_rng(seed)
    boxes = np.concatenate([rng.uniform(0.2, 0.8, (1, queries, 2)), rng.uniform(0.05, 0.3, (1, queries, 2))], -1)
    logits = rng.uniform(-9.0, -5.0, (1, queries, classes))
    if softmax:
        logits[0, :, -1] = 6.0
    for q, obj in enumerate(objects):
        boxes[0, q] = _cxcywh(obj.box, size)
        if softmax:  # probabilities: the planted class its score, "no object" the rest but a sliver
            probabilities = np.full(classes, 1e-4)
            probabilities[obj.class_id] = obj.score
            probabilities[-1] = 1.0 - probabilities[:-1].sum()
            logits[0, q] = np.log(probabilities)
        else:
            logits[0, q, obj.class_id] = np.log(obj.score / (1.0 - obj.score))
    return boxes.astype(np.float32), logits.astype(np.float32)


def ultralytics_rtdetr_output(objects: Sequence[Planted], *, classes: int = 80, queries: int = 300,
                              size: tuple[int, int] = (640, 640)) -> np.ndarray:
    """Ultralytics RT-DETR's [1, Q, 4+nc]: cx, cy, w, h normalised, then sigmoid scores."""
    boxes, logits = detr_outputs(objects, queries=queries, classes=classes, size=size)
    return np.concatenate([boxes, 1.0 / (1.0 + np.exp(-logits))], axis=-1).astype(np.float32)


ULTRALYTICS_METADATA = {"author": "Ultralytics", "description": "Ultralytics rtdetr-l model", "task": "detect",
                        "imgsz": "[640, 640]", "stride": "32",
                        "names": str({i: f"c{i}" for i in range(80)})}


def dfine_outputs(objects: Sequence[Planted], *, queries: int = 300,
                  size: tuple[int, int] = (640, 640)) -> dict[str, np.ndarray]:
    """D-FINE's deploy outputs before the size scaling: labels [1, Q], boxes [1, Q, 4] x1, y1, x2, y2
    normalised (the graph multiplies them by orig_target_sizes), scores [1, Q]."""
    width, height = size
    labels = np.zeros((1, queries), np.int64)
    boxes = np.tile(np.array([0.4, 0.4, 0.6, 0.6], np.float32), (1, queries, 1))
    scores = np.full((1, queries), 0.01, np.float32)
    for q, obj in enumerate(objects):
        x1, y1, x2, y2 = obj.box
        labels[0, q], scores[0, q] = obj.class_id, obj.score
        boxes[0, q] = [x1 / width, y1 / height, x2 / width, y2 / height]
    return {"labels": labels, "boxes": boxes, "scores": scores}


def yolox_grid(size: tuple[int, int] = (640, 640)) -> tuple[np.ndarray, np.ndarray]:
    """Each row's cell (column, row) and stride, YOLOX's order (strides 8, 16, 32; row-major)."""
    width, height = size
    cells, strides = [], []
    for stride in (8, 16, 32):
        rows, columns = height // stride, width // stride
        ys, xs = np.meshgrid(np.arange(rows), np.arange(columns), indexing="ij")
        cells.append(np.stack([xs, ys], -1).reshape(-1, 2))
        strides.append(np.full(rows * columns, stride))
    return np.concatenate(cells).astype(np.float64), np.concatenate(strides).astype(np.float64)


def yolox_output(objects: Sequence[Planted], *, classes: int = 80, size: tuple[int, int] = (640, 640),
                 decoded: bool, seed: int = 0) -> np.ndarray:
    """A YOLOX head's [1, N, 5+nc]: every row a plausible raw prediction (offsets within the cell, a small
    box, low objectness); each object planted at the stride-16 cell holding its centre and, a little weaker
    and shifted, at the next cell (NMS must merge them). ``decoded``: boxes as pixels, as the graph's own
    decoding leaves them; else raw offsets."""
    rng = np.random.default_rng(seed)
    cells, strides = yolox_grid(size)
    rows = np.zeros((cells.shape[0], 5 + classes))
    rows[:, :2] = rng.uniform(0.1, 0.9, (cells.shape[0], 2))
    rows[:, 2:4] = rng.uniform(-0.5, 1.0, (cells.shape[0], 2))
    rows[:, 4] = rng.uniform(0.0, 0.05, cells.shape[0])
    rows[:, 5:] = rng.uniform(0.0, 0.3, (cells.shape[0], classes))
    first16 = int((strides == 8).sum())
    columns16 = size[0] // 16
    for obj in objects:
        x1, y1, x2, y2 = obj.box
        cx, cy, w, h = (x1 + x2) / 2, (y1 + y2) / 2, x2 - x1, y2 - y1
        for shift, weaker in ((0, 1.0), (1, 0.9)):
            gx, gy = int(cx // 16) + shift, int(cy // 16)
            row = first16 + gy * columns16 + gx
            rows[row, :4] = [cx / 16 - gx + shift * 0.05, cy / 16 - gy, np.log(w / 16), np.log(h / 16)]
            rows[row, 4] = 0.98 * weaker
            rows[row, 5:] = 0.01
            rows[row, 5 + obj.class_id] = obj.score / 0.98
    if decoded:
        rows[:, :2] = (rows[:, :2] + cells) * strides[:, None]
        rows[:, 2:4] = np.exp(rows[:, 2:4]) * strides[:, None]
    return rows[None].astype(np.float32)
