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

from ..errors import ModelError
from ..forms.regions import BOX_TASKS
from .decoders import DecoderInput, DecoderSettings, Layout, Preprocessing, choose_layout
from .preprocess import LETTERBOX_PAD, Preprocessor, input_geometry

if TYPE_CHECKING:
    from ..runtime.engine import Engine
    from ..runtime.model import ModelInfo, TensorSpec
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
        """Its results are Detections (boxes to track, count and keep as evidence): one of ``forms.regions.BOX_TASKS``,
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
    #: the channel order fed (rgb, bgr), where a letterbox's border goes (centre, corner) and its pixel value
    channels: str = "rgb"
    pad: str = "centre"
    pad_value: int = LETTERBOX_PAD

    def __str__(self) -> str:
        values = "as the quantised input states" if self.mean is None and self.std is None else \
            f"(pixel - {_values(self.mean)}) / {_values(self.std)}"
        return (f"task {self.task} ({self.task_from}), outputs read as {self.layout.name} ({self.layout.summary}); "
                f"frames {self.fed}, {values}")

    @property
    def fed(self) -> str:
        """The frames' resize, channel order and border in words: ``letterbox (border bottom-right, 114), BGR``."""
        border = {"centre": "centred", "corner": "border bottom-right"}[self.pad]
        resize = f"{self.resize} ({border}, {self.pad_value})" if self.resize == "letterbox" else self.resize
        return f"{resize}, {self.channels.upper()}"

    def feed(self) -> dict[str, Any]:
        """What a frame is fed as, for ``edgeinfer info --json`` and the optimiser's report."""
        return {"resize": self.resize, "channels": self.channels, "pad": self.pad, "pad_value": self.pad_value,
                "mean": self.mean, "std": self.std}

    def preprocessor(self, spec: TensorSpec, source_size: tuple[int, int]) -> Preprocessor:
        """The Preprocessor that feeds frames of ``source_size`` to input ``spec`` as this reading says."""
        return Preprocessor(spec, source_size, resize=self.resize, channels=self.channels,  # type: ignore[arg-type]
                            mean=self.mean, std=self.std, pad=self.pad, pad_value=self.pad_value)

    @property
    def gives_boxes(self) -> bool:
        """Whether the results are Detections (tracking, lines, zones and box events work on them)."""
        return get_task(self.task).boxes and self.layout.name != "semantic"


def read_model(engine: Engine, *, task: str | None, decoder: str | None, labels: Labels | None,
               settings: DecoderSettings, resize: str | None = None, mean: Any = None, std: Any = None,
               channels: str | None = None, pad: str | None = None) -> ModelReading:
    """How ``engine`` is read for ``task`` (None: the task its metadata states, else the first layout that fits)
    with the layout named ``decoder`` (None: chosen from its outputs). ValueError says why none fits; ModelError
    when the model's metadata states a channel order or border place that does not read and none is given."""
    given = {"resize": resize, "mean": mean, "std": std, "channels": channels, "pad": pad}
    refuse_unread(engine.model, given)
    layout, built = choose_layout(decoder_input(engine, labels, settings), task=task, decoder=decoder,
                                  model=engine.model.path)
    metadata = engine.model.metadata
    if task is not None:
        resolved, task_from = task, "given"
    elif metadata.task in layout.tasks:
        resolved, task_from = metadata.task, "the model's metadata"
    else:
        resolved, task_from = layout.task, "its outputs"
    feed = resolve_feed(engine.model, layout, resolved, **given)
    return ModelReading(resolved, layout, built, task_from=task_from, **feed)


def refuse_unread(model: ModelInfo, given: dict[str, Any]) -> None:
    """ModelError when ``model``'s metadata states a channel order or a border place that does not read (its
    ``refused`` words) and ``given`` holds no value that stands for it."""
    metadata = model.metadata
    for key, problem in metadata.refused.items():
        if given.get(key) is None:
            raise ModelError(f"{model.path}: {problem.replace(': ignored', '')}; fix its {metadata.source} "
                             f"or give {key} (--{key}) — frames fed some other way than the model expects give "
                             f"wrong answers, not an error")


def resolve_feed(model: ModelInfo, layout: Layout | None, task: str | None, *, resize: str | None = None,
                 mean: Any = None, std: Any = None, channels: str | None = None,
                 pad: str | None = None) -> dict[str, Any]:
    """How frames are fed to ``model`` read as ``layout`` for ``task``: each value the caller's, else what the model's
    metadata states, else its layout's family's (``Layout.preprocessing``), else the task's resize, the input type's
    normalisation (None: ``Preprocessor``'s own default), RGB and a centred border of grey 114."""
    metadata = model.metadata
    hints = layout.preprocessing if layout is not None else Preprocessing()
    if resize is None:
        resize = (("letterbox" if metadata.letterbox else None) or hints.resize
                  or (get_task(task).resize if task else "stretch"))
    if mean is None and std is None:
        mean, std = metadata.mean, metadata.std
        if mean is None and std is None and model.inputs and model.inputs[0].dtype.startswith("float"):
            mean, std = hints.mean, hints.std
    return {"resize": resize, "mean": mean, "std": std,
            "channels": channels or metadata.channels or hints.channels or "rgb",
            "pad": pad or metadata.pad or hints.pad or "centre",
            "pad_value": next(v for v in (metadata.pad_value, hints.pad_value, LETTERBOX_PAD) if v is not None)}


def read_model_file(model: ModelInfo, *, refuse: bool = True,
                    **given: Any) -> tuple[Layout | None, str | None, dict[str, Any]]:
    """How a pipeline would read ``model`` (an ``inspect_model`` result) with no runtime loaded: its layout (None when
    none fits, or an output's size is dynamic), its task and how frames are fed (``edgeinfer info``). The layouts are
    chosen by the outputs' shapes, the names and the metadata, as a run chooses them; the values are zeros.
    ``refuse``: ModelError for metadata a run refuses (False: what would be fed were it fixed)."""
    import numpy as np

    from .decoders import model_labels

    if refuse:
        refuse_unread(model, given)
    layout = None
    try:
        if model.outputs and all(d >= 0 for spec in model.outputs for d in spec.shape):
            height, width, _, _ = input_geometry(model.inputs[0])
            outputs = [np.zeros(spec.shape, np.dtype(spec.dtype)) for spec in model.outputs]
            source = DecoderInput(outputs, tuple(model.outputs), (width, height), model_labels(model),
                                  DecoderSettings(), model.metadata, tuple(model.inputs))
            layout, _ = choose_layout(source, model=model.path)
    except (ValueError, TypeError, IndexError):  # no layout fits; an input that is no image; a dtype numpy lacks
        layout = None
    task = model.metadata.task if layout is None or model.metadata.task in layout.tasks else layout.task
    return layout, task, resolve_feed(model, layout, task, **given)


def _values(value: Any) -> str:
    if value is None:
        return "default"
    return ",".join(f"{v:g}" for v in value) if isinstance(value, tuple) else f"{value:g}"


def read_run_model(engine: Engine, options: Any, labels: Labels | None) -> tuple[ModelReading, Labels | None]:
    """How a run reads its first engine (a batch row of it) for ``options`` (its PipelineOptions), and its
    labels: the caller's, else the labels file packed in the model (classifiers), else the class names its
    metadata states. LayoutMismatch when no layout fits; ValueError when tracking is asked of boxless results, or
    when an event or sampling rule cannot work with this model (a label it does not have, an ``uncertain`` band
    under the score threshold: pipeline/rule_check.py); what could not be checked is logged and in ``notes``."""
    from .decoders import model_labels
    from .labels import Labels
    from .rule_check import check_rules

    reading = read_model(engine, task=options.task, decoder=options.decoder, labels=labels,
                         settings=options.decoder_settings(), **options.feed_options())
    if labels is None:
        packed = Labels.embedded(engine.model) if get_task(reading.task).embedded_labels else None
        labels = packed or model_labels(engine.model)
        if labels is not None:  # the decoder names classes by the labels it was built with
            reading = read_model(engine, task=options.task, decoder=reading.layout.name, labels=labels,
                                 settings=options.decoder_settings(), **options.feed_options())
    if options.tracking and not reading.gives_boxes:
        raise ValueError(f"tracking, lines and zones need results with boxes; {engine.model.path} read as "
                         f"{reading.task!r} ({reading.layout.name}) gives none")
    notes = check_rules(options, labels, engine.model.path,
                        thresholded_boxes=reading.gives_boxes and reading.layout.thresholded)
    for note in notes:
        log.warning("%s", note)
    return (dataclasses.replace(reading, notes=notes) if notes else reading), labels
