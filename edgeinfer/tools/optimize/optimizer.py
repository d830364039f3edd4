"""``optimize_model``: the whole run, from the cheap checks to the files renamed into place."""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...errors import AccuracyRejected, ModelError, ModelFormatError, OptimizeError
from ...runtime.model import ModelFormat, ModelInfo, inspect_model
from ...util.fs import atomic_path
from .convert import convert_fp16, export_ir
from .detectors import DetectorOutputs, compare_detections, detect_images, read_detector
from .images import ImageFeeder, image_sets
from .int8 import int8_arithmetic, quantize_int8
from .options import OptimizeOptions, Progress
from .output import check_outputs, finish_model
from .report import Accuracy, Artifact, OptimizeReport
from .validate import compare_latency, compare_to_reference, reference_outputs, refusal_reason

if TYPE_CHECKING:
    import numpy as np

    from ...pipeline.tasks import ModelReading
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


@dataclass(frozen=True)
class _Onnx:
    """The ONNX artifact and what the IR's check reuses: the original's outputs, how the model is read."""

    artifact: Artifact
    preprocessing: dict[str, Any]
    #: the original's class scores (a classifier) or boxes (a detector) on the validation images
    reference: list[np.ndarray] | DetectorOutputs
    #: how the pipeline reads a detector (None: a classifier)
    reading: ModelReading | None
    float_nodes: dict[str, str]


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
    arithmetic: dict[str, Any] = {}
    if options.mode == "int8":
        arithmetic, arithmetic_notes = int8_arithmetic(options)
        notes += arithmetic_notes
    run = _Run(info, options, options.threads or os.cpu_count() or 1, calibration, validation, notes,
               progress or (lambda _message: None))
    # Each file is written under a temporary name beside its final one; the ExitStack renames them
    # into place (IR .bin, IR .xml, then the ONNX model) only if the block ends without an exception,
    # so a failure or a refusal never leaves a half-written model behind.
    with contextlib.ExitStack() as staged:
        temp_onnx = staged.enter_context(atomic_path(output_path))
        onnx = _optimize_onnx(run, temp_onnx, output_path)
        artifacts = [onnx.artifact]
        if options.export_ir:
            temp_xml = staged.enter_context(atomic_path(finals[1]))
            # OpenVINO writes the weights beside the .xml under its stem: the .bin's temporary name
            staged.enter_context(atomic_path(finals[2], temp=temp_xml.with_suffix(".bin")))
            artifacts.append(_ir_artifact(run, temp_onnx, temp_xml, finals[1], onnx))
        refused = refusal_reason(artifacts, options, saturating=arithmetic.get("saturating_delegates", ()))
        report = OptimizeReport(
            model=info.path, output=str(output_path), mode=options.mode, original_bytes=info.size_bytes,
            artifacts=tuple(artifacts), calibration_images=len(calibration), validation_images=len(validation),
            preprocessing=onnx.preprocessing, min_agreement=options.min_agreement,
            ambiguous_margin=options.ambiguous_margin, written=False, refused=refused,
            forced=bool(refused and options.force), notes=tuple(notes),
            seconds=round(time.perf_counter() - started, 2), float_nodes=onnx.float_nodes, int8_arithmetic=arithmetic,
            **_detector_fields(onnx.reading, options),
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


def _detector_fields(reading: ModelReading | None, options: OptimizeOptions) -> dict[str, Any]:
    """The report's fields that say how a detector was judged (none for a classifier)."""
    if reading is None:
        return {}
    return {"task": reading.task, "layout": reading.layout.name, "box_minimums": options.box_minimums,
            "score_threshold": options.score_threshold,
            "iou_threshold": options.iou_threshold}


def _optimize_onnx(run: _Run, temp_onnx: Path, output_path: Path) -> _Onnx:
    """Convert the model into ``temp_onnx`` and check it against the original on the chosen delegate."""
    from ...runtime.selection import load

    info, options, say = run.info, run.options, run.say
    say(f"loading {Path(info.path).name} on {options.delegate} ({run.threads} threads)")
    with load(info, options.delegate, threads=run.threads) as original:
        reading = read_detector(original, options.decoder)
        feeder = ImageFeeder(original, options, reading)
        preprocessing = feeder.describe()
        if original.inputs[0].dtype not in FLOAT_INPUT_TYPES:
            raise OptimizeError(f"{info.path} takes {original.inputs[0].dtype} input; optimize needs a float model")
        kept: dict[str, str] = {}
        if options.mode == "int8":
            say(f"quantising to INT8 ({'per-channel' if options.per_channel else 'per-tensor'} "
                f"{'7-bit ' if options.reduce_range else ''}weights, "
                f"{options.activations} activations), calibrating on {len(run.calibration)} images")
            kept = quantize_int8(Path(info.path), temp_onnx, run.calibration, feeder, original, options, say,
                                 run.notes, detector=reading is not None)
        else:
            say("converting to FP16 (float32 inputs and outputs kept)")
            convert_fp16(Path(info.path), temp_onnx)
        finish_model(temp_onnx, info, options, preprocessing, len(run.calibration), run.notes)
        optimized_bytes = temp_onnx.stat().st_size
        say(f"validating on {len(run.validation)} images against the original"
            + (f" ({reading.task}: boxes at score >= {options.score_threshold:g})" if reading else ""))
        reference = _reference(original, reading, run, feeder)
        with _load_optimized(temp_onnx, options.delegate, run.threads) as optimized:
            accuracy = _accuracy(reference, optimized, reading, run, feeder, say)
            latency = None
            if options.bench_seconds > 0:
                say(f"timing original vs optimised, interleaved, {options.bench_seconds:g} s")
                latency = compare_latency(original, optimized, seconds=options.bench_seconds,
                                          threads=run.threads, say=say)
    artifact = Artifact("onnx", str(output_path), optimized_bytes, info.size_bytes / optimized_bytes,
                        options.delegate, accuracy, latency)
    return _Onnx(artifact, preprocessing, reference, reading, kept)


def _reference(original: Engine, reading: ModelReading | None, run: _Run,
               feeder: ImageFeeder) -> list[np.ndarray] | DetectorOutputs:
    """The original's class scores, or its boxes at the operating threshold for a detector."""
    if reading is None:
        return reference_outputs(original, run.validation, feeder)
    return detect_images(original, reading, run.validation, feeder, run.options.score_threshold,
                         iou_threshold=run.options.iou_threshold)


def _accuracy(reference: list[np.ndarray] | DetectorOutputs, engine: Engine, reading: ModelReading | None,
              run: _Run, feeder: ImageFeeder, say: Progress | None) -> Accuracy:
    """``engine`` against the original's outputs: top-1 for a classifier, boxes for a detector."""
    if isinstance(reference, DetectorOutputs) and reading is not None:
        return compare_detections(reference, engine, reading, run.validation, feeder, run.options, say)
    return compare_to_reference(reference, engine, run.validation, feeder,
                                ambiguous_margin=run.options.ambiguous_margin, say=say)


def _load_optimized(path: Path, delegate: str, threads: int) -> Engine:
    """Load a model this run produced; a refusal is our conversion's fault, not the user's file."""
    from ...runtime.selection import load

    try:
        return load(path, delegate, threads=threads)
    except ModelError as exc:
        detail = str(exc).replace(str(path), "the converted model")
        raise OptimizeError(f"the optimised model does not load on {delegate}: {detail}") from exc


def _ir_artifact(run: _Run, temp_onnx: Path, temp_xml: Path, final_xml: Path, onnx: _Onnx) -> Artifact:
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
        feeder = ImageFeeder(ir, options, onnx.reading)
        accuracy = _accuracy(onnx.reference, ir, onnx.reading, run, feeder, None)
        latency = None
        if options.bench_seconds > 0:
            say(f"timing original vs IR on openvino, interleaved, {options.bench_seconds:g} s")
            latency = compare_latency(original, ir, seconds=options.bench_seconds, threads=run.threads, say=say)
    return Artifact("openvino-ir", str(final_xml), size, info.size_bytes / size, "openvino", accuracy, latency)
