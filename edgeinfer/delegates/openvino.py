"""``openvino``: Intel OpenVINO; reads .tflite, .onnx and IR; device CPU / GPU / NPU / MYRIAD / AUTO."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

from .._native import captured_native_stderr
from ..engine import Engine
from ..errors import DelegateUnavailable, EdgeInferError, InferenceError, ModelLoadError, UnsupportedOperator
from ..model import ModelFormat, ModelInfo, TensorSpec, guess_layout
from .base import Delegate, import_runtime, runtime_missing_reason

DEFAULT_DEVICE = "CPU"
_core = None
_core_lock = threading.Lock()


def shared_core():
    """One ``openvino.Core`` per process: creating it scans plugins, which is slow."""
    global _core
    with _core_lock:
        if _core is None:
            ov = import_runtime("openvino", "openvino", "openvino")
            _core = ov.Core()
        return _core


@contextlib.contextmanager
def map_openvino_errors(model: ModelInfo, stage: str) -> Iterator[None]:
    """OpenVINO raises RuntimeError (and its own GeneralFailure) with multi-line C++ traces."""
    try:
        yield
    except EdgeInferError:
        raise
    except Exception as exc:
        text = str(exc).strip()
        lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("Check")]
        summary = lines[-1] if lines else type(exc).__name__
        if stage == "invoke":
            raise InferenceError(f"OpenVINO failed to run {model.path}: {summary}") from exc
        lowered = text.lower()
        if any(word in lowered for word in ("custom", "not supported", "unsupported", "no conversion rule")):
            raise UnsupportedOperator(f"OpenVINO cannot convert {model.path}: {summary}") from exc
        raise ModelLoadError(f"OpenVINO cannot load {model.path}: {summary}") from exc


_OV_DTYPES = {"f32": "float32", "f16": "float16", "u8": "uint8", "i8": "int8", "i32": "int32",
              "i64": "int64", "f64": "float64", "boolean": "bool", "i16": "int16", "u16": "uint16"}


class OpenVinoEngine(Engine):
    delegate = "openvino"

    def __init__(self, model: ModelInfo, *, threads: int | None, device: str) -> None:
        super().__init__(model, threads=threads, device=device)
        import numpy as np

        ov = import_runtime("openvino", self.delegate, "openvino")
        core = shared_core()
        virtual = device.split(":")[0] in ("AUTO", "MULTI", "HETERO")
        if not virtual and device.split(".")[0] not in core.available_devices:
            raise DelegateUnavailable(
                self.delegate, f"OpenVINO device {device!r} not found (available: {', '.join(core.available_devices)})"
            )
        config = {"PERFORMANCE_HINT": "LATENCY"}
        if threads and device.startswith("CPU"):
            config["INFERENCE_NUM_THREADS"] = threads
        with captured_native_stderr("OpenVINO"), map_openvino_errors(model, "load"):
            ov_model = core.read_model(model.path)
            self._compiled = core.compile_model(ov_model, device, config)
            self._request = self._compiled.create_infer_request()
        by_name = {s.name: s for s in (*model.inputs, *model.outputs)}

        def spec(port, index: int, known_specs) -> TensorSpec:
            shape = tuple(int(d) for d in port.get_shape())
            names = port.get_names()
            name = next(iter(sorted(names)), f"port{index}") if names else f"port{index}"
            known = next((by_name[n] for n in names if n in by_name), None)
            if known is None and index < len(known_specs):
                known = known_specs[index]
            dtype = _OV_DTYPES.get(port.get_element_type().get_type_name(), str(port.get_element_type()))
            quant = known is not None and known.dtype == dtype
            return TensorSpec(name, shape, dtype, guess_layout(shape),
                              known.scale if quant else None, known.zero_point if quant else None)

        self._inputs = tuple(spec(p, i, model.inputs) for i, p in enumerate(self._compiled.inputs))
        self._outputs = tuple(spec(p, i, model.outputs) for i, p in enumerate(self._compiled.outputs))
        # ov.Tensor(array, shared_memory=True) wraps our arrays; set once, then infer() reads them
        # in place and writes outputs in place.
        self._input_arrays = [np.zeros(s.shape, dtype=s.dtype) for s in self._inputs]
        self._output_arrays = [np.zeros(s.shape, dtype=s.dtype) for s in self._outputs]
        with map_openvino_errors(model, "load"):
            for index, array in enumerate(self._input_arrays):
                self._request.set_input_tensor(index, ov.Tensor(array, shared_memory=True))
            for index, array in enumerate(self._output_arrays):
                self._request.set_output_tensor(index, ov.Tensor(array, shared_memory=True))
        self._infer = self._request.infer

    def _invoke(self) -> None:
        try:  # no context manager on the happy path: it would allocate once per frame
            self._infer()
        except Exception:
            with map_openvino_errors(self.model, "invoke"):
                raise

    def _close(self) -> None:
        self._infer = None
        self._request = None
        self._compiled = None


class OpenVinoDelegate(Delegate):
    """OpenVINO Runtime: CPU here; GPU / NPU / MYRIAD / AUTO where the hardware and release allow."""

    name = "openvino"
    formats = frozenset({ModelFormat.TFLITE, ModelFormat.ONNX, ModelFormat.OPENVINO_IR})
    extra = "openvino"

    def unavailable_reason(self, device: str | None = None) -> str | None:
        return runtime_missing_reason("openvino", self.extra)

    def load(self, model: ModelInfo, *, threads: int | None = None, device: str | None = None) -> Engine:
        self.check(model)
        return OpenVinoEngine(model, threads=threads, device=device or DEFAULT_DEVICE)
