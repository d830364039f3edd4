"""edgeinfer: an inference runtime and SDK for edge devices.

``import edgeinfer`` is cheap: no vendor runtime, no OpenCV, no hardware probing. Each public name
below is imported on first attribute access.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_LAZY = {
    "load": "edgeinfer.delegates",
    "get_delegate": "edgeinfer.delegates",
    "delegate_names": "edgeinfer.delegates",
    "Engine": "edgeinfer.engine",
    "inspect_model": "edgeinfer.model",
    "ModelInfo": "edgeinfer.model",
    "ModelFormat": "edgeinfer.model",
    "TensorSpec": "edgeinfer.model",
    "Labels": "edgeinfer.labels",
    "Preprocessor": "edgeinfer.preprocess",
    "Transform": "edgeinfer.preprocess",
    "ImageClassifier": "edgeinfer.classify",
    "Classification": "edgeinfer.postprocess",
    "Detection": "edgeinfer.postprocess",
    "Detections": "edgeinfer.postprocess",
    "Keypoint": "edgeinfer.postprocess",
    "Pose": "edgeinfer.postprocess",
    "Segmentation": "edgeinfer.postprocess",
    "Pipeline": "edgeinfer.pipeline",
    "FrameResult": "edgeinfer.pipeline",
    "PipelineStats": "edgeinfer.pipeline",
    "StageTimings": "edgeinfer.pipeline",
    "FrameSource": "edgeinfer.capture",
    "open_source": "edgeinfer.capture",
    "make_test_clip": "edgeinfer.capture",
    "read_image": "edgeinfer.images",
    "Agent": "edgeinfer.agent",
    "load_config": "edgeinfer.agent_config",
    "FleetManager": "edgeinfer.fleet.manager",
}
_ERRORS = (
    "EdgeInferError", "ModelError", "ModelNotFound", "ModelFormatError", "ModelLoadError",
    "UnsupportedOperator", "DelegateError", "DelegateUnavailable", "NoDelegateAvailable",
    "InferenceError", "InputMismatch", "ImageError", "LabelsError", "ProfileError", "CaptureError",
    "ConfigError", "ProtocolError", "UpdateRejected", "OutputError", "OptimizeError", "AccuracyRejected",
    "BenchmarkError", "MissingDependency", "DownloadError",
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
    from .agent import Agent
    from .agent_config import load_config
    from .capture import FrameSource, make_test_clip, open_source
    from .classify import ImageClassifier
    from .delegates import delegate_names, get_delegate, load
    from .engine import Engine
    from .errors import *  # noqa: F403
    from .fleet.manager import FleetManager
    from .images import read_image
    from .labels import Labels
    from .model import ModelFormat, ModelInfo, TensorSpec, inspect_model
    from .pipeline import FrameResult, Pipeline, PipelineStats, StageTimings
    from .postprocess import Classification, Detection, Detections, Keypoint, Pose, Segmentation
    from .preprocess import Preprocessor, Transform
