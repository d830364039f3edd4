"""``tensorrt``: NVIDIA TensorRT through its Python API (8.6 and 10.x, tensor-name based).

Written against NVIDIA's documented API — **not yet run on hardware** (docs/hardware.md):

- an ONNX model is parsed with ``trt.OnnxParser`` and built with ``builder.build_serialized_network``
  using FP16 or INT8 (explicit Q/DQ models, or calibration data) and optionally a DLA core;
- the serialized engine is cached on disk, keyed by the model's sha256 + TensorRT version + GPU name
  (+ compute capability and the build options), so a restart deserializes instead of rebuilding;
- inputs and outputs live in page-locked host buffers allocated once (``cudaHostAlloc``) and bound
  once with ``context.set_tensor_address``; ``invoke()`` is copy-in, ``execute_async_v3``, copy-out
  on one stream. On an integrated GPU (Jetson) the pinned buffers are *mapped*, so the GPU reads and
  writes them directly and there is no copy at all.

The CUDA runtime is reached with ``ctypes`` (``libcudart``), so no extra Python package is needed.
Device string (``tensorrt:<options>``): comma-separated ``fp32`` | ``fp16`` | ``int8``, ``dla:N``,
``gpu:N`` — e.g. ``tensorrt:fp16``, ``tensorrt:int8,dla:0``.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import json
import logging
import os
import re
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...errors import (
    DelegateUnavailable,
    EdgeInferError,
    InferenceError,
    ModelFormatError,
    ModelLoadError,
    UnsupportedOperator,
)
from ..engine import Engine
from ..model import ModelFormat, ModelInfo, TensorSpec, guess_layout
from .base import Delegate, import_runtime, runtime_missing_reason

if TYPE_CHECKING:
    import numpy as np

    from ...device.host import Host

log = logging.getLogger("edgeinfer.tensorrt")

CACHE_ENV = "EDGEINFER_CACHE_DIR"
CALIBRATION_ENV = "EDGEINFER_TRT_CALIBRATION"
DEFAULT_WORKSPACE_BYTES = 1 << 30
PRECISIONS = ("fp32", "fp16", "int8")
CUDART_NAMES = ("libcudart.so", "libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0", "libcudart.so.10.2")
TRT_INSTALL_HINT = ("on a Jetson: sudo apt-get install python3-libnvinfer (JetPack) and create the venv with "
                    "--system-site-packages (firmware_scripts/setup-jetson.sh); on x86-64: pip install "
                    "'edgeinfer[tensorrt]'")
# cudaDeviceAttr values (CUDA runtime API, driver_types.h)
_ATTR_INTEGRATED = 18
_ATTR_CC_MAJOR = 75
_ATTR_CC_MINOR = 76
_HOST_ALLOC_MAPPED = 2  # cudaHostAllocMapped
_DEVICE_MAP_HOST = 8  # cudaDeviceMapHost
_H2D, _D2H = 1, 2  # cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost
_CUDA_ERRORS = {35: "cudaErrorInsufficientDriver", 100: "cudaErrorNoDevice", 999: "cudaErrorUnknown",
                3: "cudaErrorInitializationError", 34: "cudaErrorStubLibrary"}


# ------------------------------------------------------------------------------------- options

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


# ---------------------------------------------------------------------------------- CUDA runtime

class CudaError(RuntimeError):
    """A CUDA runtime call returned an error code."""

    def __init__(self, call: str, code: int, name: str) -> None:
        super().__init__(f"{call} failed: error {code} ({name})")
        self.code = code
        self.name = name


def _cudart_candidates() -> list[str]:
    import ctypes.util
    import importlib.util

    names = [n for n in (ctypes.util.find_library("cudart"),) if n] + list(CUDART_NAMES)
    try:  # the nvidia-cuda-runtime-cu12 wheel that pip TensorRT installs
        spec = importlib.util.find_spec("nvidia.cuda_runtime")
    except (ImportError, ValueError):
        spec = None
    if spec is not None and spec.submodule_search_locations:
        for folder in spec.submodule_search_locations:
            names += sorted(str(p) for p in Path(folder, "lib").glob("libcudart.so*"))
    return list(dict.fromkeys(names))


class CudaRuntime:
    """The few CUDA runtime calls the engine needs, through ctypes."""

    def __init__(self, lib: ctypes.CDLL, path: str) -> None:
        self._lib = lib
        self.path = path
        lib.cudaGetErrorName.restype = ctypes.c_char_p
        lib.cudaGetErrorName.argtypes = [ctypes.c_int]
        for name in ("cudaMemcpyAsync",):
            getattr(lib, name).argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                                           ctypes.c_void_p]
        lib.cudaHostAlloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t, ctypes.c_uint]
        lib.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
        lib.cudaHostGetDevicePointer.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p, ctypes.c_uint]
        lib.cudaMemcpy.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        for name in ("cudaFreeHost", "cudaFree", "cudaStreamSynchronize", "cudaStreamDestroy"):
            getattr(lib, name).argtypes = [ctypes.c_void_p]

    @classmethod
    def load(cls) -> CudaRuntime:
        """Open libcudart; DelegateUnavailable says which names were tried."""
        errors = []
        for name in _cudart_candidates():
            try:
                return cls(ctypes.CDLL(name), name)
            except OSError as exc:
                errors.append(str(exc))
        raise DelegateUnavailable(
            "tensorrt", f"the CUDA runtime library (libcudart) was not found ({'; '.join(errors[:2])}) — install the "
            "CUDA runtime (JetPack ships it; on x86-64 the NVIDIA driver + pip install nvidia-cuda-runtime-cu12)",
        )

    def check(self, code: int, call: str) -> None:
        if code != 0:
            name = self._lib.cudaGetErrorName(code)
            raise CudaError(call, code, name.decode() if name else _CUDA_ERRORS.get(code, "?"))

    def device_count(self) -> int:
        count = ctypes.c_int(0)
        self.check(self._lib.cudaGetDeviceCount(ctypes.byref(count)), "cudaGetDeviceCount")
        return count.value

    def set_device(self, index: int) -> None:
        # Mapped pinned memory needs cudaDeviceMapHost before the context exists; once it exists
        # the call fails harmlessly (and on UVA systems mapping is on anyway).
        self._lib.cudaSetDeviceFlags(_DEVICE_MAP_HOST)
        self.check(self._lib.cudaSetDevice(index), f"cudaSetDevice({index})")

    def attribute(self, attribute: int, index: int) -> int:
        value = ctypes.c_int(0)
        self.check(self._lib.cudaDeviceGetAttribute(ctypes.byref(value), attribute, index), "cudaDeviceGetAttribute")
        return value.value

    def device_name(self, index: int) -> str:
        # cudaDeviceProp starts with char name[256] in every CUDA release; the buffer is larger
        # than the whole struct of any release so far.
        props = ctypes.create_string_buffer(16384)
        self.check(self._lib.cudaGetDeviceProperties(props, index), "cudaGetDeviceProperties")
        return props.raw[:256].split(b"\0", 1)[0].decode("utf-8", "replace").strip()

    def host_alloc(self, nbytes: int, *, mapped: bool) -> int:
        pointer = ctypes.c_void_p()
        flags = _HOST_ALLOC_MAPPED if mapped else 0
        self.check(self._lib.cudaHostAlloc(ctypes.byref(pointer), max(nbytes, 1), flags), "cudaHostAlloc")
        return int(pointer.value)

    def device_pointer(self, host_pointer: int) -> int:
        pointer = ctypes.c_void_p()
        self.check(self._lib.cudaHostGetDevicePointer(ctypes.byref(pointer), ctypes.c_void_p(host_pointer), 0),
                   "cudaHostGetDevicePointer")
        return int(pointer.value)

    def malloc(self, nbytes: int) -> int:
        pointer = ctypes.c_void_p()
        self.check(self._lib.cudaMalloc(ctypes.byref(pointer), max(nbytes, 1)), "cudaMalloc")
        return int(pointer.value)

    def memcpy(self, dst: int, src: int, nbytes: int, kind: int) -> None:
        self.check(self._lib.cudaMemcpy(ctypes.c_void_p(dst), ctypes.c_void_p(src), nbytes, kind), "cudaMemcpy")

    def memcpy_async(self, dst: int, src: int, nbytes: int, kind: int, stream: int) -> None:
        self.check(self._lib.cudaMemcpyAsync(dst, src, nbytes, kind, stream), "cudaMemcpyAsync")

    def stream_create(self) -> int:
        stream = ctypes.c_void_p()
        self.check(self._lib.cudaStreamCreate(ctypes.byref(stream)), "cudaStreamCreate")
        return int(stream.value or 0)

    def synchronize(self, stream: int) -> None:
        self.check(self._lib.cudaStreamSynchronize(stream), "cudaStreamSynchronize")

    def free_host(self, pointer: int) -> None:
        self._lib.cudaFreeHost(pointer)

    def free(self, pointer: int) -> None:
        self._lib.cudaFree(pointer)

    def stream_destroy(self, stream: int) -> None:
        self._lib.cudaStreamDestroy(stream)


def cuda_problem() -> str | None:
    """Why no CUDA GPU can be used from this process, or None."""
    try:
        cuda = CudaRuntime.load()
    except DelegateUnavailable as exc:
        return exc.reason
    try:
        count = cuda.device_count()
    except (CudaError, AttributeError) as exc:
        return f"no CUDA GPU visible ({exc}) — check the NVIDIA driver (nvidia-smi) and /dev/nvidia*"
    return None if count > 0 else "no CUDA GPU visible (cudaGetDeviceCount returned 0)"


def host_gpu_problem(host: Host) -> str | None:
    """Evidence of an NVIDIA GPU and TensorRT libraries under a detected root (not the live system)."""
    if not (host.exists("/dev/nvidia0") or host.exists("/dev/nvhost-ctrl-gpu") or host.tegra_release):
        return f"no NVIDIA GPU under {host.root} (no /dev/nvidia0, /dev/nvhost-ctrl-gpu or /etc/nv_tegra_release)"
    if host.find_library("libnvinfer.so*") is None:
        return (f"TensorRT libraries (libnvinfer.so.*) not found under {host.root} — on a Jetson: sudo apt-get "
                "install tensorrt (firmware_scripts/setup-jetson.sh); on x86-64: pip install 'edgeinfer[tensorrt]'")
    return None


# --------------------------------------------------------------------------------- engine cache

def default_cache_dir() -> Path:
    """``$EDGEINFER_CACHE_DIR``, else ``$XDG_CACHE_HOME/edgeinfer``, else ``~/.cache/edgeinfer``."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "edgeinfer"


def cache_key(model_sha256: str, trt_version: str, gpu_name: str, compute_capability: str,
              options: TensorRTOptions) -> dict[str, Any]:
    """Everything a built engine depends on; equal keys mean the cached engine can be reused."""
    build = {k: v for k, v in asdict(options).items() if k not in ("gpu", "calibration")}
    calibration_sha = None
    if options.precision == "int8" and options.calibration:
        calibration_sha = hashlib.sha256(Path(options.calibration).read_bytes()).hexdigest()
    return {"model_sha256": model_sha256, "tensorrt": trt_version, "gpu": gpu_name,
            "compute_capability": compute_capability, "build": build, "calibration_sha256": calibration_sha}


def cache_path(cache_dir: Path, key: dict[str, Any]) -> Path:
    """``<cache>/tensorrt/<model sha[:16]>-<key digest[:16]>.engine`` (a .json sidecar says what it is)."""
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()
    return cache_dir / "tensorrt" / f"{key['model_sha256'][:16]}-{digest[:16]}.engine"


def _write_atomically(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


# --------------------------------------------------------------------------------------- errors

@contextlib.contextmanager
def map_trt_errors(model: ModelInfo, stage: str) -> Iterator[None]:
    """TensorRT's Python bindings raise RuntimeError / TypeError; CUDA calls raise CudaError."""
    try:
        yield
    except EdgeInferError:
        raise
    except CudaError as exc:
        if stage == "invoke":
            raise InferenceError(f"CUDA failed while running {model.path}: {exc}") from exc
        raise DelegateUnavailable("tensorrt", f"CUDA: {exc}") from exc
    except (RuntimeError, TypeError, ValueError, OSError) as exc:
        text = " ".join(str(exc).split()) or type(exc).__name__
        if stage == "invoke":
            raise InferenceError(f"TensorRT failed to run {model.path}: {text}") from exc
        raise ModelLoadError(f"TensorRT cannot load {model.path}: {text}") from exc


# ---------------------------------------------------------------------------------------- build

def _has_explicit_quantization(trt, network) -> bool:
    kinds = {trt.LayerType.QUANTIZE, trt.LayerType.DEQUANTIZE}
    return any(network.get_layer(i).type in kinds for i in range(network.num_layers))


def _make_calibrator(trt, cuda: CudaRuntime, batches: np.ndarray, cache_file: Path):
    """An entropy calibrator over ``batches`` (N x input shape), one batch at a time."""

    class Calibrator(trt.IInt8EntropyCalibrator2):
        def __init__(self) -> None:
            trt.IInt8EntropyCalibrator2.__init__(self)
            self._index = 0
            self._device = cuda.malloc(batches[0].nbytes)

        def get_batch_size(self) -> int:
            return 1

        def get_batch(self, names):  # TensorRT passes the input names; there is one input
            if self._index >= len(batches):
                return None
            batch = batches[self._index : self._index + 1]
            cuda.memcpy(self._device, batch.ctypes.data, batch.nbytes, _H2D)
            self._index += 1
            return [self._device]

        def read_calibration_cache(self):
            return cache_file.read_bytes() if cache_file.is_file() else None

        def write_calibration_cache(self, cache) -> None:
            _write_atomically(cache_file, bytes(cache))

        def free(self) -> None:
            cuda.free(self._device)

    return Calibrator()


def build_engine(trt, cuda: CudaRuntime, model: ModelInfo, options: TensorRTOptions, logger,
                 calibration_cache: Path) -> bytes:
    """Parse ``model`` (ONNX) and build a serialized engine with ``options``."""
    builder = trt.Builder(logger)
    flags = 0
    if int(trt.__version__.split(".")[0]) < 10:  # explicit batch is the only mode from TensorRT 10 on
        flags = 1 << int(trt.NetworkDefinitionCreationFlag.EXPLICIT_BATCH)
    network = builder.create_network(flags)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse(Path(model.path).read_bytes()):
        errors = [str(parser.get_error(i)) for i in range(parser.num_errors)]
        text = "; ".join(" ".join(e.split()) for e in errors) or "unknown parser error"
        if any("unsupported" in e.lower() or "no importer" in e.lower() for e in errors):
            raise UnsupportedOperator(f"TensorRT cannot import {model.path}: {text} — try onnxruntime-gpu")
        raise ModelFormatError(f"TensorRT's ONNX parser rejected {model.path}: {text}")
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, options.workspace_bytes)
    fast_fp16 = getattr(builder, "platform_has_fast_fp16", True)
    if options.precision in ("fp16", "int8") and fast_fp16:
        config.set_flag(trt.BuilderFlag.FP16)
    calibrator = None
    if options.precision == "int8":
        config.set_flag(trt.BuilderFlag.INT8)
        if not _has_explicit_quantization(trt, network):
            if not options.calibration:
                raise ValueError(
                    f"INT8 for {model.path} needs calibration: it has no Q/DQ layers. Give a .npy of preprocessed "
                    f"inputs in ${CALIBRATION_ENV}, or use a Q/DQ-quantised ONNX model, or tensorrt:fp16"
                )
            import numpy as np

            calibrator = _make_calibrator(trt, cuda, np.load(options.calibration), calibration_cache)
            config.int8_calibrator = calibrator
    if options.dla_core is not None:
        if options.dla_core >= builder.num_DLA_cores:
            raise DelegateUnavailable("tensorrt", f"DLA core {options.dla_core} does not exist "
                                      f"(this device has {builder.num_DLA_cores})")
        config.default_device_type = trt.DeviceType.DLA
        config.DLA_core = options.dla_core
        config.set_flag(trt.BuilderFlag.GPU_FALLBACK)
    dynamic = [network.get_input(i) for i in range(network.num_inputs)
               if any(d < 0 for d in network.get_input(i).shape)]
    if dynamic:  # edge models run batch 1: pin every unknown dimension to 1
        profile = builder.create_optimization_profile()
        for tensor in dynamic:
            shape = tuple(d if d > 0 else 1 for d in tensor.shape)
            profile.set_shape(tensor.name, shape, shape, shape)
        config.add_optimization_profile(profile)
    try:
        serialized = builder.build_serialized_network(network, config)
    finally:
        if calibrator is not None:
            calibrator.free()
    if serialized is None:
        raise ModelLoadError(f"TensorRT failed to build an engine for {model.path} (its log above says why)")
    return bytes(serialized)


# --------------------------------------------------------------------------------------- engine

class TensorRTEngine(Engine):
    """A deserialized TensorRT engine with page-locked host buffers bound once."""

    delegate = "tensorrt"

    def __init__(self, model: ModelInfo, *, options: TensorRTOptions, device: str | None,
                 threads: int | None = None, cache_dir: Path | None = None) -> None:
        super().__init__(model, threads=threads, device=device)
        import numpy as np

        trt = import_runtime("tensorrt", self.delegate, "tensorrt")
        cuda = CudaRuntime.load()
        self._cuda = cuda
        self._host_buffers: list[int] = []
        self._device_buffers: list[int] = []
        #: (input|output, device pointer, host pointer, bytes) for discrete GPUs; empty when mapped
        self._copies: list[tuple[str, int, int, int]] = []
        self._stream = 0
        self.options = options
        #: the cached engine file, and whether this load reused it (False: it was built now)
        self.cache_file: Path | None = None
        self.cache_hit = False
        with map_trt_errors(model, "load"):
            cuda.set_device(options.gpu)
            self.gpu_name = cuda.device_name(options.gpu)
            capability = f"{cuda.attribute(_ATTR_CC_MAJOR, options.gpu)}.{cuda.attribute(_ATTR_CC_MINOR, options.gpu)}"
            self._integrated = cuda.attribute(_ATTR_INTEGRATED, options.gpu) == 1
            logger = trt.Logger(trt.Logger.WARNING)
            runtime = trt.Runtime(logger)
            if options.dla_core is not None:
                runtime.DLA_core = options.dla_core
            plan = self._plan_bytes(trt, cuda, logger, capability, cache_dir or default_cache_dir())
            self._engine = runtime.deserialize_cuda_engine(plan)
            if self._engine is None and self.cache_hit:  # a stale or corrupt cache entry: rebuild once
                log.warning("cached TensorRT engine %s did not deserialize; rebuilding", self.cache_file)
                self.cache_file.unlink(missing_ok=True)
                plan = self._plan_bytes(trt, cuda, logger, capability, cache_dir or default_cache_dir())
                self._engine = runtime.deserialize_cuda_engine(plan)
            if self._engine is None:
                raise ModelLoadError(f"TensorRT could not deserialize the engine for {model.path}")
            self._context = self._engine.create_execution_context()
            self._stream = cuda.stream_create()
            self._bind(trt, np)
        self._execute = self._context.execute_async_v3

    def _plan_bytes(self, trt, cuda: CudaRuntime, logger, capability: str, cache_dir: Path) -> bytes:
        if self.model.format is ModelFormat.TENSORRT_PLAN:
            return Path(self.model.path).read_bytes()
        key = cache_key(self.model.sha256, trt.__version__, self.gpu_name, capability, self.options)
        self.cache_file = cache_path(cache_dir, key)
        if self.cache_file.is_file():
            self.cache_hit = True
            return self.cache_file.read_bytes()
        self.cache_hit = False
        data = build_engine(trt, cuda, self.model, self.options, logger,
                            self.cache_file.with_suffix(".calibration"))
        _write_atomically(self.cache_file, data)
        _write_atomically(self.cache_file.with_suffix(".json"),
                          json.dumps({**key, "model": self.model.path}, indent=2).encode())
        return data

    def _bind(self, trt, np) -> None:
        engine, context, cuda = self._engine, self._context, self._cuda
        names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
        inputs = [n for n in names if engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
        outputs = [n for n in names if n not in inputs]
        for name in inputs:  # dynamic dimensions: the optimisation profile's "opt" shape (batch 1)
            shape = tuple(engine.get_tensor_shape(name))
            if any(d < 0 for d in shape):
                context.set_input_shape(name, tuple(engine.get_tensor_profile_shape(name, 0)[1]))
        known = {s.name: s for s in (*self.model.inputs, *self.model.outputs)}
        specs: dict[str, list[TensorSpec]] = {"in": [], "out": []}
        for group, group_names in (("in", inputs), ("out", outputs)):
            for name in group_names:
                shape = tuple(int(d) for d in context.get_tensor_shape(name))
                dtype = np.dtype(trt.nptype(engine.get_tensor_dtype(name)))
                nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
                host = cuda.host_alloc(nbytes, mapped=self._integrated)
                self._host_buffers.append(host)
                if self._integrated:
                    device = cuda.device_pointer(host)  # the GPU reads the pinned page directly
                else:
                    device = cuda.malloc(nbytes)
                    self._device_buffers.append(device)
                context.set_tensor_address(name, device)
                buffer = (ctypes.c_uint8 * max(nbytes, 1)).from_address(host)
                array = np.frombuffer(buffer, dtype=np.uint8, count=nbytes).view(dtype).reshape(shape)
                (self._input_arrays if group == "in" else self._output_arrays).append(array)
                spec = known.get(name)
                quant = spec is not None and spec.dtype == dtype.name
                specs[group].append(TensorSpec(name, shape, dtype.name, guess_layout(shape),
                                               spec.scale if quant else None, spec.zero_point if quant else None))
                if not self._integrated:
                    self._copies.append((group, device, host, nbytes))
        self._inputs, self._outputs = tuple(specs["in"]), tuple(specs["out"])

    def _invoke(self) -> None:
        cuda, stream = self._cuda, self._stream
        with map_trt_errors(self.model, "invoke"):
            copies = self._copies
            for group, device, host, nbytes in copies:
                if group == "in":
                    cuda.memcpy_async(device, host, nbytes, _H2D, stream)
            ok = self._execute(stream)
            for group, device, host, nbytes in copies:
                if group == "out":
                    cuda.memcpy_async(host, device, nbytes, _D2H, stream)
            cuda.synchronize(stream)
        if not ok:
            raise InferenceError(f"TensorRT execute_async_v3 failed for {self.model.path} (see the TensorRT log)")

    def _close(self) -> None:
        self._execute = None
        self._context = None
        self._engine = None
        cuda = self._cuda
        for pointer in self._device_buffers:
            cuda.free(pointer)
        for pointer in self._host_buffers:
            cuda.free_host(pointer)
        self._device_buffers, self._host_buffers, self._copies = [], [], []
        if self._stream:
            cuda.stream_destroy(self._stream)
            self._stream = 0


class TensorRTDelegate(Delegate):
    """NVIDIA TensorRT on a CUDA GPU or DLA (Jetson, x86-64 with an NVIDIA GPU)."""

    name = "tensorrt"
    formats = frozenset({ModelFormat.ONNX, ModelFormat.TENSORRT_PLAN})
    extra = "tensorrt"

    def __init__(self, cache_dir: str | os.PathLike | None = None) -> None:
        self.cache_dir = Path(cache_dir) if cache_dir else None

    def unavailable_reason(self, device: str | None = None, host: Host | None = None) -> str | None:
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
        options = TensorRTOptions.from_device(device)
        self.check(model, device)
        return TensorRTEngine(model, options=options, device=device, threads=threads, cache_dir=self.cache_dir)
