"""Output layouts and their decoders: the one registry a pipeline, the CLI's ``--decoder`` and bench use.

:func:`choose_layout` picks how a model's outputs are read: the layout a caller names (``--decoder``, the
``decoder`` key of an agent pipeline) must fit or it is an error saying why; otherwise the layouts of the
model's task (the caller's, or the task its metadata states) are tried in :data:`LAYOUTS` order — the ones
its metadata points at first — and the first that fits is used. When none fits, the error names each output
and every layout tried with the reason it did not fit.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .anchors import SSD_ANCHORS
from .base import (
    DEFAULT_IOU_THRESHOLD,
    DEFAULT_MAX_DETECTIONS,
    DEFAULT_SCORE_THRESHOLD,
    DecoderInput,
    DecoderSettings,
    Layout,
    LayoutMismatch,
    Preprocessing,
)
from .classify import CLASSIFY
from .detr import DETR, DFINE, RF_DETR
from .movenet import MOVENET
from .semantic import SEMANTIC
from .ssd import SSD, TFLITE_SSD
from .yolo import YOLO_LAYOUTS
from .yolox import YOLOX

if TYPE_CHECKING:
    from ...runtime.model import ModelInfo

#: every layout, in the order they are tried (the classifier last: a 1xN output fits it whatever it means)
LAYOUTS: dict[str, Layout] = {layout.name: layout for layout in (
    TFLITE_SSD, YOLOX, *YOLO_LAYOUTS, DFINE, RF_DETR, DETR, SSD, SSD_ANCHORS, MOVENET, SEMANTIC, CLASSIFY,
)}
#: every ``--decoder`` word
DECODER_NAMES = tuple(LAYOUTS)


def get_layout(name: str) -> Layout:
    """The layout called ``name`` (ValueError lists the known ones)."""
    try:
        return LAYOUTS[name]
    except KeyError:
        raise ValueError(f"decoder must be one of {', '.join(DECODER_NAMES)}, not {name!r}") from None


def _preferred(layout: Layout, source: DecoderInput) -> bool:
    """Whether the model's metadata points at this layout's family (tried first)."""
    return source.metadata.producer == "ultralytics" and layout.name.startswith("yolo")


def choose_layout(source: DecoderInput, *, task: str | None = None, decoder: str | None = None,
                  model: str = "the model") -> tuple[Layout, Any]:
    """The layout that reads ``source``'s outputs and its decoder (ValueError when none does, saying why)."""
    if decoder is not None:
        layout = get_layout(decoder)
        if task is not None and task not in layout.tasks:
            raise ValueError(f"decoder {decoder!r} gives task {layout.task!r} results, not {task!r}")
        try:
            return layout, layout.build(source)
        except LayoutMismatch as exc:
            raise LayoutMismatch(f"decoder {decoder!r} does not fit {model}: {exc} "
                             f"(outputs: {source.describe()})") from None
    wanted = task or source.metadata.task
    candidates = [layout for layout in LAYOUTS.values()
                  if (wanted is None or wanted in layout.tasks) and (layout.guessed or _preferred(layout, source))]
    candidates.sort(key=lambda layout: not _preferred(layout, source))  # stable: the metadata's family first
    tried = []
    for layout in candidates:
        try:
            return layout, layout.build(source)
        except LayoutMismatch as exc:
            tried.append(f"{layout.name}: {exc}")
    what = f"task {wanted!r}" if wanted else "any task"
    raise LayoutMismatch(f"no output layout edgeinfer knows fits {model} for {what}; its outputs are "
                     f"{source.describe()}. Tried: {'; '.join(tried) or 'none'}. Name one with --decoder "
                     f"({', '.join(DECODER_NAMES)}) or --task.")


def model_labels(model: ModelInfo) -> Any:
    """The class names a model states in its metadata, as Labels (None when it states none)."""
    from ..labels import Labels

    names = model.metadata.names
    return Labels(dict(names)) if names else None


__all__ = ["DECODER_NAMES", "DEFAULT_IOU_THRESHOLD", "DEFAULT_MAX_DETECTIONS", "DEFAULT_SCORE_THRESHOLD",
           "LAYOUTS", "DecoderInput", "DecoderSettings", "Layout", "LayoutMismatch", "Preprocessing",
           "choose_layout", "get_layout", "model_labels"]
