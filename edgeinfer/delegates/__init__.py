"""Delegate registry and loading.

Built-in delegates are listed by name and imported on first use; a third-party package can add
one through the ``edgeinfer.delegates`` entry-point group (``name = "pkg.module:DelegateClass"``).
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path

from ..engine import Engine
from ..errors import DelegateUnavailable, NoDelegateAvailable
from ..model import ModelFormat, ModelInfo, inspect_model
from .base import Delegate

ENTRY_POINT_GROUP = "edgeinfer.delegates"

BUILTIN_DELEGATES: dict[str, str] = {
    "xnnpack": "edgeinfer.delegates.xnnpack:XnnpackDelegate",
    "onnxruntime": "edgeinfer.delegates.onnxruntime:OnnxRuntimeDelegate",
    "openvino": "edgeinfer.delegates.openvino:OpenVinoDelegate",
}

#: the order tried when neither the caller nor a device profile says otherwise
DEFAULT_ORDER: dict[ModelFormat, tuple[str, ...]] = {
    ModelFormat.TFLITE: ("xnnpack", "openvino"),
    ModelFormat.EDGETPU_TFLITE: ("xnnpack",),
    ModelFormat.ONNX: ("onnxruntime", "openvino"),
    ModelFormat.OPENVINO_IR: ("openvino",),
    ModelFormat.TENSORRT_PLAN: (),
}

_instances: dict[str, Delegate] = {}


def _entry_points() -> dict[str, str]:
    from importlib.metadata import entry_points

    return {ep.name: ep.value for ep in entry_points(group=ENTRY_POINT_GROUP)}


def delegate_names() -> list[str]:
    """Every registered delegate name: built-ins first, then entry points."""
    names = list(BUILTIN_DELEGATES)
    names += [n for n in _entry_points() if n not in BUILTIN_DELEGATES]
    return names


def get_delegate(name: str) -> Delegate:
    """The delegate registered as ``name`` (a ValueError lists the known names)."""
    if name in _instances:
        return _instances[name]
    target = BUILTIN_DELEGATES.get(name) or _entry_points().get(name)
    if target is None:
        raise ValueError(f"unknown delegate {name!r} — known: {', '.join(delegate_names())}")
    module_name, _, class_name = target.partition(":")
    delegate_class = getattr(importlib.import_module(module_name), class_name)
    _instances[name] = instance = delegate_class()
    return instance


def split_delegate(spec: str) -> tuple[str, str | None]:
    """``"openvino:GPU"`` -> ``("openvino", "GPU")``; ``"xnnpack"`` -> ``("xnnpack", None)``."""
    name, _, device = spec.partition(":")
    return name.strip(), (device.strip() or None)


def load(
    model: str | os.PathLike | ModelInfo,
    delegate: str | None = None,
    *,
    threads: int | None = None,
) -> Engine:
    """Load ``model`` on ``delegate`` (``name`` or ``name:device``), or the first that can run it.

    With no delegate, the candidates for the model's format are tried in order; the engine's
    ``fallback_reason`` says why earlier ones were skipped, and NoDelegateAvailable lists every
    candidate's reason when none works.
    """
    info = model if isinstance(model, ModelInfo) else inspect_model(Path(model))
    if delegate:
        name, device = split_delegate(delegate)
        return get_delegate(name).load(info, threads=threads, device=device)
    reasons: dict[str, str] = {}
    for name in DEFAULT_ORDER.get(info.format, ()):
        candidate = get_delegate(name)
        reason = candidate.unavailable_reason() or candidate.unsupported_reason(info)
        if reason:
            reasons[name] = reason
            continue
        try:
            engine = candidate.load(info, threads=threads)
        except DelegateUnavailable as exc:
            reasons[name] = exc.reason
            continue
        if reasons:
            engine.fallback_reason = "; ".join(f"{n}: {r}" for n, r in reasons.items())
        return engine
    raise NoDelegateAvailable(info.path, reasons or {"(none)": f"no delegate reads {info.format.value} models"})


__all__ = ["ENTRY_POINT_GROUP", "Delegate", "delegate_names", "get_delegate", "load", "split_delegate"]
