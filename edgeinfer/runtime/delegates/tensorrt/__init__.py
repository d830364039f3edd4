"""``tensorrt``: NVIDIA TensorRT through its Python API (8.6 and 10.x, tensor-name based).

Written against NVIDIA's documented API — **not yet run on hardware** (docs/hardware.md):

- an ONNX model is parsed with ``trt.OnnxParser`` and built with ``builder.build_serialized_network``
  using FP16 or INT8 (explicit Q/DQ models, or calibration data) and optionally a DLA core
  (:mod:`.build`);
- the serialized engine is cached on disk, keyed by the model's sha256 + TensorRT version + GPU name
  (+ compute capability and the build options), so a restart deserializes instead of rebuilding
  (:mod:`.cache`);
- inputs and outputs live in page-locked host buffers bound once; on an integrated GPU (Jetson)
  they are mapped, so there is no copy at all (:mod:`.engine`).

The CUDA runtime is reached with ``ctypes`` (:mod:`.cuda`), so no extra Python package is needed.
Device string (``tensorrt:<options>``, :mod:`.options`): comma-separated ``fp32`` | ``fp16`` |
``int8``, ``dla:N``, ``gpu:N`` — e.g. ``tensorrt:fp16``, ``tensorrt:int8,dla:0``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from ...engine import Engine
from ...model import ModelFormat, ModelInfo
from ..base import Delegate, runtime_missing_reason
from .cache import cache_key, cache_path, default_cache_dir
from .cuda import cuda_problem, nvidia_gpu_problem
from .options import TensorRTOptions

if TYPE_CHECKING:
    from ....device.host import Host
    from .engine import TensorRTEngine

TRT_INSTALL_HINT = ("on a Jetson: sudo apt-get install python3-libnvinfer (JetPack) and create the venv with "
                    "--system-site-packages (firmware_scripts/setup-jetson.sh); on x86-64: pip install "
                    "'edgeinfer[tensorrt]'")


def host_gpu_problem(host: Host) -> str | None:
    """Evidence of an NVIDIA GPU and TensorRT libraries under a detected root (not the live system)."""
    problem = nvidia_gpu_problem(host)
    if problem:
        return problem
    if host.find_library("libnvinfer.so*") is None:
        return (f"TensorRT libraries (libnvinfer.so.*) not found under {host.root} — on a Jetson: sudo apt-get "
                "install tensorrt (firmware_scripts/setup-jetson.sh); on x86-64: pip install 'edgeinfer[tensorrt]'")
    return None


class TensorRTDelegate(Delegate):
    """NVIDIA TensorRT on a CUDA GPU or DLA (Jetson, x86-64 with an NVIDIA GPU)."""

    name = "tensorrt"
    formats = frozenset({ModelFormat.ONNX, ModelFormat.TENSORRT_PLAN})
    extra = "tensorrt"
    packages = ("tensorrt",)

    def __init__(self, cache_dir: str | os.PathLike | None = None) -> None:
        self.cache_dir = Path(cache_dir) if cache_dir else None

    def unavailable_reason(self, device: str | None = None, host: Host | None = None) -> str | None:
        """None when TensorRT, libcudart and a GPU are usable (or, for a detected root, present), else why not."""
        try:
            TensorRTOptions.from_device(device)
        except ValueError as exc:
            return str(exc)
        problems = []
        if host is not None and not host.live:
            problems.append(host_gpu_problem(host))
        if runtime_missing_reason("tensorrt", self.extra):
            problems.append(f"python module 'tensorrt' is not installed — {TRT_INSTALL_HINT}")
        if host is None or host.live:
            problems.append(cuda_problem())
        return "; ".join(p for p in problems if p) or None

    def load(self, model: ModelInfo, *, threads: int | None = None, device: str | None = None) -> Engine:
        """Build (or reuse from the cache) and load an engine for ``model``."""
        options = TensorRTOptions.from_device(device)
        self.check(model, device)
        from .engine import TensorRTEngine  # with the builder: imported by the pipeline that runs TensorRT

        return TensorRTEngine(model, options=options, device=device, threads=threads, cache_dir=self.cache_dir)


def __getattr__(name: str) -> type:
    if name == "TensorRTEngine":
        from .engine import TensorRTEngine

        return TensorRTEngine
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["TensorRTDelegate", "TensorRTEngine", "TensorRTOptions", "cache_key", "cache_path", "default_cache_dir",
           "host_gpu_problem"]
