"""Every Ultralytics export layout through the real pipeline: small ONNX models (support.yolo_models) whose
outputs hold objects planted at known places, run by ONNX Runtime on a photo-sized frame that the letterbox
pads; each planted object must come out in source pixels, with its class, label, score, keypoints, mask or
rotated box — and what is not an object (duplicates, NaN rows, bad classes) must not."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from support import yolo_models as ym
from support.pipeline import allocations_per_frame
from support.yolo_models import INPUT, NAMES, Planted, Quantized

import edgeinfer
from edgeinfer.pipeline.decoders import DecoderSettings
from edgeinfer.pipeline.postprocess import KEYPOINT_NAMES, Detections
from edgeinfer.pipeline.preprocess import Transform
from edgeinfer.pipeline.tasks import read_model
from edgeinfer.runtime.model import inspect_model

#: source frames: landscape (the letterbox pads above and below), portrait (left and right)
SOURCES = {"landscape": (640, 480), "portrait": (480, 640)}
PX = 1.0  # source pixels a decoded coordinate may be off by (float rounding only)

#: a person, its duplicate (NMS removes it), a car over the person (another class: kept), a car, a weak person.
#: Every object lies inside the part of the input both frames' letterboxes fill (x 64-256, y 8-248).
PERSON = Planted((80, 40, 150, 200), 0, 0.9)
PERSON_TWIN = Planted((83, 44, 152, 205), 0, 0.8)
CAR_ON_PERSON = Planted((82, 42, 148, 198), 1, 0.6)
CAR = Planted((170, 60, 250, 120), 1, 0.95)
WEAK = Planted((180, 150, 240, 240), 0, 0.3)
SCENE = [PERSON, PERSON_TWIN, CAR_ON_PERSON, CAR, WEAK]
#: what the scene decodes to, best first
EXPECTED = [CAR, PERSON, CAR_ON_PERSON]


# ------------------------------------------------------------------------------- helpers

def letterbox(source: tuple[int, int], size: tuple[int, int] = INPUT) -> tuple[float, float, float]:
    """Scale and padding of the letterbox from ``source`` (w, h) into a model input of ``size`` (w, h)."""
    (sw, sh), (w, h) = source, size
    scale = min(w / sw, h / sh)
    return scale, (w - round(sw * scale)) // 2, (h - round(sh * scale)) // 2


def to_source(source: tuple[int, int], x: float, y: float, size: tuple[int, int] = INPUT) -> tuple[float, float]:
    scale, px, py = letterbox(source, size)
    return (x - px) / scale, (y - py) / scale


def source_box(source: tuple[int, int], box: tuple[float, ...], size: tuple[int, int] = INPUT) -> tuple[float, ...]:
    return (*to_source(source, box[0], box[1], size), *to_source(source, box[2], box[3], size))


@pytest.fixture(scope="module")
def frames(tmp_path_factory) -> dict[str, Path]:
    """One photo-like frame (noise and a gradient) per source size, written as PNG."""
    import cv2

    folder = tmp_path_factory.mktemp("frames")
    rng = np.random.default_rng(28)
    paths = {}
    for name, (w, h) in SOURCES.items():
        image = rng.integers(0, 255, (h, w, 3), np.uint8)
        image[..., 0] = np.linspace(0, 255, w, dtype=np.uint8)[None, :]
        paths[name] = folder / f"{name}.png"
        cv2.imwrite(str(paths[name]), image)
    return paths


def run(model: Path, image: Path, **options) -> Detections:
    """The detections of one frame through ``edgeinfer.Pipeline``."""
    with edgeinfer.Pipeline(model, image, **options) as pipeline:
        (result,) = [r.result for r in pipeline]
    assert isinstance(result, Detections)
    return result


def layout_of(model: Path, **options) -> str:
    """The layout the pipeline would read ``model`` with (no task or decoder named)."""
    with edgeinfer.load(model, "onnxruntime") as engine:
        return read_model(engine, task=options.get("task"), decoder=options.get("decoder"), labels=None,
                          settings=DecoderSettings()).layout.name


def assert_found(found: Detections, expected: list[Planted], source: tuple[int, int], *, px: float = PX,
                 names: dict[int, str] = NAMES, size: tuple[int, int] = INPUT) -> None:
    """``found`` is ``expected`` (best first): boxes in source pixels, classes, labels and scores."""
    assert [d.class_id for d in found] == [p.class_id for p in expected]
    for detection, planted in zip(found, expected):
        assert detection.box == pytest.approx(source_box(source, planted.box, size), abs=px)
        assert detection.label == names[planted.class_id]
        assert detection.score == pytest.approx(planted.score, abs=1e-5)


def snapped(objects: list[Planted], q: Quantized) -> list[Planted]:
    """``objects`` as a quantised, normalised output holds them (x, y, w, h and the score on its steps)."""
    size = np.array(INPUT * 2, np.float32)
    out = []
    for obj in objects:  # float32, as the model's table holds them before its QuantizeLinear
        cx, cy, bw, bh = (q.grid(np.array(obj.xywh, np.float32) / size) * size).tolist()
        out.append(Planted((cx - bw / 2, cy - bh / 2, cx + bw / 2, cy + bh / 2), obj.class_id,
                           float(q.grid(np.array(obj.score, np.float32)))))
    return out


# --------------------------------------------------------------------------------- detect

@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("transposed", [False, True], ids=["C-by-N", "N-by-C"])
def test_detect_boxes_come_out_in_source_pixels_after_per_class_nms(tmp_path, frames, source, transposed):
    model = ym.yolo_detect(tmp_path / "yolo.onnx", SCENE, transposed=transposed)
    assert layout_of(model) == "yolo"
    found = run(model, frames[source])
    assert_found(found, EXPECTED, SOURCES[source])


def test_detect_normalised_coordinates_tflite_style(tmp_path, frames):
    model = ym.yolo_detect(tmp_path / "normalised.onnx", SCENE, normalised=True)
    for source in SOURCES:
        assert_found(run(model, frames[source]), EXPECTED, SOURCES[source])


@pytest.mark.parametrize("q", [Quantized(1 / 255, 0, "uint8"), Quantized(1 / 255, -128, "int8")],
                         ids=["uint8", "int8"])
def test_detect_quantised_output(tmp_path, frames, q):
    """A QuantizeLinear at the end (normalised coordinates, as an int8 TFLite export has them): the threshold is
    compared in the quantised steps, boxes and scores come out dequantised."""
    model = ym.yolo_detect(tmp_path / "quantised.onnx", SCENE, normalised=True, quantized=q)
    spec = inspect_model(model).outputs[0]
    assert (spec.dtype, spec.scale, spec.zero_point) == (q.dtype, pytest.approx(q.scale), q.zero_point)
    for source in SOURCES:
        assert_found(run(model, frames[source]), snapped(EXPECTED, q), SOURCES[source])


def test_detect_without_metadata_and_named(tmp_path, frames):
    """Without metadata the layout is guessed from the shape (labels are then class numbers); ``decoder=``
    names it; thresholds and max_detections are the options'."""
    model = ym.yolo_detect(tmp_path / "bare.onnx", SCENE, metadata=False)
    assert layout_of(model) == "yolo"
    found = run(model, frames["landscape"])
    assert [d.label for d in found] == ["1", "0", "1"]
    assert_found(found, EXPECTED, SOURCES["landscape"], names={0: "0", 1: "1"})
    named = run(model, frames["landscape"], decoder="yolo", task="detect", score_threshold=0.25, max_detections=2)
    assert_found(named, [CAR, PERSON], SOURCES["landscape"], names={0: "0", 1: "1"})
    low = run(model, frames["landscape"], decoder="yolo", score_threshold=0.25, iou_threshold=0.99)
    assert len(low) == 5  # every planted object once the IoU threshold keeps the duplicate


# ------------------------------------------------------------------------------- yolov5

V5_PERSON = Planted((80, 40, 150, 200), 0, 0.72, objectness=0.9, class_scores=(0.8, 0.1))
V5_TWIN = Planted((82, 42, 150, 204), 0, 0.63, objectness=0.9, class_scores=(0.7, 0.0))
V5_UNSURE = Planted((170, 150, 240, 240), 1, 0.285, objectness=0.3, class_scores=(0.0, 0.95))
V5_EITHER = Planted((100, 200, 140, 240), 0, 0.36, objectness=0.9, class_scores=(0.4, 0.4))
V5_CAR = Planted((170, 60, 250, 120), 1, 0.855, objectness=0.95, class_scores=(0.1, 0.9))


@pytest.mark.parametrize("metadata", [True, False], ids=["metadata", "bare"])
def test_yolov5_scores_are_objectness_times_class(tmp_path, frames, metadata):
    model = ym.yolov5(tmp_path / "v5.onnx", [V5_PERSON, V5_TWIN, V5_UNSURE, V5_EITHER, V5_CAR], metadata=metadata)
    assert layout_of(model) == "yolov5"
    found = run(model, frames["portrait"])
    names = NAMES if metadata else {0: "0", 1: "1"}
    assert_found(found, [V5_CAR, V5_PERSON], SOURCES["portrait"], names=names)


# ---------------------------------------------------------------------------------- pose

def _person(box: tuple[float, float, float, float], score: float, k: int, d: int, seed: int) -> Planted:
    rng = np.random.default_rng(seed)
    x1, y1, x2, y2 = box
    points = np.stack([rng.uniform(x1, x2, k), rng.uniform(y1, y2, k), rng.uniform(0.05, 1.0, k)], 1)
    return Planted(box, 0, score, keypoints=tuple(tuple(float(v) for v in p[:d]) for p in points))


@pytest.mark.parametrize("kpt_shape", [(17, 3), (5, 2)], ids=["17x3", "5x2"])
@pytest.mark.parametrize("normalised", [False, True], ids=["pixels", "normalised"])
def test_pose_keypoints_are_mapped_to_the_source(tmp_path, frames, kpt_shape, normalised):
    k, d = kpt_shape
    people = [_person((80, 40, 150, 200), 0.9, k, d, 1), _person((170, 60, 250, 240), 0.8, k, d, 2)]
    twin = Planted((82, 42, 150, 204), 0, 0.7, keypoints=people[0].keypoints)
    model = ym.yolo_pose(tmp_path / "pose.onnx", [*people, twin], kpt_shape=kpt_shape, normalised=normalised)
    assert layout_of(model) == "yolo-pose"
    source = SOURCES["portrait"]
    found = run(model, frames["portrait"])
    assert_found(found, people, source, px=PX, names={0: "person"})
    names = KEYPOINT_NAMES if k == 17 else tuple(f"kp{i}" for i in range(k))
    for detection, planted in zip(found, people):
        assert tuple(p.name for p in detection.keypoints) == names
        for point, (x, y, *visibility) in zip(detection.keypoints, planted.keypoints):
            assert (point.x, point.y) == pytest.approx(to_source(source, x, y), abs=PX)
            assert point.score == pytest.approx(visibility[0] if visibility else 1.0, abs=1e-5)
    if k == 17:
        assert found[0].keypoint("nose").x == found[0].keypoints[0].x


# ---------------------------------------------------------------------------- segment

SEG_PERSON = Planted((90, 40, 170, 120), 0, 0.9, mask=("disc", 130, 80, 40))
SEG_CAR = Planted((180, 100, 250, 220), 1, 0.8, mask=("rect", 185, 110, 230, 200))


def planted_mask(shape: tuple, source: tuple[int, int], size: tuple[int, int] = INPUT) -> np.ndarray:
    """The planted shape at source resolution: each source pixel's centre mapped into the input and tested."""
    scale, px, py = letterbox(source, size)
    w, h = source
    ys, xs = np.mgrid[0:h, 0:w]
    x, y = (xs + 0.5) * scale + px, (ys + 0.5) * scale + py
    kind, *v = shape
    if kind == "disc":
        return np.hypot(x - v[0], y - v[1]) <= v[2]
    return (x >= v[0]) & (x <= v[2]) & (y >= v[1]) & (y <= v[3])


def iou(a: np.ndarray, b: np.ndarray) -> float:
    return float((a & b).sum() / max((a | b).sum(), 1))


def assert_masks(found: Detections, expected: list[Planted], source: tuple[int, int],
                 size: tuple[int, int] = INPUT) -> None:
    w, h = source
    for detection, planted in zip(found, expected):
        mask = detection.mask
        assert mask is not None and planted.mask is not None
        x1, y1, x2, y2 = detection.box  # the mask is cropped to its box
        assert mask.x >= math.floor(x1) and mask.y >= math.floor(y1)
        assert mask.x + mask.pixels.shape[1] <= math.ceil(x2) and mask.y + mask.pixels.shape[0] <= math.ceil(y2)
        assert iou(mask.full(w, h), planted_mask(planted.mask, source, size)) > 0.9
        polygons = detection.to_dict()["polygons"]
        assert polygons and len(polygons[0]) >= 4


@pytest.mark.parametrize("source", SOURCES)
def test_segment_masks_land_on_the_planted_shapes(tmp_path, frames, source):
    twin = Planted((92, 42, 170, 122), 0, 0.7, mask=("disc", 130, 80, 40))
    model = ym.yolo_seg(tmp_path / "seg.onnx", [SEG_PERSON, SEG_CAR, twin])
    assert layout_of(model) == "yolo-seg"
    found = run(model, frames[source])
    assert_found(found, [SEG_PERSON, SEG_CAR], SOURCES[source])
    assert_masks(found, [SEG_PERSON, SEG_CAR], SOURCES[source])


def test_segment_without_metadata_named_and_quantised(tmp_path, frames):
    source = SOURCES["landscape"]
    bare = ym.yolo_seg(tmp_path / "bare.onnx", [SEG_PERSON, SEG_CAR], metadata=False)
    assert layout_of(bare) == "yolo-seg"
    for found in (run(bare, frames["landscape"]), run(bare, frames["landscape"], decoder="yolo-seg")):
        assert [d.label for d in found] == ["0", "1"]
        assert_masks(found, [SEG_PERSON, SEG_CAR], source)
    q = Quantized(1 / 255, 0, "uint8")
    quantised = ym.yolo_seg(tmp_path / "quantised.onnx", [SEG_PERSON, SEG_CAR], normalised=True,
                            quantized=(q, Quantized(0.5, 0, "int8")))
    assert [s.quantized for s in inspect_model(quantised).outputs] == [True, True]
    found = run(quantised, frames["landscape"])
    assert_found(found, snapped([SEG_PERSON, SEG_CAR], q), source)
    assert_masks(found, [SEG_PERSON, SEG_CAR], source)


def test_segment_prototypes_channels_last_and_on_a_small_input(tmp_path, frames):
    """TFLite's [1, H/4, W/4, nm] prototypes; a 96x96 input's [1, 32, 24, 24] ones (fewer cells a side than masks:
    still nm x H x W, told by the input's size at stride 4)."""
    source = SOURCES["landscape"]
    tflite = ym.yolo_seg(tmp_path / "tflite.onnx", [SEG_PERSON, SEG_CAR], channels_last=True, normalised=True)
    assert list(inspect_model(tflite).outputs[1].shape) == [1, 64, 80, 32]
    found = run(tflite, frames["landscape"])
    assert_found(found, [SEG_PERSON, SEG_CAR], source)
    assert_masks(found, [SEG_PERSON, SEG_CAR], source)
    small, size = [Planted((20, 20, 60, 60), 0, 0.9, mask=("disc", 40, 40, 20)),
                   Planted((62, 30, 90, 80), 1, 0.8, mask=("rect", 64, 35, 86, 75))], (96, 96)
    model = ym.yolo_seg(tmp_path / "small.onnx", small, input_size=size)
    assert list(inspect_model(model).outputs[1].shape) == [1, 32, 24, 24]
    found = run(model, frames["landscape"])
    assert_found(found, small, source, size=size)
    assert_masks(found, small, source, size)


# -------------------------------------------------------------------------------- obb

def corners(cx: float, cy: float, w: float, h: float, angle: float) -> np.ndarray:
    """The four corners of a rotated rectangle (Ultralytics' xywhr: w along (cos, sin))."""
    c, s = math.cos(angle), math.sin(angle)
    along, across = np.array([w / 2 * c, w / 2 * s]), np.array([-h / 2 * s, h / 2 * c])
    return np.array([cx, cy]) + np.array([along + across, along - across, -along - across, -along + across])


def rotated(centre: tuple[float, float], w: float, h: float, angle: float, class_id: int, score: float) -> Planted:
    cx, cy = centre
    return Planted((cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2), class_id, score, angle=angle)


#: a tilted person and its near twin (suppressed); two parallel diagonal sticks of the same class, 20 px apart:
#: their upright boxes overlap (IoU > 0.5) but the rotated ones do not, so both stay
OBB_PERSON = rotated((120, 100), 100, 30, 0.5, 0, 0.9)
OBB_TWIN = rotated((121, 101), 98, 30, 0.52, 0, 0.8)
STICK = rotated((200, 160), 120, 10, math.pi / 4, 1, 0.85)
STICK_BESIDE = rotated((200 - 20 * math.sin(math.pi / 4), 160 + 20 * math.cos(math.pi / 4)), 120, 10,
                       math.pi / 4, 1, 0.75)


def assert_rotated(found: Detections, expected: list[Planted], source: tuple[int, int]) -> None:
    scale, _, _ = letterbox(source)
    assert [d.class_id for d in found] == [p.class_id for p in expected]
    for detection, planted in zip(found, expected):
        cx, cy, w, h = planted.xywh
        assert detection.rotated is not None
        assert detection.rotated == pytest.approx((*to_source(source, cx, cy), w / scale, h / scale, planted.angle),
                                                  abs=PX)
        points = np.array([to_source(source, x, y) for x, y in corners(cx, cy, w, h, planted.angle)])
        assert detection.box == pytest.approx((*points.min(0), *points.max(0)), abs=PX)
        assert detection.score == pytest.approx(planted.score, abs=1e-5)
        assert len(detection.to_dict()["rotated_box"]) == 5


@pytest.mark.parametrize("source", SOURCES)
def test_obb_rotated_boxes_and_their_upright_boxes(tmp_path, frames, source):
    model = ym.yolo_obb(tmp_path / "obb.onnx", [OBB_PERSON, OBB_TWIN, STICK, STICK_BESIDE])
    assert layout_of(model) == "yolo-obb"
    found = run(model, frames[source])
    assert_rotated(found, [OBB_PERSON, STICK, STICK_BESIDE], SOURCES[source])
    named = run(ym.yolo_obb(tmp_path / "normalised.onnx", [OBB_PERSON, STICK], normalised=True), frames[source],
                decoder="yolo-obb")
    assert_rotated(named, [OBB_PERSON, STICK], SOURCES[source])


# --------------------------------------------------------------------------- end to end

def test_end2end_detect_keeps_the_graphs_selection(tmp_path, frames):
    """The graph's NMS chose the rows: overlapping boxes of one class both stay; padding rows are not boxes."""
    model = ym.yolo_end2end(tmp_path / "e2e.onnx", [PERSON, PERSON_TWIN, CAR])
    assert layout_of(model) == "yolo-end2end"
    for source in SOURCES:
        assert_found(run(model, frames[source]), [CAR, PERSON, PERSON_TWIN], SOURCES[source])
    bare = ym.yolo_end2end(tmp_path / "bare.onnx", [PERSON, CAR], metadata=False, normalised=True)
    assert layout_of(bare) == "yolo-end2end"
    assert_found(run(bare, frames["portrait"]), [CAR, PERSON], SOURCES["portrait"], names={0: "0", 1: "1"})


@pytest.mark.parametrize("kpt_shape", [(17, 3), (5, 2)], ids=["17x3", "5x2"])
def test_end2end_pose(tmp_path, frames, kpt_shape):
    k, d = kpt_shape
    people = [_person((80, 40, 150, 200), 0.9, k, d, 3), _person((170, 60, 250, 240), 0.8, k, d, 4)]
    model = ym.yolo_end2end(tmp_path / "pose.onnx", people, task="pose", names={0: "person"}, kpt_shape=kpt_shape)
    assert layout_of(model) == "yolo-end2end"
    source = SOURCES["landscape"]
    found = run(model, frames["landscape"])
    assert_found(found, people, source, names={0: "person"})
    for detection, planted in zip(found, people):
        assert len(detection.keypoints) == k
        for point, (x, y, *visibility) in zip(detection.keypoints, planted.keypoints):
            assert (point.x, point.y) == pytest.approx(to_source(source, x, y), abs=PX)
            assert point.score == pytest.approx(visibility[0] if visibility else 1.0, abs=1e-5)


def test_end2end_segment_and_obb(tmp_path, frames):
    source = SOURCES["portrait"]
    seg = ym.yolo_end2end(tmp_path / "seg.onnx", [SEG_PERSON, SEG_CAR], task="segment")
    assert layout_of(seg) == "yolo-end2end"
    found = run(seg, frames["portrait"])
    assert_found(found, [SEG_PERSON, SEG_CAR], source)
    assert_masks(found, [SEG_PERSON, SEG_CAR], source)
    bare = ym.yolo_end2end(tmp_path / "bare_seg.onnx", [SEG_PERSON, SEG_CAR], task="segment", metadata=False)
    assert layout_of(bare) == "yolo-end2end"  # two outputs, one of prototypes: a segmentation model's
    assert_masks(run(bare, frames["portrait"]), [SEG_PERSON, SEG_CAR], source)
    obb = ym.yolo_end2end(tmp_path / "obb.onnx", [OBB_PERSON, STICK], task="obb")
    assert_rotated(run(obb, frames["portrait"]), [OBB_PERSON, STICK], source)


def test_end2end_rows_that_are_not_boxes_are_skipped(tmp_path, frames):
    """Negative and fractional classes, NaN and inf are skipped; a class past the names keeps its number."""
    table = ym.end2end_rows([PERSON])
    bad = [(1, [80, 40, 150, 200, 0.95, -1]), (2, [80, 40, 150, 200, 0.95, 0.5]),
           (3, [np.nan, 40, 150, 200, 0.95, 0]), (4, [80, 40, np.inf, 200, 0.95, 0]),
           (5, [80, 40, 150, 200, np.nan, 0]), (6, [80, 40, 150, 200, np.inf, 0]),
           (7, [170, 60, 250, 120, 0.85, 7]), (8, [80, 40, 150, 200, 0.95, np.nan]), (9, [1, 1, 2, 2, 0.97, 1e30])]
    for row, values in bad:
        table[row] = values
    found = run(ym.yolo_end2end(tmp_path / "bad.onnx", [], table=table), frames["landscape"])
    assert [(d.class_id, d.label) for d in found] == [(0, "person"), (7, "class 7")]
    assert found[1].box == pytest.approx(source_box(SOURCES["landscape"], (170, 60, 250, 120)), abs=PX)


# ---------------------------------------------------------------------------- bad input

def test_nan_and_inf_candidates_never_become_boxes(tmp_path, frames):
    table = ym.candidate_rows([CAR], nc=2)
    poisoned = [(5, [np.nan, 60, 80, 60, 0.9, 0]), (6, [120, 60, np.inf, 60, 0.9, 0]),
                (7, [120, 60, 80, 60, np.nan, 0.9]), (8, [120, 60, 80, 60, np.inf, 0]),
                (9, [120, 60, 80, 60, 0.9, -np.inf]), (10, [-np.inf, 60, 80, 60, 0.9, 0])]
    for row, values in poisoned:
        table[row] = values
    found = run(ym.yolo_detect(tmp_path / "nan.onnx", [], table=table), frames["landscape"])
    assert_found(found, [CAR], SOURCES["landscape"])
    k, d = 17, 3
    person = _person((80, 40, 150, 200), 0.9, k, d, 5)
    pose = ym.candidate_rows([person, _person((170, 60, 250, 240), 0.8, k, d, 6)], nc=1, extra=k * d)
    pose[ym._slot(1, len(pose)), 4 + 1 + 7] = np.nan  # a keypoint of the second person
    found = run(ym.yolo_pose(tmp_path / "pose.onnx", [], table=pose), frames["landscape"])
    assert_found(found, [person], SOURCES["landscape"], names={0: "person"})


@pytest.mark.parametrize("build", [
    lambda path: ym.yolo_detect(path, [WEAK]),
    lambda path: ym.yolo_detect(path, [], normalised=True, quantized=Quantized(1 / 255, -128, "int8")),
    lambda path: ym.yolov5(path, [V5_UNSURE, V5_EITHER]),
    lambda path: ym.yolo_pose(path, [_person((80, 40, 150, 200), 0.2, 17, 3, 7)]),
    lambda path: ym.yolo_seg(path, []),
    lambda path: ym.yolo_obb(path, [rotated((120, 100), 100, 30, 0.5, 0, 0.1)]),
    lambda path: ym.yolo_end2end(path, [WEAK]),
    lambda path: ym.yolo_end2end(path, [], task="segment"),
], ids=["yolo", "quantised", "yolov5", "pose", "seg", "obb", "end2end", "end2end-seg"])
def test_no_candidate_above_the_threshold_is_no_detection(tmp_path, frames, build):
    found = run(build(tmp_path / "empty.onnx"), frames["portrait"])
    assert found == Detections() and found.to_dict() == []


def test_a_table_no_layout_fits_names_its_outputs_and_every_layout_tried(tmp_path, frames):
    model = ym.save_model(tmp_path / "odd.onnx", {"output0": np.zeros((1, 7, 333), np.float32)},
                          metadata=ym.ultralytics_metadata("detect"))
    with pytest.raises(ValueError, match="no output layout") as error:
        edgeinfer.Pipeline(model, frames["landscape"])
    message = str(error.value)
    assert "output0 [1, 7, 333] float32" in message
    for name in ("yolo-end2end", "yolo", "yolov5", "tflite-ssd", "ssd"):
        assert f"{name}: " in message
    with pytest.raises(ValueError, match="decoder 'yolo-pose' does not fit"):
        edgeinfer.Pipeline(ym.yolo_detect(tmp_path / "detect.onnx", SCENE), frames["landscape"], decoder="yolo-pose")


def test_layout_choice_does_not_misfire(tmp_path):
    """Shapes alone (no metadata): [1, 6, N] is a two-class detector, [1, 3N, 85] YOLOv5 over 80 classes,
    [1, 300, 6] selected boxes; the metadata's end2end keeps a candidate table from the end-to-end layout."""
    coco = {i: f"c{i}" for i in range(80)}
    assert layout_of(ym.yolo_detect(tmp_path / "a.onnx", [PERSON], metadata=False)) == "yolo"
    assert layout_of(ym.yolo_detect(tmp_path / "b.onnx", [PERSON], metadata=False, transposed=True)) == "yolo"
    assert layout_of(ym.yolov5(tmp_path / "c.onnx", [V5_PERSON], names=coco, metadata=False)) == "yolov5"
    single = Planted(V5_PERSON.box, 0, 0.72, objectness=0.9, class_scores=(0.8,))
    assert layout_of(ym.yolov5(tmp_path / "d.onnx", [single], names={0: "one"}, metadata=False)) == "yolov5"
    assert layout_of(ym.yolo_end2end(tmp_path / "e.onnx", [PERSON], metadata=False)) == "yolo-end2end"
    assert layout_of(ym.yolo_end2end(tmp_path / "f.onnx", [PERSON])) == "yolo-end2end"
    pose = ym.yolo_pose(tmp_path / "g.onnx", [_person((80, 40, 150, 200), 0.9, 17, 3, 8)])
    assert layout_of(pose) == "yolo-pose"
    with pytest.raises(ValueError, match="end2end"):
        layout_of(pose, decoder="yolo-end2end")


def test_decoding_a_frame_allocates_what_the_kept_candidates_need(tmp_path):
    """80 classes over 1680 candidates: a float copy of the scores would be 538 KB a frame. The threshold is
    compared in the output's own values (quantised steps too), so a frame allocates what its kept rows need."""
    coco = {i: f"c{i}" for i in range(80)}
    objects = [Planted(PERSON.box, 3, 0.9), Planted(CAR.box, 70, 0.8)]
    quantised = Quantized(1 / 255, -128, "int8")
    for model in (ym.yolo_detect(tmp_path / "float.onnx", objects, names=coco),
                  ym.yolo_detect(tmp_path / "int8.onnx", objects, names=coco, normalised=True, quantized=quantised)):
        with edgeinfer.load(model, "onnxruntime") as engine:
            engine.input_view(0)[...] = 0.5
            engine.invoke()
            decoder = read_model(engine, task=None, decoder=None, labels=None, settings=DecoderSettings()).decoder
            transform = Transform(0.5, 0.5, 0.0, 8.0, 640, 480)
            assert [d.class_id for d in decoder(transform)] == [3, 70]
            per_frame, growth = allocations_per_frame((decoder(transform) for _ in range(40)), frames=40)
        assert per_frame < 32 * 1024, f"{model.name}: {per_frame:.0f} bytes a frame"
        assert growth < 64 * 1024  # nothing kept from frame to frame
