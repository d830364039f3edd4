"""The TensorRT engine: a deserialized (cached or freshly built) engine with page-locked buffers bound once.

Inputs and outputs live in page-locked host buffers allocated once (``cudaHostAlloc``) and bound
once with ``context.set_tensor_address``; ``invoke()`` is copy-in, ``execute_async_v3``, copy-out
on one stream. On an integrated GPU (Jetson) the pinned buffers are *mapped*, so the GPU reads and
writes them directly and there is no copy at all.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ....errors import CudaError, DelegateFailed, DelegateUnavailable, EdgeInferError, InferenceError, ModelLoadError
from ...engine import Engine
from ...model import ModelFormat, ModelInfo, TensorSpec, guess_layout
from ..base import import_runtime
from .build import build_engine
from .cache import cache_key, cache_path, default_cache_dir, store_engine
from .cuda import DEVICE_TO_HOST, HOST_TO_DEVICE, CudaRuntime
from .options import TensorRTOptions

log = logging.getLogger("edgeinfer.tensorrt")


@contextlib.contextmanager
def map_trt_errors(model: ModelInfo, stage: str) -> Iterator[None]:
    """TensorRT's Python bindings raise RuntimeError / TypeError; CUDA calls raise CudaError."""
    try:
        yield
    except CudaError as exc:  # an EdgeInferError too, but one that never leaves this delegate as is
        if stage == "invoke":  # CUDA's errors in a kernel are sticky: the context is lost, the GPU must be re-opened
            raise DelegateFailed("tensorrt", f"CUDA failed while running {model.path}: {exc}") from exc
        raise DelegateUnavailable("tensorrt", f"CUDA: {exc}") from exc
    except EdgeInferError:
        raise
    except (RuntimeError, TypeError, ValueError, OSError) as exc:
        text = " ".join(str(exc).split()) or type(exc).__name__
        if stage == "invoke":
            raise InferenceError(f"TensorRT failed to run {model.path}: {text}") from exc
        raise ModelLoadError(f"TensorRT cannot load {model.path}: {text}") from exc


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
            capability = cuda.compute_capability(options.gpu)
            self._integrated = cuda.is_integrated(options.gpu)
            logger = trt.Logger(trt.Logger.WARNING)
            runtime = trt.Runtime(logger)
            if options.dla_core is not None:
                runtime.DLA_core = options.dla_core
            self._engine = self._deserialize(trt, runtime, logger, capability, cache_dir or default_cache_dir())
            self._context = self._engine.create_execution_context()
            self._stream = cuda.stream_create()
            self._bind(trt, np)
        self._execute = self._context.execute_async_v3

    def _deserialize(self, trt, runtime, logger, capability: str, cache_dir: Path) -> Any:
        engine = runtime.deserialize_cuda_engine(self._plan_bytes(trt, logger, capability, cache_dir))
        if engine is None and self.cache_hit:  # a stale or corrupt cache entry: rebuild once
            log.warning("cached TensorRT engine %s did not deserialize; rebuilding", self.cache_file)
            self.cache_file.unlink(missing_ok=True)
            engine = runtime.deserialize_cuda_engine(self._plan_bytes(trt, logger, capability, cache_dir))
        if engine is None:
            raise ModelLoadError(f"TensorRT could not deserialize the engine for {self.model.path}")
        return engine

    def _plan_bytes(self, trt, logger, capability: str, cache_dir: Path) -> bytes:
        """The serialized engine: the model itself (a plan file), the cached build, or a new build (then cached)."""
        if self.model.format is ModelFormat.TENSORRT_PLAN:
            return Path(self.model.path).read_bytes()
        key = cache_key(self.model.sha256, trt.__version__, self.gpu_name, capability, self.options)
        self.cache_file = cache_path(cache_dir, key)
        if self.cache_file.is_file():
            self.cache_hit = True
            return self.cache_file.read_bytes()
        self.cache_hit = False
        data = build_engine(trt, self._cuda, self.model, self.options, logger,
                            self.cache_file.with_suffix(".calibration"))
        store_engine(self.cache_file, key, self.model.path, data)
        return data

    def _bind(self, trt, np) -> None:
        engine, context = self._engine, self._context
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
                array, spec = self._bind_tensor(trt, np, name, group, known.get(name))
                (self._input_arrays if group == "in" else self._output_arrays).append(array)
                specs[group].append(spec)
        self._inputs, self._outputs = tuple(specs["in"]), tuple(specs["out"])

    def _bind_tensor(self, trt, np, name: str, group: str, known: TensorSpec | None) -> tuple[Any, TensorSpec]:
        """Allocate tensor ``name``'s pinned buffer (and a device one on a discrete GPU), bind it, view it."""
        context, cuda = self._context, self._cuda
        shape = tuple(int(d) for d in context.get_tensor_shape(name))
        dtype = np.dtype(trt.nptype(self._engine.get_tensor_dtype(name)))
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        host = cuda.host_alloc(nbytes, mapped=self._integrated)
        self._host_buffers.append(host)
        if self._integrated:
            device = cuda.device_pointer(host)  # the GPU reads the pinned page directly
        else:
            device = cuda.malloc(nbytes)
            self._device_buffers.append(device)
            self._copies.append((group, device, host, nbytes))
        context.set_tensor_address(name, device)
        buffer = (ctypes.c_uint8 * max(nbytes, 1)).from_address(host)
        array = np.frombuffer(buffer, dtype=np.uint8, count=nbytes).view(dtype).reshape(shape)
        quant = known is not None and known.dtype == dtype.name
        spec = TensorSpec(name, shape, dtype.name, guess_layout(shape),
                          known.scale if quant else None, known.zero_point if quant else None)
        return array, spec

    def _invoke(self) -> None:
        cuda, stream = self._cuda, self._stream
        with map_trt_errors(self.model, "invoke"):
            copies = self._copies
            for group, device, host, nbytes in copies:
                if group == "in":
                    cuda.memcpy_async(device, host, nbytes, HOST_TO_DEVICE, stream)
            ok = self._execute(stream)
            for group, device, host, nbytes in copies:
                if group == "out":
                    cuda.memcpy_async(host, device, nbytes, DEVICE_TO_HOST, stream)
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
