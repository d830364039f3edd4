"""How a TensorRT engine is built: precision, DLA core, GPU, workspace, INT8 calibration data."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any

CALIBRATION_ENV = "EDGEINFER_TRT_CALIBRATION"
DEFAULT_WORKSPACE_BYTES = 1 << 30
PRECISIONS = ("fp32", "fp16", "int8")


@dataclass(frozen=True, kw_only=True)
class TensorRTOptions:
    """How to build the engine. Different options never share a cached engine."""

    precision: str = "fp16"
    dla_core: int | None = None
    gpu: int = 0
    workspace_bytes: int = DEFAULT_WORKSPACE_BYTES
    #: a .npy file of preprocessed input batches (N x input shape) for INT8 calibration of a float model
    calibration: str | None = None

    @classmethod
    def from_device(cls, device: str | None, *, env: dict[str, str] | None = None) -> TensorRTOptions:
        """Parse ``"fp16"``, ``"int8,dla:0"``, ``"gpu:1"``… (ValueError names the bad token)."""
        env = os.environ if env is None else env
        values: dict[str, Any] = {"calibration": env.get(CALIBRATION_ENV) or None}
        for token in (t.strip().lower() for t in (device or "").split(",") if t.strip()):
            if token in PRECISIONS:
                values["precision"] = token
            elif (found := re.fullmatch(r"(dla|gpu):?(\d+)", token)) is not None:
                values["dla_core" if found.group(1) == "dla" else "gpu"] = int(found.group(2))
            else:
                raise ValueError(f"tensorrt option {token!r} is not one of fp32, fp16, int8, dla:N, gpu:N")
        return cls(**values)
