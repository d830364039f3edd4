"""edgeinfer: an inference runtime and SDK for edge devices.

``import edgeinfer`` is cheap: no vendor runtime, no OpenCV, no hardware probing. Each public name
below is imported on first attribute access.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ._version import __version__

_LAZY = {
    "load": "edgeinfer.runtime.selection",
    "get_delegate": "edgeinfer.runtime.delegates.registry",
    "delegate_names": "edgeinfer.runtime.delegates.registry",
    "Delegate": "edgeinfer.runtime.delegates.base",
    "Engine": "edgeinfer.runtime.engine",
    "inspect_model": "edgeinfer.runtime.model",
    "ModelInfo": "edgeinfer.runtime.model",
    "ModelFormat": "edgeinfer.runtime.model",
    "TensorSpec": "edgeinfer.runtime.model",
    "Labels": "edgeinfer.pipeline.labels",
    "Preprocessor": "edgeinfer.pipeline.preprocess",
    "Transform": "edgeinfer.pipeline.preprocess",
    "ImageClassifier": "edgeinfer.pipeline.classify",
    "Classification": "edgeinfer.pipeline.postprocess",
    "Detection": "edgeinfer.pipeline.postprocess",
    "Detections": "edgeinfer.pipeline.postprocess",
    "Keypoint": "edgeinfer.pipeline.postprocess",
    "InstanceMask": "edgeinfer.pipeline.postprocess",
    "Segmentation": "edgeinfer.pipeline.postprocess",
    "Pipeline": "edgeinfer.pipeline.core",
    "MultiPipeline": "edgeinfer.pipeline.multi",
    "PipelineOptions": "edgeinfer.pipeline.options",
    "FrameResult": "edgeinfer.pipeline.stats",
    "PipelineStats": "edgeinfer.pipeline.stats",
    "StageTimings": "edgeinfer.pipeline.stats",
    "FrameSource": "edgeinfer.capture",
    "open_source": "edgeinfer.capture",
    "make_test_clip": "edgeinfer.capture",
    "read_image": "edgeinfer.capture.images",
    "Agent": "edgeinfer.agent.daemon",
    "load_config": "edgeinfer.agent.config",
    "FleetManager": "edgeinfer.fleet.manager",
}
_ERRORS = (
    "EdgeInferError", "ModelError", "ModelNotFound", "ModelFormatError", "ModelLoadError",
    "UnsupportedOperator", "UnsizedInput", "LayoutMismatch", "DelegateError", "DelegateUnavailable",
    "NoDelegateAvailable",
    "InferenceError", "DelegateFailed", "InputMismatch", "ImageError", "LabelsError", "ProfileError", "CaptureError",
    "ConfigError", "ProtocolError", "UpdateRejected", "CommandRejected", "OutputError", "OptimizeError",
    "AccuracyRejected", "BenchmarkError", "MissingDependency", "DownloadError", "ClosedError",
)
_LAZY.update({name: "edgeinfer.errors" for name in _ERRORS})

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'edgeinfer' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


if TYPE_CHECKING:  # pragma: no cover
    from .agent.config import load_config
    from .agent.daemon import Agent
    from .capture import FrameSource, make_test_clip, open_source
    from .capture.images import read_image
    from .errors import *  # noqa: F403
    from .fleet.manager import FleetManager
    from .pipeline.classify import ImageClassifier
    from .pipeline.core import Pipeline
    from .pipeline.labels import Labels
    from .pipeline.options import PipelineOptions
    from .pipeline.postprocess import Classification, Detection, Detections, InstanceMask, Keypoint, Segmentation
    from .pipeline.preprocess import Preprocessor, Transform
    from .pipeline.stats import FrameResult, PipelineStats, StageTimings
    from .runtime.delegates.base import Delegate
    from .runtime.delegates.registry import delegate_names, get_delegate
    from .runtime.engine import Engine
    from .runtime.model import ModelFormat, ModelInfo, TensorSpec, inspect_model
    from .runtime.selection import load
