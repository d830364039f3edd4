"""``optimize_model``: the whole run, from the cheap checks to the files renamed into place."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..._fs import atomic_path
from ...errors import AccuracyRejected, ModelError, ModelFormatError, OptimizeError
from ...runtime.model import ModelFormat, ModelInfo, inspect_model
from .convert import convert_fp16, export_ir
from .images import ImageFeeder, image_sets
from .int8 import quantize_int8
from .options import OptimizeOptions, Progress
from .output import check_outputs, finish_model
from .report import Artifact, OptimizeReport
from .validate import compare_latency, compare_to_reference, reference_outputs, refusal_reason

if TYPE_CHECKING:
    import numpy as np

    from ...runtime.engine import Engine

FLOAT_INPUT_TYPES = ("float32", "float16", "float64")


@dataclass(frozen=True)
class _Run:
    """What every step of one optimisation shares."""

    info: ModelInfo
    options: OptimizeOptions
    threads: int
    calibration: list[Path]
    validation: list[Path]
    notes: list[str]
    say: Progress


def optimize_model(model: str | os.PathLike, output: str | os.PathLike, options: OptimizeOptions, *,
                   progress: Progress | None = None) -> OptimizeReport:
    """Optimise ``model`` into ``output``, validate it against the original, write it only if it holds up.

    Raises AccuracyRejected (nothing written, ``.report`` attached) when the top-1 agreement is
    below ``options.min_agreement`` and ``options.force`` is false.
    """
    started = time.perf_counter()
    info = _float_onnx_model(model)
    output_path = Path(output)
    finals = check_outputs(output_path, Path(info.path), options.export_ir)
    calibration, validation, notes = image_sets(options)
    run = _Run(info, options, options.threads or os.cpu_count() or 1, calibration, validation, notes,
               progress or (lambda _message: None))
    # Each file is written under a temporary name beside its final one; the ExitStack renames them
    # into place (IR .bin, IR .xml, then the ONNX model) only if the block ends without an exception,
    # so a failure or a refusal never leaves a half-written model behind.
    with contextlib.ExitStack() as staged:
        temp_onnx = staged.enter_context(atomic_path(output_path))
        onnx_artifact, preprocessing, reference = _optimize_onnx(run, temp_onnx, output_path)
        artifacts = [onnx_artifact]
        if options.export_ir:
            temp_xml = staged.enter_context(atomic_path(finals[1]))
            # OpenVINO writes the weights beside the .xml under its stem: the .bin's temporary name
            staged.enter_context(atomic_path(finals[2], temp=temp_xml.with_suffix(".bin")))
            artifacts.append(_ir_artifact(run, temp_onnx, temp_xml, finals[1], reference))
        refused = refusal_reason(artifacts, options)
        report = OptimizeReport(
            model=info.path, output=str(output_path), mode=options.mode, original_bytes=info.size_bytes,
            artifacts=tuple(artifacts), calibration_images=len(calibration), validation_images=len(validation),
            preprocessing=preprocessing, min_agreement=options.min_agreement,
            ambiguous_margin=options.ambiguous_margin, written=False, refused=refused,
            forced=bool(refused and options.force), notes=tuple(notes),
            seconds=round(time.perf_counter() - started, 2),
        )
        if refused and not options.force:
            raise AccuracyRejected(f"{refused} — nothing was written; pass --force to write it anyway", report)
        run.say(f"writing {output_path}")
    return replace(report, written=True, seconds=round(time.perf_counter() - started, 2))


def _float_onnx_model(model: str | os.PathLike) -> ModelInfo:
    """Inspect ``model``; ModelFormatError unless it is ONNX, OptimizeError if it is already quantised."""
    info = inspect_model(model)
    if info.format is not ModelFormat.ONNX:
        raise ModelFormatError(
            f"optimize reads ONNX models; {info.path} is a {info.format.value} model — convert it to ONNX "
            "first (tf2onnx for .tflite), or optimise the ONNX original"
        )
    if any(spec.dtype in ("uint8", "int8") for spec in info.inputs) or any(
        spec.quantized for spec in info.outputs
    ):
        raise OptimizeError(f"{info.path} is already quantised — optimise its float original")
    return info


def _optimize_onnx(run: _Run, temp_onnx: Path, output_path: Path
                   ) -> tuple[Artifact, dict[str, Any], list[np.ndarray]]:
    """Convert the model into ``temp_onnx`` and check it against the original on the chosen delegate.

    Returns the ONNX artifact, the preprocessing used and the original's outputs (for the IR's check).
    """
    from ...runtime.selection import load

    info, options, say = run.info, run.options, run.say
    say(f"loading {Path(info.path).name} on {options.delegate} ({run.threads} threads)")
    with load(info, options.delegate, threads=run.threads) as original:
        feeder = ImageFeeder(original, options)
        preprocessing = feeder.describe()
        if original.inputs[0].dtype not in FLOAT_INPUT_TYPES:
            raise OptimizeError(f"{info.path} takes {original.inputs[0].dtype} input; optimize needs a float model")
        if options.mode == "int8":
            say(f"quantising to INT8 ({'per-channel' if options.per_channel else 'per-tensor'} weights, "
                f"{options.activations} activations), calibrating on {len(run.calibration)} images")
            quantize_int8(Path(info.path), temp_onnx, run.calibration, feeder, original, options, say, run.notes)
        else:
            say("converting to FP16 (float32 inputs and outputs kept)")
            convert_fp16(Path(info.path), temp_onnx)
        finish_model(temp_onnx, info, options, preprocessing, len(run.calibration), run.notes)
        optimized_bytes = temp_onnx.stat().st_size
        say(f"validating on {len(run.validation)} images against the original")
        reference = reference_outputs(original, run.validation, feeder)
        with _load_optimized(temp_onnx, options.delegate, run.threads) as optimized:
            accuracy = compare_to_reference(reference, optimized, run.validation, feeder,
                                            ambiguous_margin=options.ambiguous_margin, say=say)
            latency = None
            if options.bench_seconds > 0:
                say(f"timing original vs optimised, interleaved, {options.bench_seconds:g} s")
                latency = compare_latency(original, optimized, seconds=options.bench_seconds,
                                          threads=run.threads, say=say)
    artifact = Artifact("onnx", str(output_path), optimized_bytes, info.size_bytes / optimized_bytes,
                        options.delegate, accuracy, latency)
    return artifact, preprocessing, reference


def _load_optimized(path: Path, delegate: str, threads: int) -> Engine:
    """Load a model this run produced; a refusal is our conversion's fault, not the user's file."""
    from ...runtime.selection import load

    try:
        return load(path, delegate, threads=threads)
    except ModelError as exc:
        detail = str(exc).replace(str(path), "the converted model")
        raise OptimizeError(f"the optimised model does not load on {delegate}: {detail}") from exc


def _ir_artifact(run: _Run, temp_onnx: Path, temp_xml: Path, final_xml: Path,
                 reference: Sequence[np.ndarray]) -> Artifact:
    """Export to OpenVINO IR; check its accuracy against the reference outputs of the original (on the
    validating delegate, float32) and its speed against the original ONNX on OpenVINO, same run.
    """
    from ...runtime.selection import load

    info, options, say = run.info, run.options, run.say
    say("exporting OpenVINO IR")
    if options.mode == "fp16":  # OpenVINO's own FP16: compressed weights, decompressed at load
        export_ir(Path(info.path), temp_xml, compress_to_fp16=True)
    else:  # the QDQ model becomes FakeQuantize + int8 weights
        export_ir(temp_onnx, temp_xml, compress_to_fp16=False)
    size = temp_xml.stat().st_size + temp_xml.with_suffix(".bin").stat().st_size
    say("validating the IR on openvino against the original")
    with (load(info, "openvino", threads=run.threads) as original,
          _load_optimized(temp_xml, "openvino", run.threads) as ir):
        feeder = ImageFeeder(ir, options)
        accuracy = compare_to_reference(reference, ir, run.validation, feeder,
                                        ambiguous_margin=options.ambiguous_margin)
        latency = None
        if options.bench_seconds > 0:
            say(f"timing original vs IR on openvino, interleaved, {options.bench_seconds:g} s")
            latency = compare_latency(original, ir, seconds=options.bench_seconds, threads=run.threads, say=say)
    return Artifact("openvino-ir", str(final_xml), size, info.size_bytes / size, "openvino", accuracy, latency)
