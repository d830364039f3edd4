"""Building a TensorRT engine from an ONNX model: parse, set precision (FP16, INT8 with Q/DQ layers or
calibration data), optionally place it on a DLA core, pin dynamic dimensions to batch 1, serialize."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from ....errors import DelegateUnavailable, ModelFormatError, ModelLoadError, UnsupportedOperator
from ....util.fs import atomic_write_bytes
from .cuda import HOST_TO_DEVICE, CudaRuntime
from .options import CALIBRATION_ENV, TensorRTOptions

if TYPE_CHECKING:
    import numpy as np

    from ...model import ModelInfo


def build_engine(trt, cuda: CudaRuntime, model: ModelInfo, options: TensorRTOptions, logger,
                 calibration_cache: Path) -> bytes:
    """Parse ``model`` (ONNX) and build a serialized engine with ``options``."""
    builder = trt.Builder(logger)
    network = _parse_onnx(trt, builder, model, logger)
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, options.workspace_bytes)
    calibrator = _set_precision(trt, cuda, builder, network, config, model, options, calibration_cache)
    if options.dla_core is not None:
        _place_on_dla(trt, builder, config, options.dla_core)
    _pin_dynamic_dimensions(builder, network, config)
    try:
        serialized = builder.build_serialized_network(network, config)
    finally:
        if calibrator is not None:
            calibrator.free()
    if serialized is None:
        raise ModelLoadError(f"TensorRT failed to build an engine for {model.path} (its log above says why)")
    return bytes(serialized)


def _parse_onnx(trt, builder, model: ModelInfo, logger) -> Any:
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
    return network


def _set_precision(trt, cuda: CudaRuntime, builder, network, config, model: ModelInfo, options: TensorRTOptions,
                   calibration_cache: Path) -> Any:
    """Set the FP16 / INT8 flags; for INT8 of a float model, attach a calibrator (returned, to be freed)."""
    fast_fp16 = getattr(builder, "platform_has_fast_fp16", True)
    if options.precision in ("fp16", "int8") and fast_fp16:
        config.set_flag(trt.BuilderFlag.FP16)
    if options.precision != "int8":
        return None
    config.set_flag(trt.BuilderFlag.INT8)
    if _has_explicit_quantization(trt, network):
        return None
    if not options.calibration:
        raise ValueError(
            f"INT8 for {model.path} needs calibration: it has no Q/DQ layers. Give a .npy of preprocessed "
            f"inputs in ${CALIBRATION_ENV}, or use a Q/DQ-quantised ONNX model, or tensorrt:fp16"
        )
    import numpy as np

    calibrator = _make_calibrator(trt, cuda, np.load(options.calibration), calibration_cache)
    config.int8_calibrator = calibrator
    return calibrator


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
            cuda.memcpy(self._device, batch.ctypes.data, batch.nbytes, HOST_TO_DEVICE)
            self._index += 1
            return [self._device]

        def read_calibration_cache(self):
            return cache_file.read_bytes() if cache_file.is_file() else None

        def write_calibration_cache(self, cache) -> None:
            atomic_write_bytes(cache_file, bytes(cache))

        def free(self) -> None:
            cuda.free(self._device)

    return Calibrator()


def _place_on_dla(trt, builder, config, dla_core: int) -> None:
    if dla_core >= builder.num_DLA_cores:
        raise DelegateUnavailable("tensorrt", f"DLA core {dla_core} does not exist "
                                  f"(this device has {builder.num_DLA_cores})")
    config.default_device_type = trt.DeviceType.DLA
    config.DLA_core = dla_core
    config.set_flag(trt.BuilderFlag.GPU_FALLBACK)


def _pin_dynamic_dimensions(builder, network, config) -> None:
    dynamic = [network.get_input(i) for i in range(network.num_inputs)
               if any(d < 0 for d in network.get_input(i).shape)]
    if dynamic:  # edge models run batch 1: pin every unknown dimension to 1
        profile = builder.create_optimization_profile()
        for tensor in dynamic:
            shape = tuple(d if d > 0 else 1 for d in tensor.shape)
            profile.set_shape(tensor.name, shape, shape, shape)
        config.add_optimization_profile(profile)
