"""A detector judged by its boxes: both models run through the pipeline's own preprocessing and decoder.

A model is a detector when the pipeline reads it as one (:func:`~edgeinfer.pipeline.tasks.read_model`:
its metadata's task, else the first output layout that fits gives boxes — YOLO detect / pose / segment /
obb, SSD ...). Its optimised twin is decoded with the same task and layout, named explicitly, so the
twin's metadata does not matter; both at the same score threshold and NMS IoU, and the boxes compared
by :mod:`.agreement`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...pipeline.agreement import AP_SCORE_FLOOR, MAX_BOXES, Box, box_agreement, shortfalls
from .options import DEFAULT_NMS_IOU, OptimizeOptions, Progress
from .report import Accuracy

if TYPE_CHECKING:
    import numpy as np

    from ...pipeline.tasks import ModelReading
    from ...runtime.engine import Engine
    from .images import ImageFeeder


@dataclass(frozen=True)
class DetectorOutputs:
    """A model's results on the validation images: boxes per image and the raw output tensors."""

    boxes: list[list[Box]]
    raw: list[np.ndarray]
    #: class names by id, from the model's metadata (ids where it has none)
    names: dict[int, str]


def read_detector(engine: Engine, decoder: str | None = None) -> ModelReading | None:
    """How the pipeline reads ``engine`` when that gives boxes; None for a classifier or an unknown layout. A
    ``decoder`` named (a built-in's or an installed plug-in's) must fit: LayoutMismatch / PluginError otherwise."""
    from ...pipeline.decoders import DecoderSettings, model_labels
    from ...pipeline.tasks import read_model

    try:
        reading = read_model(engine, task=None, decoder=decoder, labels=model_labels(engine.model),
                             settings=DecoderSettings())
    except ValueError:  # no layout fits: judged as before (no top-1 to compare, refused unless forced)
        if decoder is not None:  # the one the caller named does not fit (or its plug-in does not load): say why
            raise
        return None
    return reading if reading.gives_boxes else None


def _decoder(engine: Engine, reading: ModelReading, score_threshold: float, iou_threshold: float) -> Any:
    """``reading``'s task and layout built on ``engine``'s outputs, at ``score_threshold`` and NMS at
    ``iou_threshold``."""
    from ...pipeline.decoders import DecoderSettings, model_labels
    from ...pipeline.tasks import read_model

    settings = DecoderSettings(score_threshold=score_threshold, iou_threshold=iou_threshold,
                               max_detections=MAX_BOXES)
    try:
        return read_model(engine, task=reading.task, decoder=reading.layout.name, labels=model_labels(engine.model),
                          settings=settings).decoder
    except ValueError as exc:
        from ...errors import OptimizeError

        raise OptimizeError(f"the outputs of {Path(engine.model.path).name} do not read as "
                            f"{reading.layout.name}, as the original's do: {exc}") from None


def detect_images(engine: Engine, reading: ModelReading, images: Sequence[Path], feeder: ImageFeeder,
                  score_threshold: float, say: Progress | None = None, *,
                  iou_threshold: float = DEFAULT_NMS_IOU) -> DetectorOutputs:
    """Run ``engine`` on every image: its boxes (source pixels, NMS at ``iou_threshold``) and its raw outputs."""
    import numpy as np

    from ...errors import OptimizeError

    decode = _decoder(engine, reading, score_threshold, iou_threshold)
    boxes, raw = [], []
    for number, image in enumerate(images, 1):
        transform = feeder(image, engine.input_view(0))
        engine.invoke()
        outputs = [np.array(engine.output_view(i), np.float64).reshape(-1) for i in range(len(engine.outputs))]
        if not all(np.all(np.isfinite(out)) for out in outputs):
            raise OptimizeError(f"the model produced NaN/inf on {image.name} — the conversion is broken")
        raw.append(np.concatenate(outputs))
        try:
            found = decode(transform)
        except ValueError as exc:  # a decoder's own failure, not the caller's argument: name the image
            raise OptimizeError(f"decoding {engine.model.path}'s outputs on {image.name} failed: {exc}") from exc
        boxes.append([Box(tuple(map(float, d.box)), float(d.score), int(d.class_id)) for d in found])
        if say:
            say(f"validating: image {number}/{len(images)} ({image.name})")
    return DetectorOutputs(boxes, raw, dict(engine.model.metadata.names or {}))


def compare_detections(reference: DetectorOutputs, engine: Engine, reading: ModelReading, images: Sequence[Path],
                       feeder: ImageFeeder, options: OptimizeOptions, say: Progress | None = None) -> Accuracy:
    """Run the optimised ``engine`` on ``images`` and compare its boxes with the original's."""
    import numpy as np

    from ...errors import OptimizeError

    ranked = detect_images(engine, reading, images, feeder, AP_SCORE_FLOOR, say, iou_threshold=options.iou_threshold)
    diffs = []
    for a, b in zip(reference.raw, ranked.raw):
        if a.shape != b.shape:
            raise OptimizeError(f"the optimised model's outputs have {b.size} values, the original's {a.size}")
        diffs.append(np.abs(a - b))
    boxes = box_agreement([image.name for image in images], reference.boxes, ranked.boxes,
                          score_threshold=options.score_threshold, names=reference.names)
    return Accuracy(images=len(images), decisive=0, top1_agreement=None, top1_agreement_all=None,
                    top5_agreement=None, mean_abs_diff=float(np.mean([d.mean() for d in diffs])),
                    max_abs_diff=float(max(d.max() for d in diffs)), boxes=boxes)


def box_refusal(label: str, accuracy: Accuracy, options: OptimizeOptions) -> str | None:
    """Why ``label``'s boxes fail the thresholds, every figure named; None when they pass."""
    from ...pipeline.agreement import figure_text

    boxes = accuracy.boxes
    if boxes is None:
        return None
    if not boxes.reference_boxes:
        return (f"the original model finds no box at score >= {options.score_threshold:g} on any of the "
                f"{boxes.images} validation images, so {label} cannot be judged — validate on images with the "
                "objects it detects")
    failed = shortfalls(boxes, options.box_minimums)
    if not failed:
        return None
    passed = [figure_text(name, getattr(boxes, name)) for name in options.box_minimums if name not in failed]
    return (f"{label}'s boxes disagree with the original's on {boxes.images} validation images "
            f"({boxes.matched} of {boxes.reference_boxes} boxes found, {boxes.candidate_boxes} given): "
            + ", ".join(failed.values()) + (f" (passed: {', '.join(passed)})" if passed else ""))
