"""Output layouts and their decoders: the one registry a pipeline, the CLI's ``--decoder`` and bench use.

:func:`choose_layout` picks how a model's outputs are read: the layout a caller names (``--decoder``, the
``decoder`` key of an agent pipeline) must fit or it is an error saying why; otherwise the layouts of the
model's task (the caller's, or the task its metadata states) are tried in :data:`LAYOUTS` order — the ones
its metadata points at first — and the first that fits is used. When none fits, the error names each output
and every layout tried with the reason it did not fit.
"""

from __future__ import annotations

import importlib
import re
from typing import TYPE_CHECKING, Any

from ...errors import PluginError
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
#: every built-in ``--decoder`` word (:func:`decoder_names` adds the installed plug-ins')
DECODER_NAMES = tuple(LAYOUTS)
#: the entry-point group decoder plug-ins register in (a public interface: do not rename)
ENTRY_POINT_GROUP = "edgeinfer.decoders"
#: a decoder's name, built-in or plug-in: what the ``decoder`` key's schema accepts (the device checks it is installed)
DECODER_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
#: the form of such a name, in words (the schema's message, and the device's for a name not of that form)
DECODER_NAME_FORM = "a decoder's name (a built-in's or an installed plug-in's)"
_NAME = re.compile(DECODER_NAME_PATTERN.replace("$", r"\Z"))

_plugins: dict[str, Layout] = {}  # loaded plug-in layouts by name


def plugin_targets() -> dict[str, str]:
    """``{name: "module:attribute"}`` of the installed decoder plug-ins (a built-in's name left out); none imported."""
    from ...util.dist import entry_points  # not importlib.metadata's while no plug-in is installed

    return {name: target for name, target in entry_points(ENTRY_POINT_GROUP).items() if name not in LAYOUTS}


def decoder_names() -> tuple[str, ...]:
    """Every decoder word: the built-ins, then the installed plug-ins' (not imported)."""
    return (*DECODER_NAMES, *plugin_targets())


def decoder_problem(name: str) -> str | None:
    """Why ``name`` is no decoder here (None when it is one: a built-in, or an installed plug-in's entry point)."""
    if name in LAYOUTS:
        return None
    if not _NAME.match(name):  # in the words of the schema that refuses it (agent/document_schema.py)
        return f"decoder must be {DECODER_NAME_FORM}, got {name!r}"
    plugins = plugin_targets()
    if name in plugins:
        return None
    installed = f"; installed plug-ins: {', '.join(plugins)}" if plugins else \
        f" (no plug-in is installed: a package adds one under the entry-point group {ENTRY_POINT_GROUP!r})"
    return f"decoder must be one of {', '.join(DECODER_NAMES)}{installed}, not {name!r}"


def get_layout(name: str) -> Layout:
    """The layout called ``name``: a built-in, else an installed plug-in's, imported on first use (ValueError lists
    the known ones; PluginError when the plug-in does not import or is not a Layout of its name)."""
    if name in LAYOUTS:
        return LAYOUTS[name]
    if name in _plugins:
        return _plugins[name]
    problem = decoder_problem(name)
    if problem:
        raise ValueError(problem)
    _plugins[name] = layout = _load_plugin(name, plugin_targets()[name])
    return layout


def _load_plugin(name: str, target: str) -> Layout:
    """The Layout entry point ``name = target`` names (PluginError saying what is wrong with it)."""
    where = f"decoder plug-in {name!r} (entry point {ENTRY_POINT_GROUP}: {name} = {target}{_distribution(name)})"
    module_name, _, attribute = target.partition(":")
    try:
        found: Any = importlib.import_module(module_name.strip())
        for part in attribute.strip().split(".") if attribute.strip() else ():
            found = getattr(found, part)
    except Exception as exc:  # a plug-in's own fault, whatever it is: named, and the built-ins go on
        raise PluginError(f"{where} does not load: {type(exc).__name__}: {exc}") from exc
    if not isinstance(found, Layout):
        raise PluginError(f"{where} is a {type(found).__name__}, not an edgeinfer.pipeline.decoders.Layout")
    if found.name != name:
        raise PluginError(f"{where} is the layout {found.name!r}: an entry point's name must be its layout's name")
    return found


def _distribution(name: str) -> str:
    """``, from distribution NAME VERSION`` for an error message (empty when importlib.metadata cannot say)."""
    try:
        from importlib.metadata import entry_points

        for point in entry_points(group=ENTRY_POINT_GROUP):
            if point.name == name and point.dist is not None:
                return f", from {point.dist.name} {point.dist.version}"
    except Exception:  # only words for a message
        return ""
    return ""


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
                     f"({', '.join(decoder_names())}) or --task.")


def model_labels(model: ModelInfo) -> Any:
    """The class names a model states in its metadata, as Labels (None when it states none)."""
    from ..labels import Labels

    names = model.metadata.names
    return Labels(dict(names)) if names else None


__all__ = ["DECODER_NAMES", "DECODER_NAME_FORM", "DECODER_NAME_PATTERN", "DEFAULT_IOU_THRESHOLD",
           "DEFAULT_MAX_DETECTIONS", "DEFAULT_SCORE_THRESHOLD", "ENTRY_POINT_GROUP", "LAYOUTS", "DecoderInput",
           "DecoderSettings", "Layout", "LayoutMismatch", "Preprocessing", "choose_layout", "decoder_names",
           "decoder_problem", "get_layout", "model_labels", "plugin_targets"]
