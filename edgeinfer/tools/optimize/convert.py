"""Whole-model conversions done by a vendor converter: FP16 (ONNX Runtime's), OpenVINO IR (OpenVINO's)."""

from __future__ import annotations

from pathlib import Path

from ...errors import OptimizeError, OutputError
from ...util.optional import import_optional
from .vendor import first_line, quiet_vendor_logging


def convert_fp16(source: Path, target: Path) -> None:
    """FP16 weights and activations, float32 inputs and outputs (so preprocessing is unchanged)."""
    onnx = import_optional("onnx", "onnx", "FP16 conversion")
    # ONNX Runtime ships the float16 converter of onnxconverter-common (same code, kept in step with
    # ORT's kernels), so FP16 needs no extra package.
    float16 = import_optional("onnxruntime.transformers.float16", "onnx", "FP16 conversion")
    try:
        with quiet_vendor_logging():
            converted = float16.convert_float_to_float16(onnx.load(str(source)), keep_io_types=True)
            onnx.save(converted, str(target))
    except OSError as exc:
        raise OutputError(f"cannot write the FP16 model beside {target}: {exc}") from exc
    except Exception as exc:
        raise OptimizeError(f"could not convert {source} to FP16: {first_line(exc)}") from exc


def export_ir(source: Path, target_xml: Path, compress_to_fp16: bool) -> None:
    """Convert an ONNX model to OpenVINO IR (``target_xml`` + the .bin beside it)."""
    from ...util.native import captured_native_stderr

    ov = import_optional("openvino", "openvino", "OpenVINO IR export")
    try:
        with captured_native_stderr("OpenVINO"):
            converted = ov.convert_model(str(source))
            ov.save_model(converted, str(target_xml), compress_to_fp16=compress_to_fp16)
    except OSError as exc:
        raise OutputError(f"cannot write the IR beside {target_xml}: {exc}") from exc
    except Exception as exc:
        lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
        raise OptimizeError(f"OpenVINO could not convert {source} to IR: {lines[-1] if lines else exc}") from exc
