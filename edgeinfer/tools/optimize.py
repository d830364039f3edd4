"""Make an ONNX model smaller and faster, then prove it still answers like the original.

``optimize_model`` quantises (static INT8, QDQ, per-channel weights) or converts (FP16) a model,
optionally exports it to OpenVINO IR, and validates every artifact against the original on real
images before anything is written:

- accuracy: top-1 agreement with the original and the mean absolute difference of the class
  scores, per image and overall;
- size: original bytes / optimised bytes;
- speed: both models timed in the same process, in alternating blocks, same thread count, medians.

A model whose top-1 agreement is below the threshold is refused (``AccuracyRejected``) unless the
caller forces it. Everything is written to a temporary file beside the output and renamed into
place only at the end, so a failure or a refusal never leaves a half-written model behind.

Calibration and validation images go through :class:`~edgeinfer.preprocess.Preprocessor`, the
same code that prepares frames at inference time, so the quantiser sees exactly what the model
will see in production.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import (
    AccuracyRejected,
    EdgeInferError,
    MissingDependency,
    ModelFormatError,
    OptimizeError,
    OutputError,
)
from ..runtime.model import ModelFormat, ModelInfo, inspect_model

if TYPE_CHECKING:
    import numpy as np

    from ..runtime.engine import Engine

log = logging.getLogger(__name__)

MODES = ("int8", "fp16")
ACTIVATION_TYPES = ("uint8", "int8")
#: refuse an optimised model whose top-1 agrees with the original on fewer validation images
DEFAULT_MIN_AGREEMENT = 0.95
#: an image whose original top-1 beats its top-2 by less than this is a coin flip, not evidence
DEFAULT_AMBIGUOUS_MARGIN = 0.05
#: seconds of interleaved timing per comparison (original vs optimised); 0 skips timing
DEFAULT_BENCH_SECONDS = 4.0
DEFAULT_DELEGATE = "onnxruntime"
METADATA_KEY = "edgeinfer.optimize"
#: ops left in float by INT8 quantisation (see _quantize_int8)
FLOAT_OPS = frozenset({"Softmax"})
#: ops a model's outputs may pass through after its last compute op (see float_outputs)
TAIL_OPS = frozenset({"Softmax", "LogSoftmax", "Sigmoid", "Reshape", "Flatten", "Squeeze", "Unsqueeze",
                      "Identity", "Transpose"})

Progress = Callable[[str], None]


# --------------------------------------------------------------------------------- options

@dataclass(frozen=True, kw_only=True)
class OptimizeOptions:
    """What to do to the model and how to check it. Validated on construction (ValueError)."""

    mode: str
    calibration: str | None = None
    validation: str | None = None
    min_agreement: float = DEFAULT_MIN_AGREEMENT
    ambiguous_margin: float = DEFAULT_AMBIGUOUS_MARGIN
    force: bool = False
    export_ir: bool = False
    mean: float | tuple[float, ...] | None = None
    std: float | tuple[float, ...] | None = None
    resize: str = "stretch"
    per_channel: bool = True
    activations: str = "uint8"
    float_outputs: bool = True
    threads: int | None = None
    delegate: str = DEFAULT_DELEGATE
    bench_seconds: float = DEFAULT_BENCH_SECONDS
    max_calibration_images: int | None = None

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, not {self.mode!r}")
        if self.mode == "int8" and not self.calibration:
            raise ValueError("INT8 quantisation needs calibration images: pass --calibration DIR")
        if self.mode == "fp16" and not (self.validation or self.calibration):
            raise ValueError("FP16 conversion is checked on images: pass --validation DIR")
        if not 0.0 <= self.min_agreement <= 1.0:
            raise ValueError(f"min_agreement must be within [0, 1], not {self.min_agreement}")
        if not 0.0 <= self.ambiguous_margin < 1.0:
            raise ValueError(f"ambiguous_margin must be within [0, 1), not {self.ambiguous_margin}")
        if self.activations not in ACTIVATION_TYPES:
            raise ValueError(f"activations must be one of {ACTIVATION_TYPES}, not {self.activations!r}")
        if self.threads is not None and self.threads < 1:
            raise ValueError("threads must be >= 1")
        if self.bench_seconds < 0:
            raise ValueError("bench_seconds must be >= 0")
        if self.max_calibration_images is not None and self.max_calibration_images < 1:
            raise ValueError("max_calibration_images must be >= 1")
        if self.resize not in ("stretch", "letterbox", "crop"):
            raise ValueError(f"resize must be stretch, letterbox or crop, not {self.resize!r}")


# --------------------------------------------------------------------------------- reports

@dataclass(frozen=True)
class ImageComparison:
    """One validation image: the original's and the optimised model's top-1, and how far apart."""

    image: str
    original_top1: int
    optimized_top1: int  # -1 when the optimised model's top scores are tied
    original_score: float
    optimized_score: float
    margin: float
    ambiguous: bool
    mean_abs_diff: float

    @property
    def agrees(self) -> bool:
        return self.original_top1 == self.optimized_top1


@dataclass(frozen=True)
class Accuracy:
    """Agreement of an optimised model with the original over the validation images.

    ``top1_agreement`` counts only *decisive* images (the original's top-1 beats its top-2 by at
    least the ambiguity margin); ``top1_agreement_all`` counts every image. None when the output
    is not a class-score vector (no top-1 to compare).
    """

    images: int
    decisive: int
    top1_agreement: float | None
    top1_agreement_all: float | None
    top5_agreement: float | None
    mean_abs_diff: float
    max_abs_diff: float
    per_image: tuple[ImageComparison, ...] = ()

    @property
    def disagreements(self) -> list[ImageComparison]:
        return [row for row in self.per_image if not row.agrees]


@dataclass(frozen=True)
class Latency:
    """Both models timed in the same run: alternating blocks, same delegate and thread count."""

    delegate: str
    threads: int
    rounds: int
    original_ms: float
    optimized_ms: float
    original_p95_ms: float
    optimized_p95_ms: float
    samples: tuple[int, int]

    @property
    def speedup(self) -> float:
        return self.original_ms / self.optimized_ms if self.optimized_ms > 0 else float("nan")


@dataclass(frozen=True)
class Artifact:
    """One optimised file (the ONNX model, or the OpenVINO IR) with its checks."""

    kind: str  # "onnx" | "openvino-ir"
    path: str
    size_bytes: int
    size_ratio: float
    delegate: str
    accuracy: Accuracy
    latency: Latency | None


@dataclass(frozen=True)
class OptimizeReport:
    """Everything ``edgeinfer optimize`` prints: sizes, accuracy and speed of each artifact."""

    model: str
    output: str
    mode: str
    original_bytes: int
    artifacts: tuple[Artifact, ...]
    calibration_images: int
    validation_images: int
    preprocessing: dict[str, Any]
    min_agreement: float
    ambiguous_margin: float
    written: bool
    refused: str | None = None
    forced: bool = False
    notes: tuple[str, ...] = field(default=())
    seconds: float = 0.0

    @property
    def onnx(self) -> Artifact:
        return self.artifacts[0]

    def to_dict(self) -> dict:
        """JSON-ready form (derived figures such as speedup included)."""
        data = asdict(self)
        for artifact, out in zip(self.artifacts, data["artifacts"]):
            if artifact.latency is not None:
                out["latency"]["speedup"] = round(artifact.latency.speedup, 3)
            for row, row_out in zip(artifact.accuracy.per_image, out["accuracy"]["per_image"]):
                row_out["agrees"] = row.agrees
        return data


# --------------------------------------------------------------------------------- helpers

@contextlib.contextmanager
def _quiet_vendor_logging() -> Iterator[None]:
    """ONNX Runtime's quantiser calls ``logging.warning`` on the root logger; keep that at debug."""

    def demote(record: logging.LogRecord) -> bool:
        if "onnxruntime" in record.pathname or "onnx" in record.name:
            log.debug("onnxruntime: %s", record.getMessage())
            return False
        return True

    root = logging.getLogger()
    root.addFilter(demote)
    try:
        yield
    finally:
        root.removeFilter(demote)


def _import(module: str, extra: str, purpose: str):
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingDependency(
            f"{purpose} needs the python module {module!r} ({exc}) — pip install 'edgeinfer[{extra}]'"
        ) from exc


def collect_images(folder: str | os.PathLike, what: str, limit: int | None = None) -> list[Path]:
    """Image files directly inside ``folder``; OptimizeError if it is missing or holds none."""
    from ..capture.images import IMAGE_SUFFIXES, list_images

    path = Path(folder)
    if not path.exists():
        raise OptimizeError(f"{what} folder not found: {path} — pass a folder of images")
    if not path.is_dir():
        raise OptimizeError(f"{what} path {path} is not a folder — pass a folder of images")
    images = list_images(path)
    if not images:
        raise OptimizeError(
            f"{what} folder {path} holds no images ({', '.join(IMAGE_SUFFIXES)}) — "
            "put a few hundred representative frames from the target camera there"
        )
    return images[:limit] if limit else images


def _temp_path(final: Path, suffix: str) -> Path:
    return final.with_name(f".{final.stem}.{os.getpid()}-{time.monotonic_ns() % 10**9}.tmp{suffix}")


def _check_output(output: Path, model: Path, export_ir: bool) -> list[Path]:
    """Fail early, before minutes of work, if the output path(s) cannot be written."""
    finals = [output]
    if export_ir:
        if output.suffix.lower() in (".xml", ".bin"):
            raise ValueError(f"the output {output} is the ONNX model; give it a .onnx name (the IR goes beside it)")
        finals += [output.with_suffix(".xml"), output.with_suffix(".bin")]
    parent = output.parent
    if not parent.exists():
        raise OutputError(f"cannot write {output}: folder {parent} does not exist — create it first")
    if not parent.is_dir():
        raise OutputError(f"cannot write {output}: {parent} is not a folder")
    for final in finals:
        if final.is_dir():
            raise OutputError(f"cannot write {final}: it is a folder — give a file name")
        if final.exists() and final.resolve() == model.resolve():
            raise OutputError(f"refusing to overwrite the input model {model} — choose another output name")
    probe = _temp_path(output, ".probe")
    try:
        with open(probe, "xb"):
            pass
    except OSError as exc:
        raise OutputError(f"cannot write {output}: {exc.strerror or exc} — choose a writable folder") from exc
    finally:
        with contextlib.suppress(OSError):
            probe.unlink()
    return finals


def _fsync_replace(temp: Path, final: Path) -> None:
    """Flush ``temp`` to disk, rename it over ``final`` (atomic on POSIX), flush the folder."""
    with open(temp, "rb+") as fh:
        os.fsync(fh.fileno())
    os.replace(temp, final)
    with contextlib.suppress(OSError):
        fd = os.open(final.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _parse_values(value: float | tuple[float, ...] | None) -> float | tuple[float, ...] | None:
    if value is None or isinstance(value, int | float):
        return value
    return tuple(float(v) for v in value)


class _Feeder:
    """Reads an image and writes it into an input buffer exactly as inference does."""

    def __init__(self, engine: Engine, options: OptimizeOptions) -> None:
        from ..pipeline.preprocess import input_geometry

        spec = engine.inputs[0] if engine.inputs else None
        if len(engine.inputs) != 1 or spec is None:
            raise OptimizeError(
                f"{engine.model.path} has {len(engine.inputs)} inputs; optimize calibrates models with one image input"
            )
        try:
            input_geometry(spec)
        except ValueError as exc:
            raise OptimizeError(f"cannot calibrate {engine.model.path} on images: {exc}") from None
        self.spec = spec
        self.options = options
        self._pre: dict[tuple[int, int], Any] = {}

    def __call__(self, image_path: Path, dst: np.ndarray) -> None:
        from .._native import captured_native_stderr
        from ..capture.images import read_image
        from ..pipeline.preprocess import Preprocessor

        with captured_native_stderr("OpenCV"):  # libjpeg prints "Premature end of JPEG file" itself
            frame = read_image(image_path)
        size = (frame.shape[1], frame.shape[0])
        pre = self._pre.get(size)
        if pre is None:
            if len(self._pre) > 16:
                self._pre.clear()
            pre = self._pre[size] = Preprocessor(
                self.spec, size, resize=self.options.resize, mean=_parse_values(self.options.mean),
                std=_parse_values(self.options.std),
            )
        pre(frame, dst)

    def describe(self) -> dict[str, Any]:
        from ..pipeline.preprocess import DEFAULT_FLOAT_MEAN, DEFAULT_FLOAT_STD

        mean = _parse_values(self.options.mean)
        std = _parse_values(self.options.std)
        return {
            "resize": self.options.resize,
            "rgb": True,
            "mean": DEFAULT_FLOAT_MEAN if mean is None else mean,
            "std": DEFAULT_FLOAT_STD if std is None else std,
            "input": self.spec.name,
            "shape": list(self.spec.shape),
            "dtype": self.spec.dtype,
        }


# --------------------------------------------------------------------------------- convert

def _quantize_int8(source: Path, target: Path, images: Sequence[Path], feeder: _Feeder, engine: Engine,
                   options: OptimizeOptions, say: Progress, notes: list[str]) -> None:
    """Static INT8, QDQ format, per-channel weights, calibrated on ``images``."""
    import numpy as np

    quantization = _import("onnxruntime.quantization", "onnx", "INT8 quantisation")
    shape_inference = _import("onnxruntime.quantization.shape_inference", "onnx", "INT8 quantisation")
    input_name = feeder.spec.name
    shape = engine.input_view(0).shape
    dtype = engine.input_view(0).dtype

    class Reader(quantization.CalibrationDataReader):
        def __init__(self) -> None:
            self.index = 0

        def get_next(self) -> dict | None:
            if self.index >= len(images):
                return None
            path = images[self.index]
            self.index += 1
            array = np.empty(shape, dtype)
            feeder(path, array)
            say(f"calibrating: image {self.index}/{len(images)} ({path.name})")
            return {input_name: array}

    prepared = _temp_path(target, ".pre.onnx")
    ort = _import("onnxruntime", "onnx", "INT8 quantisation")
    # The quantiser's own sessions log C++ warnings (initialisers listed as graph inputs, ...)
    # straight to stderr; the default is warning (2).
    ort.set_default_logger_severity(3)
    try:
        say("quantising: preparing the graph (shape inference, graph optimisation)")
        try:
            with _quiet_vendor_logging():
                shape_inference.quant_pre_process(str(source), str(prepared), skip_symbolic_shape=True)
            quant_input = prepared
        except Exception as exc:  # the pre-pass is an optimisation; quantise the model as it is
            notes.append(f"quantisation pre-processing skipped: {' '.join(str(exc).split())[:200]}")
            quant_input = source
        kinds = quantization.QuantType
        # Softmax is cheap in float, and an 8-bit softmax output (1/255 steps) only adds rounding
        # that turns close calls into ties; it stays float. (float_outputs does the same for the
        # logits feeding it.)
        onnx = _import("onnx", "onnx", "INT8 quantisation")
        model = onnx.load(str(quant_input))
        if _prepare_for_qdq(model, onnx, notes):
            onnx.save(model, str(prepared))
            quant_input = prepared
        keep_float = [node.name for node in model.graph.node if node.op_type in FLOAT_OPS]
        with _quiet_vendor_logging():
            quantization.quantize_static(
                str(quant_input), str(target), Reader(),
                quant_format=quantization.QuantFormat.QDQ,
                per_channel=options.per_channel,
                activation_type=kinds.QUInt8 if options.activations == "uint8" else kinds.QInt8,
                weight_type=kinds.QInt8,
                calibrate_method=quantization.CalibrationMethod.MinMax,
                nodes_to_exclude=keep_float or None,
                extra_options={"CalibMaxIntermediateOutputs": 16},
            )
    except EdgeInferError:
        raise
    except OSError as exc:
        raise OutputError(f"cannot write the quantised model beside {target}: {exc}") from exc
    except Exception as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise OptimizeError(f"ONNX Runtime could not quantise {source}: {first}") from exc
    finally:
        ort.set_default_logger_severity(2)
        with contextlib.suppress(OSError):
            prepared.unlink()


#: QDQ with per-channel scales (DequantizeLinear's ``axis``) needs opset 13
MIN_QDQ_OPSET = 13


def _prepare_for_qdq(model: Any, onnx: Any, notes: list[str]) -> bool:
    """Name every node and lift the opset to 13 if needed; True if ``model`` changed."""
    changed = False
    for index, node in enumerate(model.graph.node):
        if not node.name:
            node.name = f"{node.op_type}_{index}"
            changed = True
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), MIN_QDQ_OPSET)
    if opset < MIN_QDQ_OPSET:
        from onnx import version_converter

        try:
            converted = version_converter.convert_version(model, MIN_QDQ_OPSET)
        except Exception as exc:
            raise OptimizeError(
                f"the model uses ONNX opset {opset}; QDQ quantisation needs {MIN_QDQ_OPSET} and the conversion "
                f"failed ({' '.join(str(exc).split())[:160]}) — re-export the model with opset >= {MIN_QDQ_OPSET}"
            ) from exc
        model.CopyFrom(converted)
        notes.append(f"ONNX opset {opset} upgraded to {MIN_QDQ_OPSET} for QDQ quantisation")
        changed = True
    return changed


def float_outputs(model: Any) -> int:
    """Remove the QuantizeLinear/DequantizeLinear pairs between the last compute op and the outputs.

    ``model`` is an ``onnx.ModelProto`` in QDQ form, edited in place; returns the pairs removed.
    The last layer keeps its INT8 weights but emits float: 8-bit logits sit on a grid coarse
    enough (about 0.1 for MobileNet) that classes a few hundredths apart in probability become
    exact ties. Walks back from each graph output through layout ops and Softmax only.
    """
    graph = model.graph
    removed = 0
    output_names = {value.name for value in graph.output}
    for output in graph.output:
        name = output.name
        for _ in range(64):
            producers = {out: node for node in graph.node for out in node.output}
            node = producers.get(name)
            if node is None:
                break
            if node.op_type in TAIL_OPS:
                name = node.input[0]
                continue
            if node.op_type != "DequantizeLinear":
                break
            quant = producers.get(node.input[0])
            users = [n for n in graph.node if quant is not None and quant.output[0] in n.input]
            if quant is None or quant.op_type != "QuantizeLinear" or len(users) != 1 or node.output[0] in output_names:
                break
            source = quant.input[0]
            for consumer in graph.node:
                for index, value in enumerate(consumer.input):
                    if value == node.output[0]:
                        consumer.input[index] = source
            graph.node.remove(node)
            graph.node.remove(quant)
            removed += 1
            name = source
    if removed:
        used = {value for node in graph.node for value in node.input}
        unused = [init for init in graph.initializer if init.name not in used]
        for init in unused:
            graph.initializer.remove(init)
    return removed


def _convert_fp16(source: Path, target: Path) -> None:
    """FP16 weights and activations, float32 inputs and outputs (so preprocessing is unchanged)."""
    onnx = _import("onnx", "onnx", "FP16 conversion")
    # ONNX Runtime ships the float16 converter of onnxconverter-common (same code, kept in step with
    # ORT's kernels), so FP16 needs no extra package.
    float16 = _import("onnxruntime.transformers.float16", "onnx", "FP16 conversion")
    try:
        with _quiet_vendor_logging():
            converted = float16.convert_float_to_float16(onnx.load(str(source)), keep_io_types=True)
            onnx.save(converted, str(target))
    except OSError as exc:
        raise OutputError(f"cannot write the FP16 model beside {target}: {exc}") from exc
    except Exception as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise OptimizeError(f"could not convert {source} to FP16: {first}") from exc


def _finish_model(path: Path, info: ModelInfo, options: OptimizeOptions, preprocessing: dict,
                  calibration: int, notes: list[str]) -> None:
    """Float outputs for INT8 (see float_outputs); record how the model was made in its metadata."""
    onnx = _import("onnx", "onnx", "model metadata")
    model = onnx.load(str(path))
    float_tail = options.mode == "int8" and options.float_outputs
    if float_tail and float_outputs(model):
        notes.append("the layers feeding the outputs keep INT8 weights but emit float (8-bit outputs turn "
                     "close scores into ties); --quantize-outputs is faster and coarser")
    stamp = {"mode": options.mode, "source_sha256": info.sha256, "source": Path(info.path).name,
             "calibration_images": calibration, "per_channel": options.per_channel,
             "activations": options.activations if options.mode == "int8" else None,
             "float_outputs": float_tail, "preprocessing": preprocessing}
    kept = [p for p in model.metadata_props if p.key != METADATA_KEY]
    del model.metadata_props[:]
    model.metadata_props.extend(kept)
    entry = model.metadata_props.add()
    entry.key, entry.value = METADATA_KEY, json.dumps(stamp, sort_keys=True)
    onnx.save(model, str(path))


def _export_ir(source: Path, target_xml: Path, compress_to_fp16: bool) -> None:
    """Convert an ONNX model to OpenVINO IR (``target_xml`` + the .bin beside it)."""
    from .._native import captured_native_stderr

    ov = _import("openvino", "openvino", "OpenVINO IR export")
    try:
        with captured_native_stderr("OpenVINO"):
            converted = ov.convert_model(str(source))
            ov.save_model(converted, str(target_xml), compress_to_fp16=compress_to_fp16)
    except OSError as exc:
        raise OutputError(f"cannot write the IR beside {target_xml}: {exc}") from exc
    except Exception as exc:
        lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
        raise OptimizeError(f"OpenVINO could not convert {source} to IR: {lines[-1] if lines else exc}") from exc


# --------------------------------------------------------------------------------- validate

def _is_class_vector(shape: Sequence[int]) -> bool:
    return sum(1 for d in shape if d > 1) == 1


def _scores(engine: Engine, classify: bool) -> np.ndarray:
    import numpy as np

    from ..pipeline.postprocess import class_scores

    spec = engine.outputs[0]
    if classify:
        return class_scores(engine.output_view(0), spec).astype(np.float64)
    return spec.dequantize(engine.output_view(0)).astype(np.float64).reshape(-1)


def reference_outputs(engine: Engine, images: Sequence[Path], feeder: _Feeder) -> list[np.ndarray]:
    """The original model's outputs on ``images`` (class scores for a classifier), kept for comparison."""
    classify = _is_class_vector(engine.outputs[0].shape)
    outputs = []
    for image in images:
        feeder(image, engine.input_view(0))
        engine.invoke()
        outputs.append(_scores(engine, classify).copy())
    return outputs


def compare_to_reference(reference: Sequence[np.ndarray], engine: Engine, images: Sequence[Path], feeder: _Feeder,
                         *, ambiguous_margin: float = DEFAULT_AMBIGUOUS_MARGIN,
                         say: Progress | None = None) -> Accuracy:
    """Run ``engine`` on every image and compare with the original's outputs: top-1/top-5, |diff|.

    A tie at the top of the optimised model's scores never counts as agreement: the model cannot
    tell the classes apart, and which one a user sees would depend on the sort.
    """
    import numpy as np

    classify = _is_class_vector(engine.outputs[0].shape) and all(r.ndim == 1 for r in reference)
    classify = classify and all(_is_class_vector(r.shape) for r in reference)
    rows: list[ImageComparison] = []
    diffs: list[float] = []
    max_diff = 0.0
    top5_hits = 0
    for number, (image, a) in enumerate(zip(images, reference), 1):
        feeder(image, engine.input_view(0))
        engine.invoke()
        b = _scores(engine, classify)
        if a.shape != b.shape:
            raise OptimizeError(f"the optimised model's output has {b.size} values, the original's {a.size}")
        if not np.all(np.isfinite(b)):
            raise OptimizeError(f"the optimised model produced NaN/inf on {image.name} — the conversion is broken")
        diff = np.abs(a - b)
        diffs.append(float(diff.mean()))
        max_diff = max(max_diff, float(diff.max()))
        if classify:
            order_a = np.argsort(-a, kind="stable")  # ties: lowest index first, like argmax
            order_b = np.argsort(-b, kind="stable")
            margin = float(a[order_a[0]] - a[order_a[1]]) if a.size > 1 else 1.0
            tied = b.size > 1 and b[order_b[0]] == b[order_b[1]]
            top5_hits += int(order_a[0] in order_b[:5])
            rows.append(ImageComparison(
                image.name, int(order_a[0]), -1 if tied else int(order_b[0]), round(float(a[order_a[0]]), 6),
                round(float(b[order_b[0]]), 6), round(margin, 6), margin < ambiguous_margin,
                round(float(diff.mean()), 8),
            ))
        if say:
            say(f"validating: image {number}/{len(images)} ({image.name})")
    count = len(images)
    if not classify:
        return Accuracy(count, 0, None, None, None, float(np.mean(diffs)), max_diff, ())
    decisive = [r for r in rows if not r.ambiguous]
    agreement = sum(r.agrees for r in decisive) / len(decisive) if decisive else None
    return Accuracy(
        images=count, decisive=len(decisive), top1_agreement=agreement,
        top1_agreement_all=sum(r.agrees for r in rows) / count, top5_agreement=top5_hits / count,
        mean_abs_diff=float(np.mean(diffs)), max_abs_diff=max_diff, per_image=tuple(rows),
    )


def compare_models(original: Engine, optimized: Engine, images: Sequence[Path], feeder: _Feeder, *,
                   ambiguous_margin: float = DEFAULT_AMBIGUOUS_MARGIN, say: Progress | None = None) -> Accuracy:
    """Run both engines on every image; top-1 / top-5 agreement and score differences."""
    reference = reference_outputs(original, images, feeder)
    return compare_to_reference(reference, optimized, images, feeder, ambiguous_margin=ambiguous_margin, say=say)


def compare_latency(original: Engine, optimized: Engine, *, seconds: float, threads: int,
                    say: Progress | None = None) -> Latency:
    """Time both engines in alternating blocks (same process, same threads); medians."""
    from .timing import DEFAULT_ROUNDS, interleaved_latency, percentile

    base, fast = interleaved_latency([original, optimized], seconds=seconds, rounds=DEFAULT_ROUNDS, progress=say)
    return Latency(
        delegate=original.description, threads=threads, rounds=DEFAULT_ROUNDS,
        original_ms=round(percentile(base, 50), 4), optimized_ms=round(percentile(fast, 50), 4),
        original_p95_ms=round(percentile(base, 95), 4), optimized_p95_ms=round(percentile(fast, 95), 4),
        samples=(len(base), len(fast)),
    )


def _refusal(artifacts: Sequence[Artifact], options: OptimizeOptions) -> str | None:
    for artifact in artifacts:
        acc = artifact.accuracy
        label = "the INT8 model" if options.mode == "int8" else "the FP16 model"
        if artifact.kind == "openvino-ir":
            label = "the OpenVINO IR"
        if acc.top1_agreement_all is None:
            return (f"cannot check {label}: its output is not a class-score vector, so there is no top-1 "
                    f"to compare (mean |diff| {acc.mean_abs_diff:.3g})")
        if acc.top1_agreement is None:
            return (f"every validation image is ambiguous for the original model (top-1 beats top-2 by "
                    f"< {options.ambiguous_margin:g}) — validate on images it classifies decisively")
        if acc.top1_agreement < options.min_agreement:
            agreeing = sum(r.agrees for r in acc.per_image if not r.ambiguous)
            return (f"{label} agrees with the original on top-1 for {acc.top1_agreement:.1%} of decisive "
                    f"validation images ({agreeing}/{acc.decisive}), below the {options.min_agreement:.0%} threshold")
    return None


# --------------------------------------------------------------------------------- main

def optimize_model(model: str | os.PathLike, output: str | os.PathLike, options: OptimizeOptions, *,
                   progress: Progress | None = None) -> OptimizeReport:
    """Optimise ``model`` into ``output``, validate it against the original, write it only if it holds up.

    Raises AccuracyRejected (nothing written, ``.report`` attached) when the top-1 agreement is
    below ``options.min_agreement`` and ``options.force`` is false.
    """
    from ..runtime.selection import load

    say = progress or (lambda _message: None)
    started = time.perf_counter()
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
    output_path = Path(output)
    finals = _check_output(output_path, Path(info.path), options.export_ir)
    calibration = (
        collect_images(options.calibration, "calibration", options.max_calibration_images)
        if options.calibration and options.mode == "int8" else []
    )
    if options.validation:
        validation = collect_images(options.validation, "validation")
    elif calibration:
        validation = calibration
    else:
        validation = collect_images(options.calibration, "validation") if options.calibration else []
    threads = options.threads or os.cpu_count() or 1
    notes: list[str] = []
    if calibration and validation is calibration:
        notes.append("validated on the calibration images themselves; pass --validation DIR with held-out "
                     "images for an unbiased check")
    temps: list[Path] = []
    temp_onnx = _temp_path(output_path, ".onnx")
    temps.append(temp_onnx)
    try:
        say(f"loading {Path(info.path).name} on {options.delegate} ({threads} threads)")
        with load(info, options.delegate, threads=threads) as original:
            feeder = _Feeder(original, options)
            preprocessing = feeder.describe()
            if original.inputs[0].dtype not in ("float32", "float16", "float64"):
                raise OptimizeError(f"{info.path} takes {original.inputs[0].dtype} input; optimize needs a float model")
            if options.mode == "int8":
                say(f"quantising to INT8 ({'per-channel' if options.per_channel else 'per-tensor'} weights, "
                    f"{options.activations} activations), calibrating on {len(calibration)} images")
                _quantize_int8(Path(info.path), temp_onnx, calibration, feeder, original, options, say, notes)
            else:
                say("converting to FP16 (float32 inputs and outputs kept)")
                _convert_fp16(Path(info.path), temp_onnx)
            _finish_model(temp_onnx, info, options, preprocessing, len(calibration), notes)
            optimized_bytes = temp_onnx.stat().st_size
            say(f"validating on {len(validation)} images against the original")
            reference = reference_outputs(original, validation, feeder)
            with _load_optimized(temp_onnx, options.delegate, threads) as optimized:
                accuracy = compare_to_reference(reference, optimized, validation, feeder,
                                                ambiguous_margin=options.ambiguous_margin, say=say)
                latency = None
                if options.bench_seconds > 0:
                    say(f"timing original vs optimised, interleaved, {options.bench_seconds:g} s")
                    latency = compare_latency(original, optimized, seconds=options.bench_seconds,
                                              threads=threads, say=say)
        artifacts = [Artifact("onnx", str(output_path), optimized_bytes, info.size_bytes / optimized_bytes,
                              options.delegate, accuracy, latency)]
        if options.export_ir:
            artifacts.append(_ir_artifact(info, temp_onnx, finals[1], options, threads, validation, reference,
                                          temps, say))
        refused = _refusal(artifacts, options)
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
        say(f"writing {output_path}")
        if options.export_ir:
            temp_xml = temps[-2]
            _fsync_replace(temp_xml.with_suffix(".bin"), finals[2])
            _fsync_replace(temp_xml, finals[1])
        _fsync_replace(temp_onnx, output_path)
        return replace(report, written=True, seconds=round(time.perf_counter() - started, 2))
    finally:
        for temp in temps:
            with contextlib.suppress(OSError):
                temp.unlink()


def _load_optimized(path: Path, delegate: str, threads: int) -> Engine:
    """Load a model this run produced; a refusal is our conversion's fault, not the user's file."""
    from ..errors import ModelError
    from ..runtime.selection import load

    try:
        return load(path, delegate, threads=threads)
    except ModelError as exc:
        detail = str(exc).replace(str(path), "the converted model")
        raise OptimizeError(f"the optimised model does not load on {delegate}: {detail}") from exc


def _ir_artifact(info: ModelInfo, temp_onnx: Path, final_xml: Path, options: OptimizeOptions, threads: int,
                 validation: Sequence[Path], reference: Sequence[np.ndarray], temps: list[Path],
                 say: Progress) -> Artifact:
    """Export to OpenVINO IR; check its accuracy against the reference outputs of the original (on the
    validating delegate, float32) and its speed against the original ONNX on OpenVINO, same run.
    """
    from ..runtime.selection import load

    temp_xml = _temp_path(final_xml, ".xml")
    temps += [temp_xml, temp_xml.with_suffix(".bin")]
    say("exporting OpenVINO IR")
    if options.mode == "fp16":  # OpenVINO's own FP16: compressed weights, decompressed at load
        _export_ir(Path(info.path), temp_xml, compress_to_fp16=True)
    else:  # the QDQ model becomes FakeQuantize + int8 weights
        _export_ir(temp_onnx, temp_xml, compress_to_fp16=False)
    size = temp_xml.stat().st_size + temp_xml.with_suffix(".bin").stat().st_size
    say("validating the IR on openvino against the original")
    with load(info, "openvino", threads=threads) as original, _load_optimized(temp_xml, "openvino", threads) as ir:
        feeder = _Feeder(ir, options)
        accuracy = compare_to_reference(reference, ir, validation, feeder, ambiguous_margin=options.ambiguous_margin)
        latency = None
        if options.bench_seconds > 0:
            say(f"timing original vs IR on openvino, interleaved, {options.bench_seconds:g} s")
            latency = compare_latency(original, ir, seconds=options.bench_seconds, threads=threads, say=say)
    return Artifact("openvino-ir", str(final_xml), size, info.size_bytes / size, "openvino", accuracy, latency)

