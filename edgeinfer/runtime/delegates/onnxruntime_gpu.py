"""``onnxruntime-gpu``: ONNX Runtime's TensorRT / CUDA execution providers — the alternative GPU path.

Written against ONNX Runtime's documented provider options; **not yet run on hardware**
(docs/hardware.md). Device string: ``tensorrt`` (TensorRT EP, CUDA EP for what TensorRT cannot
take; the default when the build has it) or ``cuda`` (CUDA EP only), plus ``,fp16`` / ``,int8``
for the TensorRT EP and ``,gpu:N``. The TensorRT EP caches its engines under
``<cache>/onnxruntime-trt`` (see :func:`~edgeinfer.runtime.delegates.tensorrt.cache.default_cache_dir`).

ONNX Runtime silently runs on the CPU when the CUDA libraries fail to load; this delegate checks
the providers the session really got and refuses (``DelegateUnavailable``) instead.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from ...util.native import captured_native_stderr
from ..engine import Engine
from ..model import ModelFormat, ModelInfo
from .base import Delegate, runtime_missing_reason
from .onnxruntime import OnnxRuntimeEngine
from .tensorrt.cuda import nvidia_gpu_problem

if TYPE_CHECKING:
    from ...device.host import Host

TRT_EP = "TensorrtExecutionProvider"
CUDA_EP = "CUDAExecutionProvider"
GPU_INSTALL_HINT = ("install a GPU build of ONNX Runtime: pip install onnxruntime-gpu (x86-64; uninstall onnxruntime "
                    "first), or NVIDIA's Jetson wheel for your JetPack (firmware_scripts/setup-jetson.sh)")


def parse_device(device: str | None) -> tuple[str | None, dict]:
    """``"tensorrt,fp16,gpu:1"`` -> ``("tensorrt", {"fp16": True, "gpu": 1})``; None picks the best provider."""
    kind: str | None = None
    options: dict = {"fp16": False, "int8": False, "gpu": 0}
    for token in (t.strip().lower() for t in (device or "").split(",") if t.strip()):
        if token in ("tensorrt", "trt", "cuda"):
            kind = "tensorrt" if token == "trt" else token
        elif token in ("fp16", "int8"):
            options[token] = True
        elif (found := re.fullmatch(r"gpu:?(\d+)", token)) is not None:
            options["gpu"] = int(found.group(1))
        else:
            raise ValueError(f"onnxruntime-gpu option {token!r} is not one of tensorrt, cuda, fp16, int8, gpu:N")
    return kind, options


#: the shared library each GPU execution provider of an onnxruntime-gpu wheel ships in ``onnxruntime/capi``
_PROVIDER_LIBRARIES = {TRT_EP: "libonnxruntime_providers_tensorrt", CUDA_EP: "libonnxruntime_providers_cuda"}


def _available_providers() -> list[str]:
    """The execution providers this onnxruntime build has, from the provider libraries it ships: an
    availability check must not import the runtime (22 MiB in an agent that never runs an ONNX model).
    A layout without ``capi`` (another packaging) asks onnxruntime itself."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec("onnxruntime")
    locations = list(spec.submodule_search_locations or ()) if spec is not None else []
    capi = Path(locations[0]) / "capi" if locations else None
    if capi is None or not capi.is_dir():
        import onnxruntime as ort

        return list(ort.get_available_providers())
    found = [ep for ep, library in _PROVIDER_LIBRARIES.items() if any(capi.glob(f"{library}.*"))]
    return [*found, "CPUExecutionProvider"]


class OnnxRuntimeGpuDelegate(Delegate):
    """ONNX Runtime with the TensorRT and/or CUDA execution providers."""

    name = "onnxruntime-gpu"
    formats = frozenset({ModelFormat.ONNX})
    extra = "onnx-gpu"
    packages = ("onnxruntime-gpu", "onnxruntime")

    def unavailable_reason(self, device: str | None = None, host: Host | None = None) -> str | None:
        try:
            kind, _options = parse_device(device)
        except ValueError as exc:
            return str(exc)
        problems = []
        if host is not None and not host.live and (gpu_problem := nvidia_gpu_problem(host)):
            problems.append(gpu_problem)
        missing = runtime_missing_reason("onnxruntime", "onnx-gpu")
        if missing:
            problems.append(missing)
        else:
            try:
                providers = _available_providers()
            except Exception as exc:  # a broken install: say so, never raise from here
                providers = []
                problems.append(f"onnxruntime failed to import ({exc})")
            wanted = {"tensorrt": [TRT_EP], "cuda": [CUDA_EP], None: [TRT_EP, CUDA_EP]}[kind]
            if providers and not any(p in providers for p in wanted):
                problems.append(f"this onnxruntime build has no {' or '.join(wanted)} (it has "
                                f"{', '.join(providers)}) — {GPU_INSTALL_HINT}")
        return "; ".join(problems) or None

    def load(self, model: ModelInfo, *, threads: int | None = None, device: str | None = None) -> Engine:
        from ...errors import DelegateUnavailable
        from .tensorrt.cache import default_cache_dir

        kind, options = parse_device(device)
        self.check(model, device)
        available = _available_providers()
        if kind is None:
            kind = "tensorrt" if TRT_EP in available else "cuda"
        cuda = (CUDA_EP, {"device_id": options["gpu"]})
        if kind == "tensorrt":
            cache = default_cache_dir() / "onnxruntime-trt"
            cache.mkdir(parents=True, exist_ok=True)
            providers = [(TRT_EP, {
                "device_id": options["gpu"], "trt_fp16_enable": options["fp16"], "trt_int8_enable": options["int8"],
                "trt_engine_cache_enable": True, "trt_engine_cache_path": str(cache),
                "trt_timing_cache_enable": True, "trt_timing_cache_path": str(cache),
            }), cuda]
        else:
            providers = [cuda]
        with captured_native_stderr("ONNX Runtime"):
            engine = OnnxRuntimeEngine(model, threads=threads, providers=[*providers, "CPUExecutionProvider"],
                                       device=device)
        engine.delegate = self.name
        active = engine._session.get_providers()
        if providers[0][0] not in active:
            engine.close()
            raise DelegateUnavailable(
                self.name, f"ONNX Runtime could not start {providers[0][0]} (the session got {', '.join(active)}): "
                "the CUDA / cuDNN / TensorRT libraries it needs did not load — check LD_LIBRARY_PATH and the "
                "versions your onnxruntime-gpu release requires",
            )
        return engine
