"""The engine build cache: a built engine is kept on disk, keyed by everything it depends on.

The key is the model's sha256 + TensorRT version + GPU name + compute capability + the build
options (+ the INT8 calibration data), so a restart deserializes instead of rebuilding and a
change to any of them builds anew.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from ....util.fs import CACHE_DIR_ENV as CACHE_ENV  # where the engines go: util/fs.py's cache folder
from ....util.fs import atomic_write_bytes, atomic_write_text, default_cache_dir, sha256_file
from .options import TensorRTOptions

__all__ = ["CACHE_ENV", "cache_key", "cache_path", "default_cache_dir", "store_engine"]


def cache_key(model_sha256: str, trt_version: str, gpu_name: str, compute_capability: str,
              options: TensorRTOptions) -> dict[str, Any]:
    """Everything a built engine depends on; equal keys mean the cached engine can be reused."""
    build = {k: v for k, v in asdict(options).items() if k not in ("gpu", "calibration")}
    calibration_sha = None
    if options.precision == "int8" and options.calibration:
        calibration_sha = sha256_file(options.calibration)
    return {"model_sha256": model_sha256, "tensorrt": trt_version, "gpu": gpu_name,
            "compute_capability": compute_capability, "build": build, "calibration_sha256": calibration_sha}


def cache_path(cache_dir: Path, key: dict[str, Any]) -> Path:
    """``<cache>/tensorrt/<model sha[:16]>-<key digest[:16]>.engine`` (a .json sidecar says what it is)."""
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()
    return cache_dir / "tensorrt" / f"{key['model_sha256'][:16]}-{digest[:16]}.engine"


def store_engine(path: Path, key: dict[str, Any], model_path: str, plan: bytes) -> None:
    """Write a built engine to ``path`` and its .json sidecar (the key and the model), each atomically."""
    atomic_write_bytes(path, plan)
    atomic_write_text(path.with_suffix(".json"), json.dumps({**key, "model": model_path}, indent=2))
