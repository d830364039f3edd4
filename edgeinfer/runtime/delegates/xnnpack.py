"""``xnnpack``: LiteRT's CPU interpreter with the XNNPACK delegate (``ai_edge_litert``, else ``tflite_runtime``)."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

from ...errors import (
    DelegateFailed,
    DelegateUnavailable,
    EdgeInferError,
    InferenceError,
    ModelFormatError,
    ModelLoadError,
    UnsupportedOperator,
)
from ...util.native import captured_native_stderr
from ..engine import Engine
from ..model import EDGETPU_CUSTOM_OP, ModelFormat, ModelInfo, TensorSpec, guess_layout
from .base import Delegate, runtime_missing_reason

LITERT_MODULES = ("ai_edge_litert.interpreter", "tflite_runtime.interpreter")
_CUSTOM_OP = re.compile(r"unresolved custom op: ([\w\-.]*[\w\-])")


def import_litert() -> ModuleType:
    """The LiteRT interpreter module: ai_edge_litert first, tflite_runtime as the fallback."""
    import importlib

    errors = []
    for name in LITERT_MODULES:
        try:
            return importlib.import_module(name)
        except ImportError as exc:  # tflite_runtime built for numpy 1 raises ImportError on numpy 2
            errors.append(f"{name.split('.')[0]}: {exc}")
    raise DelegateUnavailable(
        "xnnpack",
        "no LiteRT runtime is installed (" + "; ".join(errors) + ") — pip install 'edgeinfer[tflite]' "
        "(or 'edgeinfer[coral]' for tflite-runtime with numpy<2)",
    )


def litert_missing_reason() -> str | None:
    reasons = [runtime_missing_reason(m.split(".")[0], "tflite") for m in LITERT_MODULES]
    return None if any(r is None for r in reasons) else reasons[0]


def edgetpu_advice(model: ModelInfo) -> str:
    twin = Path(model.path).name.replace("_edgetpu", "")
    return (
        f"{Path(model.path).name} was compiled for the Coral Edge TPU ({EDGETPU_CUSTOM_OP}) and "
        f"runs only with the 'coral' delegate on a device with a TPU — on the CPU use its twin {twin}"
    )


@contextlib.contextmanager
def map_litert_errors(model: ModelInfo, stage: str, *, delegate: str = "xnnpack",
                      device_errors: re.Pattern[str] | None = None) -> Iterator[None]:
    """Turn LiteRT's RuntimeError / ValueError into the most specific edgeinfer error.

    ``device_errors`` matches the text an external delegate's library gives when its device is gone
    (libedgetpu's USB errors): such an invoke failure is a :class:`DelegateFailed`.
    """
    try:
        yield
    except EdgeInferError:
        raise
    except (RuntimeError, ValueError, OSError) as exc:
        text = str(exc).strip()
        custom = _CUSTOM_OP.findall(text)
        if custom:
            ops = tuple(dict.fromkeys(custom))
            if EDGETPU_CUSTOM_OP in ops:
                raise UnsupportedOperator(edgetpu_advice(model), ops) from exc
            raise UnsupportedOperator(
                f"{model.path} needs custom operator(s) {', '.join(ops)} that LiteRT does not provide — "
                "use a build of the model without them, or register the op in a custom runtime",
                ops,
            ) from exc
        first_line = text.splitlines()[0] if text else type(exc).__name__
        if stage == "invoke" and device_errors is not None and device_errors.search(text):
            raise DelegateFailed(delegate, f"{first_line} (the device stopped answering)") from exc
        if stage == "invoke":
            raise InferenceError(f"LiteRT failed to run {model.path}: {first_line}") from exc
        if "identifier" in text or "flatbuffer" in text.lower() or "Could not open" in text:
            raise ModelFormatError(f"LiteRT cannot read {model.path}: {first_line}") from exc
        raise ModelLoadError(f"LiteRT cannot load {model.path}: {first_line}") from exc


def spec_from_details(detail: dict) -> TensorSpec:
    scale, zero_point = detail.get("quantization", (0.0, 0))
    shape = tuple(int(d) for d in detail["shape"])
    return TensorSpec(
        name=detail["name"], shape=shape, dtype=detail["dtype"].__name__, layout=guess_layout(shape),
        scale=float(scale) if scale else None, zero_point=int(zero_point) if scale else None,
    )


class LiteRTEngine(Engine):
    """An engine over a LiteRT interpreter; views are the interpreter's own tensor buffers."""

    #: an external delegate's "device gone" errors (set by the Coral engine), see map_litert_errors
    device_errors: re.Pattern[str] | None = None

    def __init__(self, model: ModelInfo, interpreter, *, delegate: str, threads: int | None,
                 device: str | None = None) -> None:
        super().__init__(model, threads=threads, device=device)
        self.delegate = delegate
        self._interpreter = interpreter
        with captured_native_stderr("LiteRT"), map_litert_errors(model, "load"):
            interpreter.allocate_tensors()
        in_details = interpreter.get_input_details()
        out_details = interpreter.get_output_details()
        self._inputs = tuple(map(spec_from_details, in_details))
        self._outputs = tuple(map(spec_from_details, out_details))
        # interpreter.tensor(i)() is a numpy view of the tensor's arena memory. The arena does not
        # move after allocate_tensors(), so the views stay valid for the engine's life. The public
        # invoke() refuses to run while such views exist (a guard against resize_tensor_input),
        # so we call the wrapper's Invoke() directly; we never resize after allocation.
        self._input_arrays = [interpreter.tensor(d["index"])() for d in in_details]
        self._output_arrays = [interpreter.tensor(d["index"])() for d in out_details]
        self._raw_invoke = interpreter._interpreter.Invoke

    def _invoke(self) -> None:
        # try/except rather than `with map_litert_errors()` on the happy path: a generator-based
        # context manager allocates ~1 KB per call, and invoke runs once per frame.
        try:
            self._raw_invoke()
        except Exception:
            with map_litert_errors(self.model, "invoke", delegate=self.delegate, device_errors=self.device_errors):
                raise

    def _close(self) -> None:
        self._raw_invoke = None
        self._interpreter = None


def make_interpreter(model: ModelInfo, *, threads: int | None, delegates: list | None = None):
    """A LiteRT Interpreter for ``model`` (not yet allocated), errors mapped."""
    litert = import_litert()
    with captured_native_stderr("LiteRT"), map_litert_errors(model, "load"):
        return litert.Interpreter(
            model_path=model.path, num_threads=threads, experimental_delegates=delegates
        )


class XnnpackDelegate(Delegate):
    """LiteRT on the CPU; XNNPACK accelerates float and quantised kernels."""

    name = "xnnpack"
    formats = frozenset({ModelFormat.TFLITE, ModelFormat.EDGETPU_TFLITE})
    extra = "tflite"
    packages = ("ai-edge-litert", "tflite-runtime")

    def unavailable_reason(self, device: str | None = None, host=None) -> str | None:
        return litert_missing_reason()

    def unsupported_reason(self, model: ModelInfo) -> str | None:
        if model.is_edgetpu:
            return edgetpu_advice(model)
        return super().unsupported_reason(model)

    def load(self, model: ModelInfo, *, threads: int | None = None, device: str | None = None) -> Engine:
        if model.is_edgetpu:
            raise UnsupportedOperator(edgetpu_advice(model), (EDGETPU_CUSTOM_OP,))
        self.check(model)
        interpreter = make_interpreter(model, threads=threads)
        return LiteRTEngine(model, interpreter, delegate=self.name, threads=threads)
