"""The one registry of tasks, and how a model is read for one: its task, its decoder, its preprocessing.

Each :class:`Task` names its default resize. :func:`read_model` decides, for an engine and the pipeline's
options, how its outputs are decoded (``edgeinfer.pipeline.decoders``) and how frames are fed to it —
explicit options first, then what the model's metadata states, then the output layout's family, then the
task's and the input type's defaults. The pipeline, the agent's configuration, the CLI's ``--task`` choices
and ``edgeinfer bench`` all take the task names from :data:`TASK_NAMES`.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .._regions import BOX_TASKS
from .decoders import DecoderInput, DecoderSettings, Layout, choose_layout
from .preprocess import input_geometry

if TYPE_CHECKING:
    from ..runtime.engine import Engine
    from .labels import Labels

log = logging.getLogger(__name__)

@dataclass(frozen=True)
class Task:
    """One thing a pipeline does with a model: how frames are resized by default, what its results are."""

    name: str
    summary: str
    #: the default resize: classification references use a plain resize; geometry tasks keep aspect
    resize: str
    #: a model's packed labels file (TFLite metadata) is used when the caller gives none
    embedded_labels: bool

    @property
    def boxes(self) -> bool:
        """Its results are Detections (boxes to track, count and keep as evidence): one of ``_regions.BOX_TASKS``,
        the tasks that take lines and zones, which the fleet manager checks too."""
        return self.name in BOX_TASKS


TASKS: dict[str, Task] = {task.name: task for task in (
    Task("classify", "top-k classes of the whole frame", "stretch", True),
    Task("detect", "boxes with scores and classes (SSD, YOLO, DETR, MediaPipe ...)", "letterbox", False),
    Task("pose", "people as boxes with keypoints (YOLO pose; MoveNet: a list of one)", "letterbox", False),
    Task("segment", "instances with masks (YOLO seg), or a class per pixel (DeepLab)", "letterbox", False),
    Task("obb", "oriented boxes (YOLO obb)", "letterbox", False),
)}
#: every task name, in the order help texts list them
TASK_NAMES = tuple(TASKS)


def get_task(name: str) -> Task:
    """The task called ``name`` (ValueError lists the known ones)."""
    try:
        return TASKS[name]
    except KeyError:
        raise ValueError(f"task must be one of {', '.join(TASK_NAMES)}, not {name!r}") from None


def decoder_input(engine: Engine, labels: Labels | None, settings: DecoderSettings) -> DecoderInput:
    """What a decoder is built from: ``engine``'s output views and specs, its input size, its metadata."""
    height, width, _, _ = input_geometry(engine.inputs[0])
    return DecoderInput([engine.output_view(i) for i in range(len(engine.outputs))], tuple(engine.outputs),
                        (width, height), labels, settings, engine.model.metadata, tuple(engine.inputs))


@dataclass(frozen=True, eq=False)
class ModelReading:
    """How a pipeline reads one engine: the layout of its outputs, its decoder, and how frames are fed to it."""

    task: str
    layout: Layout
    decoder: Any
    resize: str
    mean: float | tuple[float, ...] | None
    std: float | tuple[float, ...] | None
    #: where the task came from: "given", "the model's metadata" or "its outputs"
    task_from: str = "given"
    #: what could not be checked against the model (a rule's label on a model without labels): logged warnings
    notes: tuple[str, ...] = ()

    def __str__(self) -> str:
        values = "as the quantised input states" if self.mean is None and self.std is None else \
            f"(pixel - {_values(self.mean)}) / {_values(self.std)}"
        return (f"task {self.task} ({self.task_from}), outputs read as {self.layout.name} ({self.layout.summary}); "
                f"frames {self.resize}, {values}")

    @property
    def gives_boxes(self) -> bool:
        """Whether the results are Detections (tracking, lines, zones and box events work on them)."""
        return get_task(self.task).boxes and self.layout.name != "semantic"


def read_model(engine: Engine, *, task: str | None, decoder: str | None, labels: Labels | None,
               settings: DecoderSettings, resize: str | None = None, mean: Any = None, std: Any = None) -> ModelReading:
    """How ``engine`` is read for ``task`` (None: the task its metadata states, else the first layout that fits)
    with the layout named ``decoder`` (None: chosen from its outputs). ValueError says why none fits."""
    layout, built = choose_layout(decoder_input(engine, labels, settings), task=task, decoder=decoder,
                                  model=engine.model.path)
    metadata = engine.model.metadata
    if task is not None:
        resolved, task_from = task, "given"
    elif metadata.task in layout.tasks:
        resolved, task_from = metadata.task, "the model's metadata"
    else:
        resolved, task_from = layout.task, "its outputs"
    hints = layout.preprocessing
    if resize is None:
        resize = ("letterbox" if metadata.letterbox else None) or hints.resize or get_task(resolved).resize
    if mean is None and std is None:
        mean, std = metadata.mean, metadata.std
        if mean is None and std is None and engine.inputs[0].dtype.startswith("float"):
            mean, std = hints.mean, hints.std
    return ModelReading(resolved, layout, built, resize, mean, std, task_from)


def _values(value: Any) -> str:
    if value is None:
        return "default"
    return ",".join(f"{v:g}" for v in value) if isinstance(value, tuple) else f"{value:g}"


def read_run_model(engine: Engine, options: Any, labels: Labels | None) -> tuple[ModelReading, Labels | None]:
    """How a run reads its first engine (a batch row of it) for ``options`` (its PipelineOptions), and its
    labels: the caller's, else the labels file packed in the model (classifiers), else the class names its
    metadata states. LayoutMismatch when no layout fits; ValueError when tracking is asked of boxless results, or
    when an event or capture rule cannot work with this model (a label it does not have, an ``uncertain`` band
    under the score threshold: pipeline/rule_check.py); what could not be checked is logged and in ``notes``."""
    from .decoders import model_labels
    from .labels import Labels
    from .rule_check import check_rules

    reading = read_model(engine, task=options.task, decoder=options.decoder, labels=labels,
                         settings=options.decoder_settings())
    if labels is None:
        packed = Labels.embedded(engine.model) if get_task(reading.task).embedded_labels else None
        labels = packed or model_labels(engine.model)
        if labels is not None:  # the decoder names classes by the labels it was built with
            reading = read_model(engine, task=options.task, decoder=reading.layout.name, labels=labels,
                                 settings=options.decoder_settings())
    if options.tracking and not reading.gives_boxes:
        raise ValueError(f"tracking, lines and zones need results with boxes; {engine.model.path} read as "
                         f"{reading.task!r} ({reading.layout.name}) gives none")
    notes = check_rules(options, labels, engine.model.path,
                        thresholded_boxes=reading.gives_boxes and reading.layout.thresholded)
    for note in notes:
        log.warning("%s", note)
    return (dataclasses.replace(reading, notes=notes) if notes else reading), labels
