"""``onnxruntime``: ONNX Runtime on the CPU, inputs and outputs bound once with IOBinding."""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from typing import Any

from ...device.host import host_u8s8_saturates
from ...errors import EdgeInferError, InferenceError, ModelFormatError, ModelLoadError, UnsupportedOperator
from ..engine import Engine
from ..model import ModelFormat, ModelInfo, TensorSpec, guess_layout, require_sized_inputs
from .base import Delegate, import_runtime, runtime_missing_reason

log = logging.getLogger(__name__)

ORT_DTYPES = {"tensor(float)": "float32", "tensor(uint8)": "uint8", "tensor(int8)": "int8",
              "tensor(int32)": "int32", "tensor(int64)": "int64", "tensor(float16)": "float16",
              "tensor(double)": "float64", "tensor(bool)": "bool", "tensor(int16)": "int16",
              "tensor(uint16)": "uint16"}


#: ONNX Runtime's session option (kOrtSessionOptionsAvx2PrecisionMode) that multiplies INT8 layers with its U8U8
#: kernels instead of its U8S8 ones (it converts int8 weights to uint8 at load); it only takes effect on x86
EXACT_INT8_OPTION = "session.x64quantprecision"
#: the session option that lets the intra-op pool's idle workers spin between parallel sections
ALLOW_SPINNING_OPTION = "session.intra_op.allow_spinning"
#: set to 1 to let them spin again (benchmarks compare; a machine that runs nothing else beside the runtime)
SPINNING_ENV = "EDGEINFER_ORT_SPINNING"


def spinning_allowed() -> bool:
    """Whether ONNX Runtime's idle pool workers may spin: not unless ``$EDGEINFER_ORT_SPINNING`` says 1."""
    return os.environ.get(SPINNING_ENV, "").strip() == "1"


@contextlib.contextmanager
def map_ort_errors(model: ModelInfo, stage: str) -> Iterator[None]:
    """Map onnxruntime's exceptions (Fail, InvalidGraph, NotImplemented, ...) to edgeinfer errors."""
    try:
        yield
    except EdgeInferError:
        raise
    except Exception as exc:  # ORT raises its own pybind classes; all derive from Exception
        kind = type(exc).__name__
        first_line = (str(exc).strip().splitlines() or [kind])[0]
        if stage == "invoke":
            raise InferenceError(f"ONNX Runtime failed to run {model.path}: {first_line}") from exc
        if kind == "NotImplemented" or "not implemented" in first_line.lower():
            raise UnsupportedOperator(
                f"ONNX Runtime lacks an operator {model.path} needs: {first_line} — try --delegate openvino",
            ) from exc
        if kind in ("InvalidProtobuf", "InvalidGraph") or "protobuf" in first_line.lower():
            raise ModelFormatError(f"ONNX Runtime cannot parse {model.path}: {first_line}") from exc
        raise ModelLoadError(f"ONNX Runtime cannot load {model.path}: {first_line}") from exc


def _concrete(shape, known: TensorSpec | None = None) -> tuple[int, ...]:
    """The session's dimensions, with inspection's where the session has a symbol (a dynamic image input sized
    from the model's metadata); what neither knows (batch 'N', None) becomes 1."""
    inspected = known.shape if known is not None and len(known.shape) == len(shape) else (0,) * len(shape)
    return tuple(d if isinstance(d, int) and d > 0 else (k if k > 0 else 1) for d, k in zip(shape, inspected))


def _symbolic_beyond_batch(shape) -> bool:
    return any(not (isinstance(d, int) and d > 0) for d in shape[1:])


class OnnxRuntimeEngine(Engine):
    delegate = "onnxruntime"

    def _open(self, ort: Any, model: ModelInfo, options: Any, providers: list) -> Any:
        """The session, with exact INT8 where this CPU needs it. ONNX Runtime's U8U8 rewrite fails on some graphs
        (MoveNet's post-training-quantised ONNX: "Attempt to replace the existing tensor"): such a model is opened
        without it, as on any other CPU, and ``exact_int8`` says so."""
        if self.exact_int8:
            options.add_session_config_entry(EXACT_INT8_OPTION, "1")
            try:
                return ort.InferenceSession(model.path, sess_options=options, providers=providers)
            except Exception as exc:  # ORT's pybind errors; the same model without the option tells a real fault
                log.warning("%s: ONNX Runtime's exact INT8 kernels cannot take this graph (%s); its INT8 layers "
                            "use the fast ones", model.path, (str(exc).strip().splitlines() or ["?"])[0][-160:])
                self.exact_int8 = False
                options.add_session_config_entry(EXACT_INT8_OPTION, "0")
        with map_ort_errors(model, "load"):
            return ort.InferenceSession(model.path, sess_options=options, providers=providers)

    def __init__(self, model: ModelInfo, *, threads: int | None, providers: list | None = None,
                 device: str | None = None) -> None:
        super().__init__(model, threads=threads, device=device)
        import numpy as np

        require_sized_inputs(model)  # before the session: its buffers take the inputs' sizes

        ort = import_runtime("onnxruntime", self.delegate, "onnx")
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.log_severity_level = 3
        if threads:
            options.intra_op_num_threads = threads
            options.inter_op_num_threads = 1
        # Between two parallel sections of an invoke, an idle worker of the pool spins rather than sleeps: on the
        # cores a pipeline's capture, decode and preprocessing threads share with it, that spin takes the time slice
        # one of them needs (ONNX Runtime turns it off for the same reason beside XNNPACK's own pool,
        # microsoft/onnxruntime#13318). Measured in docs/benchmarks.md, "Runtime threads".
        options.add_session_config_entry(ALLOW_SPINNING_OPTION, "1" if spinning_allowed() else "0")
        # INT8 layers computed as their QDQ graph says: where the fast U8S8 kernels saturate (an x86 CPU
        # without VNNI, see u8s8_saturates), ONNX Runtime's U8U8 ones, exact and slower (about float speed on
        # an AVX2 EPYC). Measured there, the U8S8 kernels flip MobileNet v2 INT8's top-1 on 2 of 8 photos and
        # lose 3 of the fall detector's 7 boxes. Not set elsewhere: ONNX Runtime would give up VNNI for the
        # same results.
        self.exact_int8 = host_u8s8_saturates()
        self._session = self._open(ort, model, options, providers or ["CPUExecutionProvider"])
        by_name = {s.name: s for s in (*model.inputs, *model.outputs)}

        def spec(arg, shape: tuple[int, ...] | None = None) -> TensorSpec:
            known = by_name.get(arg.name)
            shape = shape or _concrete(arg.shape, known)
            return TensorSpec(arg.name, shape, ORT_DTYPES.get(arg.type, arg.type), guess_layout(shape),
                              known.scale if known else None, known.zero_point if known else None)

        self._inputs = tuple(spec(a) for a in self._session.get_inputs())
        outputs = self._session.get_outputs()
        shapes = self._output_shapes(outputs) if any(_symbolic_beyond_batch(a.shape) for a in outputs) else {}
        self._outputs = tuple(spec(a, shapes.get(a.name)) for a in outputs)
        # Preallocated host arrays; OrtValues wrap them without copying, bound once.
        self._input_arrays = [np.zeros(s.shape, dtype=s.dtype) for s in self._inputs]
        self._output_arrays = [np.zeros(s.shape, dtype=s.dtype) for s in self._outputs]
        self._binding = self._session.io_binding()
        self._ort_values = []
        for spec_, array in zip(self._inputs, self._input_arrays):
            value = ort.OrtValue.ortvalue_from_numpy(array)
            self._binding.bind_ortvalue_input(spec_.name, value)
            self._ort_values.append(value)
        for spec_, array in zip(self._outputs, self._output_arrays):
            value = ort.OrtValue.ortvalue_from_numpy(array)
            self._binding.bind_ortvalue_output(spec_.name, value)
            self._ort_values.append(value)
        self._run = self._session.run_with_iobinding

    def _output_shapes(self, outputs) -> dict[str, tuple[int, ...]]:
        """Outputs whose size follows a dynamic input's (anchors of a YOLO exported with dynamic=True): their
        shapes at the inputs' sizes, from one run on zeros — the session's metadata keeps the symbols."""
        import numpy as np

        feed = {s.name: np.zeros(s.shape, dtype=s.dtype) for s in self._inputs}
        with map_ort_errors(self.model, "load"):
            values = self._session.run([a.name for a in outputs], feed)
        return {a.name: tuple(int(d) for d in value.shape) for a, value in zip(outputs, values)}

    def _invoke(self) -> None:
        try:  # no context manager on the happy path: it would allocate once per frame
            self._run(self._binding)
        except Exception:
            with map_ort_errors(self.model, "invoke"):
                raise

    def _close(self) -> None:
        self._binding = None
        self._ort_values = []
        self._run = None
        self._session = None


class OnnxRuntimeDelegate(Delegate):
    """ONNX Runtime's CPU execution provider."""

    name = "onnxruntime"
    formats = frozenset({ModelFormat.ONNX})
    extra = "onnx"
    packages = ("onnxruntime",)

    def unavailable_reason(self, device: str | None = None, host=None) -> str | None:
        return runtime_missing_reason("onnxruntime", self.extra)

    def load(self, model: ModelInfo, *, threads: int | None = None, device: str | None = None) -> Engine:
        self.check(model)
        return OnnxRuntimeEngine(model, threads=threads)
