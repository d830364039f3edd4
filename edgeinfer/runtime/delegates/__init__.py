"""Delegate registry and loading.

Built-in delegates are listed by name and imported on first use; a third-party package can add
one through the ``edgeinfer.delegates`` entry-point group (``name = "pkg.module:DelegateClass"``).
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterable
from typing import TYPE_CHECKING

from ..engine import Engine
from ..model import ModelFormat, ModelInfo
from .base import Delegate

if TYPE_CHECKING:
    from ...device.profiles import Profile

ENTRY_POINT_GROUP = "edgeinfer.delegates"

BUILTIN_DELEGATES: dict[str, str] = {
    "xnnpack": "edgeinfer.runtime.delegates.xnnpack:XnnpackDelegate",
    "onnxruntime": "edgeinfer.runtime.delegates.onnxruntime:OnnxRuntimeDelegate",
    "openvino": "edgeinfer.runtime.delegates.openvino:OpenVinoDelegate",
    "coral": "edgeinfer.runtime.delegates.coral:CoralDelegate",
    "tensorrt": "edgeinfer.runtime.delegates.tensorrt:TensorRTDelegate",
    "onnxruntime-gpu": "edgeinfer.runtime.delegates.onnxruntime_gpu:OnnxRuntimeGpuDelegate",
}

#: the order tried when no device profile matches (and neither the caller nor the environment names one)
DEFAULT_ORDER: dict[ModelFormat, tuple[str, ...]] = {
    ModelFormat.TFLITE: ("xnnpack", "openvino"),
    ModelFormat.EDGETPU_TFLITE: ("xnnpack",),
    ModelFormat.ONNX: ("onnxruntime", "openvino"),
    ModelFormat.OPENVINO_IR: ("openvino",),
    ModelFormat.TENSORRT_PLAN: ("tensorrt",),
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
    profile: Profile | str | None = None,
    root: str | os.PathLike | None = None,
    strict: bool | None = None,
    profile_dirs: Iterable[str | os.PathLike] = (),
) -> Engine:
    """Load ``model`` on ``delegate`` (``name`` or ``name:device``), or on the best delegate for this device.

    With no delegate: ``$EDGEINFER_DELEGATE``, else the device profile's order (detected from
    ``root``, default ``/``), filtered by availability and the model's format. The engine's
    ``fallback_reason`` says why earlier candidates were passed over and ``selection`` holds the
    plan; ``strict=True`` turns a fallback into an error. NoDelegateAvailable lists every
    candidate's reason when none works. See :mod:`edgeinfer.selection`.
    """
    from ..selection import load as select_and_load

    return select_and_load(model, delegate, threads=threads, profile=profile, root=root, strict=strict,
                           profile_dirs=profile_dirs)


__all__ = ["ENTRY_POINT_GROUP", "Delegate", "delegate_names", "get_delegate", "load", "split_delegate"]
