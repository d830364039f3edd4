"""The delegate registry: every delegate by name, built-in or from a plug-in, and the default order.

Built-in delegates are listed by name and imported on first use; a third-party package adds one
through the ``edgeinfer.delegates`` entry-point group (``name = "pkg.module:DelegateClass"``, a
subclass of :class:`edgeinfer.Delegate`). Nothing here imports a delegate at module load, and
nothing here chooses between them: that is :mod:`edgeinfer.runtime.selection`.
"""

from __future__ import annotations

import importlib

from ..model import ModelFormat
from .base import Delegate

#: the entry-point group third-party delegates register in (a public interface: do not rename)
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
    from ...util.dist import entry_points  # not importlib.metadata's while no plug-in is installed (2 MiB)

    return entry_points(ENTRY_POINT_GROUP)


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


def delegate_target(name: str) -> str | None:
    """Where delegate ``name`` is defined, ``"module:Class"`` (None when no delegate has that name)."""
    return BUILTIN_DELEGATES.get(name) or _entry_points().get(name)


def split_delegate(spec: str) -> tuple[str, str | None]:
    """``"openvino:GPU"`` -> ``("openvino", "GPU")``; ``"xnnpack"`` -> ``("xnnpack", None)``."""
    name, _, device = spec.partition(":")
    return name.strip(), (device.strip() or None)


__all__ = ["BUILTIN_DELEGATES", "DEFAULT_ORDER", "ENTRY_POINT_GROUP", "delegate_names", "delegate_target",
           "get_delegate", "split_delegate"]
