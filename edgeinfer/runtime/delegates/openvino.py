"""``openvino``: Intel OpenVINO; reads .tflite, .onnx and IR; device CPU / GPU / NPU / MYRIAD / AUTO.

``CPU`` runs here (tests). ``GPU``, ``NPU`` and ``MYRIAD`` are written against OpenVINO's documented
device names and not yet run on that hardware (docs/hardware.md). The MYRIAD plugin (Neural
Compute Stick 2) exists only up to OpenVINO 2022.3 LTS; on a newer release the delegate says so
instead of "device not found".
"""

from __future__ import annotations

import contextlib
import re
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from ...errors import (
    DelegateFailed,
    DelegateUnavailable,
    EdgeInferError,
    InferenceError,
    ModelLoadError,
    UnsupportedOperator,
)
from ...util.native import captured_native_stderr
from ..engine import Engine
from ..model import ModelFormat, ModelInfo, TensorSpec, guess_layout, require_sized_inputs
from .base import Delegate, import_runtime, runtime_missing_reason

if TYPE_CHECKING:
    from ...device.host import Host

DEFAULT_DEVICE = "CPU"
#: physical devices OpenVINO knows, and the virtual ones that pick among them
PHYSICAL_DEVICES = ("CPU", "GPU", "NPU", "MYRIAD")
VIRTUAL_DEVICES = ("AUTO", "MULTI", "HETERO", "BATCH")
#: the last OpenVINO release with the MYRIAD plugin
MYRIAD_LAST_RELEASE = (2022, 3)
#: Intel Neural Compute Stick 2 (Movidius Myriad X) before and after its firmware boots
NCS2_USB_IDS = ("03e7:2485", "03e7:f63b")
#: what a device needs from the system, and how to get it (firmware_scripts/setup-intel.sh)
DEVICE_HINTS = {
    "GPU": ("/dev/dri/renderD*", "no Intel GPU render node (/dev/dri/renderD*) — install the Intel compute runtime "
                                 "(intel-opencl-icd; firmware_scripts/setup-intel.sh) and add the user to 'render'"),
    "NPU": ("/dev/accel/accel*", "no NPU device node (/dev/accel/accel*) — install the Intel NPU driver "
                                 "(linux-npu-driver, kernel >= 6.6 with intel_vpu; firmware_scripts/setup-intel.sh)"),
}
_core = None
_core_lock = threading.Lock()


def openvino_api():
    """The module holding Core and Tensor: ``openvino`` (2023.1+) or ``openvino.runtime`` (2022.x,
    the last releases with the MYRIAD plugin that NCS2 sticks need)."""
    ov = import_runtime("openvino", "openvino", "openvino")
    if hasattr(ov, "Core"):
        return ov
    return import_runtime("openvino.runtime", "openvino", "openvino")


def shared_core():
    """One ``openvino.Core`` per process: creating it scans plugins, which is slow."""
    global _core
    with _core_lock:
        if _core is None:
            _core = openvino_api().Core()
        return _core


#: OpenVINO's plugins' words for a device that is gone: the GPU plugin's OpenCL and Level Zero errors,
#: the NPU's driver codes, the MYRIAD plugin's XLink / NC_ERROR
OPENVINO_DEVICE_ERRORS = re.compile(
    r"device[ _]?(?:is )?lost|DEVICE_LOST|CL_OUT_OF_RESOURCES|CL_DEVICE_NOT_AVAILABLE|ZE_RESULT_ERROR_(?:DEVICE|UNINIT)"
    r"|NC_ERROR|XLink|NPU.*(?:lost|reset|timed? ?out)", re.IGNORECASE)


@contextlib.contextmanager
def map_openvino_errors(model: ModelInfo, stage: str, device: str | None = None) -> Iterator[None]:
    """OpenVINO raises RuntimeError (and its own GeneralFailure) with multi-line C++ traces."""
    try:
        yield
    except EdgeInferError:
        raise
    except Exception as exc:
        text = str(exc).strip()
        lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("Check")]
        summary = lines[-1] if lines else type(exc).__name__
        if stage == "invoke" and OPENVINO_DEVICE_ERRORS.search(text):
            raise DelegateFailed(f"openvino:{device}" if device else "openvino", summary) from exc
        if stage == "invoke":
            raise InferenceError(f"OpenVINO failed to run {model.path}: {summary}") from exc
        lowered = text.lower()
        if any(word in lowered for word in ("custom", "not supported", "unsupported", "no conversion rule")):
            raise UnsupportedOperator(f"OpenVINO cannot convert {model.path}: {summary}") from exc
        raise ModelLoadError(f"OpenVINO cannot load {model.path}: {summary}") from exc


def _known_spec(port: Any, index: int, specs: tuple[TensorSpec, ...]) -> TensorSpec | None:
    """Inspection's spec of an OpenVINO port: by one of its names, else by position."""
    by_name = {s.name: s for s in specs}
    known = next((by_name[n] for n in port.get_names() if n in by_name), None)
    return known if known is not None or index >= len(specs) else specs[index]


def _static_shapes(ov: Any, ov_model: Any, model: ModelInfo, batch: int | None) -> None:
    """Reshape ``ov_model``'s inputs to static shapes: a dynamic dimension takes inspection's size (a dynamic
    image input sized from the model's metadata), else 1; the first input's batch is ``batch`` when given."""
    shapes = {}
    for index, port in enumerate(ov_model.inputs):
        partial = port.get_partial_shape()
        if partial.rank.is_dynamic:
            continue
        known = _known_spec(port, index, model.inputs)
        inspected = known.shape if known is not None and len(known.shape) == len(partial) else (0,) * len(partial)
        dims = [d.get_length() if d.is_static else (k if k > 0 else 1) for d, k in zip(partial, inspected)]
        if index == 0 and batch is not None and batch > 1 and dims:
            dims[0] = batch
        if partial.is_dynamic or dims != [d.get_length() for d in partial]:
            shapes[port] = ov.PartialShape(dims)
    if not shapes:
        return
    try:
        ov_model.reshape(shapes)
    except Exception as exc:
        summary = [ln.strip() for ln in str(exc).splitlines() if ln.strip()][-1:] or [type(exc).__name__]
        if batch is not None and batch > 1:
            raise ModelLoadError(
                f"OpenVINO cannot give {model.path} a batch of {batch}: {summary[0]} — its graph fixes the batch "
                "at 1 (a Reshape to a constant shape); export the model with a dynamic batch dimension") from exc
        wanted = ", ".join(f"{port.get_any_name()}: {shape}" for port, shape in shapes.items())
        raise ModelLoadError(f"OpenVINO cannot give {model.path} static input shapes ({wanted}): {summary[0]}") from exc


_OV_DTYPES = {"f32": "float32", "f16": "float16", "u8": "uint8", "i8": "int8", "i32": "int32",
              "i64": "int64", "f64": "float64", "boolean": "bool", "i16": "int16", "u16": "uint16"}


class OpenVinoEngine(Engine):
    delegate = "openvino"

    def __init__(self, model: ModelInfo, *, threads: int | None, device: str, batch: int | None = None) -> None:
        super().__init__(model, threads=threads, device=device)
        import numpy as np

        require_sized_inputs(model)  # before the runtime: its buffers take the inputs' sizes
        ov = openvino_api()
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
            # a dynamic input made static; batch > 1: several frames per invoke (a multi-stream pipeline)
            _static_shapes(ov, ov_model, model, batch)
            self._compiled = core.compile_model(ov_model, device, config)
            self._request = self._compiled.create_infer_request()

        def spec(port, index: int, known_specs) -> TensorSpec:
            shape = tuple(int(d) for d in port.get_shape())
            names = port.get_names()
            name = next(iter(sorted(names)), f"port{index}") if names else f"port{index}"
            known = _known_spec(port, index, known_specs)
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
        # start_async() + wait() run the same inference as infer() (the GIL is released while it
        # runs) without building infer()'s results dict: ~0.4 KB per call instead of ~4.5 KB
        self._start, self._wait = self._request.start_async, self._request.wait

    def _invoke(self) -> None:
        try:  # no context manager on the happy path: it would allocate once per frame
            self._start()
            self._wait()
        except Exception:
            with map_openvino_errors(self.model, "invoke", self.device):
                raise

    def _close(self) -> None:
        self._start = self._wait = None
        self._request = None
        self._compiled = None


def openvino_version() -> tuple[int, int] | None:
    """(year, release) of the installed OpenVINO, from its metadata (no import), or None."""
    from ...util.dist import version

    text = version("openvino")
    if text is None:
        return None
    found = re.match(r"(\d+)\.(\d+)", text)
    return (int(found.group(1)), int(found.group(2))) if found else None


def device_family(device: str) -> str:
    """``"GPU.1"`` -> ``"GPU"``, ``"AUTO:GPU,CPU"`` -> ``"AUTO"``."""
    return re.split(r"[.:]", device.strip(), maxsplit=1)[0].upper()


def release_problem(device: str, version: tuple[int, int] | None) -> str | None:
    """Why this OpenVINO release cannot drive ``device`` at all, or None."""
    if device_family(device) == "MYRIAD" and version is not None and version > MYRIAD_LAST_RELEASE:
        return (f"OpenVINO {version[0]}.{version[1]} has no MYRIAD plugin (removed in 2023.0; 2022.3 LTS is the last "
                "release that drives the Neural Compute Stick 2) — pip install 'openvino==2022.3.*' (Python <= 3.10, "
                "numpy<2) in a separate environment (firmware_scripts/setup-intel.sh), or use openvino:CPU")
    return None


def host_device_problem(device: str, host: Host) -> str | None:
    """Why ``host`` (a detected root) shows no hardware for ``device``, or None."""
    family = device_family(device)
    if family == "MYRIAD" and not host.usb_devices(NCS2_USB_IDS):
        return f"no Neural Compute Stick 2 (USB {' / '.join(NCS2_USB_IDS)}) found"
    if family in DEVICE_HINTS and not host.exists(DEVICE_HINTS[family][0]):
        return DEVICE_HINTS[family][1]
    return None


class OpenVinoDelegate(Delegate):
    """OpenVINO Runtime: CPU here; GPU / NPU / MYRIAD / AUTO where the hardware and release allow."""

    name = "openvino"
    formats = frozenset({ModelFormat.TFLITE, ModelFormat.ONNX, ModelFormat.OPENVINO_IR})
    extra = "openvino"
    packages = ("openvino",)

    def unavailable_reason(self, device: str | None = None, host: Host | None = None) -> str | None:
        missing = runtime_missing_reason("openvino", self.extra)
        if missing:
            return missing
        device = device or DEFAULT_DEVICE
        family = device_family(device)
        if family not in PHYSICAL_DEVICES + VIRTUAL_DEVICES:
            return (f"unknown OpenVINO device {device!r} (known: {', '.join(PHYSICAL_DEVICES)}, or "
                    f"{', '.join(VIRTUAL_DEVICES)}:<devices>)")
        problem = release_problem(device, openvino_version())
        if problem or family == "CPU" or family in VIRTUAL_DEVICES:
            return problem
        if host is not None and not host.live:
            return host_device_problem(device, host)
        try:
            available = shared_core().available_devices
        except Exception as exc:  # never raise from an availability check
            return f"OpenVINO failed to start ({exc})"
        if any(d.split(".")[0] == family for d in available):
            return None
        hint = DEVICE_HINTS.get(family, ("", "plug in the Neural Compute Stick 2 and install its udev rules "
                                             "(97-myriad-usbboot.rules)"))[1]
        return f"OpenVINO device {family!r} not found (available: {', '.join(available)}); {hint}"

    def load(self, model: ModelInfo, *, threads: int | None = None, device: str | None = None,
             batch: int | None = None) -> Engine:
        """``batch`` > 1 reshapes the model's first input to that batch (frames of several streams per invoke)."""
        self.check(model)
        device = device or DEFAULT_DEVICE
        problem = release_problem(device, openvino_version())
        if problem:
            raise DelegateUnavailable(self.name, problem)
        return OpenVinoEngine(model, threads=threads, device=device, batch=batch)
