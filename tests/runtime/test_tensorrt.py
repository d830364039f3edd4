"""The tensorrt delegate's engine through stand-ins for TensorRT and the CUDA runtime (no GPU here).

The fakes follow the documented shape of TensorRT's Python API and of the few CUDA runtime calls
the engine makes; they check the engine's own logic — build once, cache, reuse, rebuild a corrupt
cache entry, bind buffers once, map vendor errors — not TensorRT.
"""

from __future__ import annotations

import ctypes
import json
import sys
import types
from typing import ClassVar

import numpy as np
import pytest
from support.assets import MODELS

from edgeinfer.errors import CudaError, DelegateUnavailable, InferenceError, UnsupportedOperator
from edgeinfer.runtime.delegates.tensorrt import TensorRTOptions, cache_path
from edgeinfer.runtime.delegates.tensorrt import engine as trt_engine
from edgeinfer.runtime.model import inspect_model

ONNX = MODELS / "mobilenet_v1_0.25_128_quant.onnx"
PLAN = b"fake serialized engine"
IN_SHAPE, OUT_SHAPE = (1, 4), (1, 4)


class FakeCuda:
    """In-memory CUDA: pinned host memory is ctypes buffers, and the GPU is integrated (mapped)."""

    #: CUDA call name -> the error code it returns (set by a test)
    fail: ClassVar[dict[str, int]] = {}

    def __init__(self) -> None:
        self.buffers: dict[int, ctypes.Array] = {}
        self.freed: list[int] = []

    @classmethod
    def load(cls) -> FakeCuda:
        cls.last = cls()
        return cls.last

    def _call(self, call: str) -> None:
        if call in self.fail:
            raise CudaError(call, self.fail[call], "cudaErrorFake")

    def set_device(self, index: int) -> None:
        self._call("cudaSetDevice")

    def device_name(self, index: int) -> str:
        return "Fake Orin"

    def compute_capability(self, index: int) -> str:
        return "8.7"

    def is_integrated(self, index: int) -> bool:
        return True

    def stream_create(self) -> int:
        return 7

    def host_alloc(self, nbytes: int, *, mapped: bool) -> int:
        buffer = ctypes.create_string_buffer(max(nbytes, 1))
        self.buffers[ctypes.addressof(buffer)] = buffer
        return ctypes.addressof(buffer)

    def device_pointer(self, host_pointer: int) -> int:
        return host_pointer

    def synchronize(self, stream: int) -> None:
        self._call("cudaStreamSynchronize")

    def free_host(self, pointer: int) -> None:
        self.freed.append(pointer)

    def stream_destroy(self, stream: int) -> None:
        self.freed.append(stream)


class FakeContext:
    """Runs the 'model': the output is the input plus one."""

    def __init__(self) -> None:
        self.addresses: dict[str, int] = {}

    def get_tensor_shape(self, name: str) -> tuple[int, ...]:
        return IN_SHAPE if name == "input" else OUT_SHAPE

    def set_tensor_address(self, name: str, address: int) -> None:
        self.addresses[name] = address

    def execute_async_v3(self, stream: int) -> bool:
        view = {name: np.ctypeslib.as_array((ctypes.c_float * 4).from_address(a)) for name, a in self.addresses.items()}
        view["output"][:] = view["input"] + 1
        return True


class FakeEngine:
    num_io_tensors = 2

    def get_tensor_name(self, index: int) -> str:
        return ("input", "output")[index]

    def get_tensor_mode(self, name: str) -> str:
        return "INPUT" if name == "input" else "OUTPUT"

    def get_tensor_shape(self, name: str) -> tuple[int, ...]:
        return IN_SHAPE if name == "input" else OUT_SHAPE

    def get_tensor_dtype(self, name: str) -> str:
        return "float32"

    def create_execution_context(self) -> FakeContext:
        return FakeContext()


def fake_tensorrt(calls: dict[str, int], *, parser_errors: tuple[str, ...] = ()) -> types.ModuleType:
    """A stand-in ``tensorrt`` module; ``calls`` counts builds and deserializations."""
    trt = types.ModuleType("tensorrt")
    trt.__version__ = "10.3.0"
    trt.TensorIOMode = types.SimpleNamespace(INPUT="INPUT")
    trt.MemoryPoolType = types.SimpleNamespace(WORKSPACE="workspace")
    trt.BuilderFlag = types.SimpleNamespace(FP16="fp16", INT8="int8", GPU_FALLBACK="gpu_fallback")
    trt.LayerType = types.SimpleNamespace(QUANTIZE="q", DEQUANTIZE="dq")
    trt.nptype = np.dtype

    class Logger:
        WARNING = 2

        def __init__(self, level: int) -> None:
            pass

    class Runtime:
        def __init__(self, logger) -> None:
            pass

        def deserialize_cuda_engine(self, plan: bytes):
            calls["deserialize"] = calls.get("deserialize", 0) + 1
            return FakeEngine() if plan == PLAN else None

    class Network:
        num_layers = num_inputs = 0

    class Parser:
        num_errors = len(parser_errors)

        def __init__(self, network, logger) -> None:
            pass

        def parse(self, data: bytes) -> bool:
            return not parser_errors

        def get_error(self, index: int) -> str:
            return parser_errors[index]

    class Config:
        def __init__(self) -> None:
            self.flags: set[str] = set()

        def set_memory_pool_limit(self, pool, size: int) -> None:
            pass

        def set_flag(self, flag: str) -> None:
            self.flags.add(flag)

    class Builder:
        platform_has_fast_fp16 = True

        def __init__(self, logger) -> None:
            pass

        def create_network(self, flags: int) -> Network:
            return Network()

        def create_builder_config(self) -> Config:
            return Config()

        def build_serialized_network(self, network, config) -> bytes:
            calls["build"] = calls.get("build", 0) + 1
            calls["flags"] = sorted(config.flags)
            return PLAN

    trt.Logger, trt.Runtime, trt.OnnxParser, trt.Builder = Logger, Runtime, Parser, Builder
    return trt


@pytest.fixture
def fakes(monkeypatch):
    calls: dict[str, int] = {}
    monkeypatch.setitem(sys.modules, "tensorrt", fake_tensorrt(calls))
    monkeypatch.setattr(trt_engine, "CudaRuntime", FakeCuda)
    monkeypatch.setattr(FakeCuda, "fail", {})
    return calls


def load(tmp_path, **options) -> trt_engine.TensorRTEngine:
    return trt_engine.TensorRTEngine(inspect_model(ONNX), options=TensorRTOptions(**options), device="fp16",
                                     cache_dir=tmp_path)


def test_engine_is_built_once_cached_and_reused(fakes, tmp_path):
    with load(tmp_path) as engine:
        assert (engine.cache_hit, fakes["build"], fakes["flags"]) == (False, 1, ["fp16"])
        assert engine.cache_file.read_bytes() == PLAN
        sidecar = json.loads(engine.cache_file.with_suffix(".json").read_text())
        assert sidecar["gpu"] == "Fake Orin" and sidecar["compute_capability"] == "8.7"
        assert sidecar["model"] == str(ONNX) and engine.cache_file == cache_path(tmp_path, {
            k: v for k, v in sidecar.items() if k != "model"})
        assert [s.name for s in engine.inputs] == ["input"] and engine.outputs[0].shape == OUT_SHAPE
        assert not list(engine.cache_file.parent.glob(".*"))  # no temporary file left behind
    with load(tmp_path) as again:
        assert again.cache_hit and fakes["build"] == 1


def test_invoke_reads_and_writes_the_bound_buffers_and_close_frees_them(fakes, tmp_path):
    engine = load(tmp_path)
    outputs = engine.run(np.arange(4, dtype=np.float32).reshape(IN_SHAPE))
    assert outputs[0].tolist() == [[1.0, 2.0, 3.0, 4.0]]
    cuda = FakeCuda.last
    engine.close()
    assert sorted(cuda.freed) == sorted([*cuda.buffers, 7])


def test_a_corrupt_cache_entry_is_rebuilt_once(fakes, tmp_path):
    load(tmp_path).close()
    cached = next((tmp_path / "tensorrt").glob("*.engine"))
    cached.write_bytes(b"corrupt")
    with load(tmp_path) as engine:
        assert not engine.cache_hit and fakes["build"] == 2 and fakes["deserialize"] == 3
        assert cached.read_bytes() == PLAN


def test_cuda_errors_are_mapped_by_stage(fakes, tmp_path):
    FakeCuda.fail = {"cudaSetDevice": 100}
    with pytest.raises(DelegateUnavailable, match=r"CUDA: cudaSetDevice failed: error 100"):
        load(tmp_path)
    FakeCuda.fail = {}
    engine = load(tmp_path)
    FakeCuda.fail = {"cudaStreamSynchronize": 999}
    with pytest.raises(InferenceError, match="CUDA failed while running"):
        engine.invoke()
    engine.close()


def test_an_unsupported_onnx_operator_is_unsupported_operator(monkeypatch, tmp_path):
    calls: dict[str, int] = {}
    monkeypatch.setitem(sys.modules, "tensorrt",
                        fake_tensorrt(calls, parser_errors=("No importer registered for op: NonMaxSuppression",)))
    monkeypatch.setattr(trt_engine, "CudaRuntime", FakeCuda)
    with pytest.raises(UnsupportedOperator, match="NonMaxSuppression"):
        load(tmp_path)
    assert "build" not in calls
