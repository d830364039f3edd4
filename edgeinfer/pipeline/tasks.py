"""The one registry of tasks: what a pipeline can do with a model's outputs.

Each :class:`Task` names its default resize and builds its decoder bound to an engine's output
views. The pipeline, the agent's configuration, the CLI's ``--task`` choices and ``edgeinfer
bench`` all take the task names from :data:`TASK_NAMES`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .postprocess import ClassificationDecoder, DetectionDecoder, PoseDecoder, SegmentationDecoder
from .preprocess import input_geometry

if TYPE_CHECKING:
    from ..runtime.engine import Engine
    from .labels import Labels


@dataclass(frozen=True)
class DecoderSettings:
    """The task options a decoder reads (top-k, detection thresholds)."""

    top_k: int
    score_threshold: float
    iou_threshold: float
    max_detections: int


def _classify(engine: Engine, outputs: list[Any], labels: Labels | None, settings: DecoderSettings) -> Any:
    return ClassificationDecoder(outputs[0], engine.outputs[0], labels, settings.top_k)


def _detect(engine: Engine, outputs: list[Any], labels: Labels | None, settings: DecoderSettings) -> Any:
    height, width, _, _ = input_geometry(engine.inputs[0])
    return DetectionDecoder(outputs, engine.outputs, (width, height), labels,
                            score_threshold=settings.score_threshold, iou_threshold=settings.iou_threshold,
                            max_detections=settings.max_detections)


def _pose(engine: Engine, outputs: list[Any], labels: Labels | None, settings: DecoderSettings) -> Any:
    height, width, _, _ = input_geometry(engine.inputs[0])
    return PoseDecoder(outputs[0], engine.outputs[0], (width, height))


def _segment(engine: Engine, outputs: list[Any], labels: Labels | None, settings: DecoderSettings) -> Any:
    return SegmentationDecoder(outputs[0], engine.outputs[0], labels)


@dataclass(frozen=True)
class Task:
    """One thing a pipeline does with a model: how frames are resized, how outputs are decoded."""

    name: str
    summary: str
    #: the default resize: classification references use a plain resize; geometry tasks keep aspect
    resize: str
    #: a model's packed labels are used when the caller gives none
    embedded_labels: bool
    build_decoder: Callable[[Engine, list[Any], Labels | None, DecoderSettings], Any]

    def decoder(self, engine: Engine, labels: Labels | None, settings: DecoderSettings) -> Any:
        """This task's decoder bound to ``engine``'s output views (ValueError if the model does not fit)."""
        outputs = [engine.output_view(i) for i in range(len(engine.outputs))]
        return self.build_decoder(engine, outputs, labels, settings)


TASKS: dict[str, Task] = {task.name: task for task in (
    Task("classify", "top-k classes of the whole frame", "stretch", True, _classify),
    Task("detect", "boxes with scores and classes (SSD layouts)", "letterbox", False, _detect),
    Task("pose", "single-person keypoints (MoveNet)", "letterbox", False, _pose),
    Task("segment", "a class per pixel (DeepLab)", "letterbox", False, _segment),
)}
#: every task name, in the order help texts list them
TASK_NAMES = tuple(TASKS)


def get_task(name: str) -> Task:
    """The task called ``name`` (ValueError lists the known ones)."""
    try:
        return TASKS[name]
    except KeyError:
        raise ValueError(f"task must be one of {', '.join(TASK_NAMES)}, not {name!r}") from None
