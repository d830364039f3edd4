"""Static INT8 quantisation with ONNX Runtime: QDQ format, per-channel weights, calibrated on images."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...errors import EdgeInferError, OptimizeError, OutputError
from ...util.optional import import_optional
from .options import OptimizeOptions, Progress
from .vendor import first_line, quiet_vendor_logging, squashed

if TYPE_CHECKING:
    from ...runtime.engine import Engine
    from .images import ImageFeeder

#: ops left in float by INT8 quantisation (see quantize_int8)
FLOAT_OPS = frozenset({"Softmax"})
#: ops a model's outputs may pass through after its last compute op (see float_outputs)
TAIL_OPS = frozenset({"Softmax", "LogSoftmax", "Sigmoid", "Reshape", "Flatten", "Squeeze", "Unsqueeze",
                      "Identity", "Transpose"})
#: layers with learned weights: a detector's decode tail starts after the last of them (see decode_tail)
LEARNED_OPS = frozenset({"Conv", "ConvTranspose", "Gemm", "MatMul"})
#: QDQ with per-channel scales (DequantizeLinear's ``axis``) needs opset 13
MIN_QDQ_OPSET = 13
#: ORT's C++ logger severities: the default (warning) and errors only
ORT_LOG_WARNING, ORT_LOG_ERROR = 2, 3


def quantize_int8(source: Path, target: Path, images: Sequence[Path], feeder: ImageFeeder, engine: Engine,
                  options: OptimizeOptions, say: Progress, notes: list[str], *, detector: bool = False
                  ) -> dict[str, str]:
    """Static INT8, QDQ format, per-channel weights, calibrated on ``images``; the nodes left in float (name:
    op type).

    A ``detector`` keeps its decode tail in float too (see decode_tail); ``options.quantize_all`` keeps none.
    """
    quantization = import_optional("onnxruntime.quantization", "onnx", "INT8 quantisation")
    reader = _calibration_reader(quantization.CalibrationDataReader, images, feeder, engine, say)
    prepared = target.with_name(f"{target.stem}.pre.onnx")
    ort = import_optional("onnxruntime", "onnx", "INT8 quantisation")
    # The quantiser's own sessions log C++ warnings (initialisers listed as graph inputs, ...)
    # straight to stderr; errors only while it runs, then back to ORT's default.
    ort.set_default_logger_severity(ORT_LOG_ERROR)
    try:
        quant_input, model = _prepared_graph(source, prepared, notes, say)
        kinds = quantization.QuantType
        keep_float = {} if options.quantize_all else float_nodes(model, detector)
        with quiet_vendor_logging():
            quantization.quantize_static(
                str(quant_input), str(target), reader,
                quant_format=quantization.QuantFormat.QDQ,
                per_channel=options.per_channel,
                reduce_range=options.reduce_range,
                activation_type=kinds.QUInt8 if options.activations == "uint8" else kinds.QInt8,
                weight_type=kinds.QInt8,
                calibrate_method=quantization.CalibrationMethod.MinMax,
                nodes_to_exclude=list(keep_float) or None,
                extra_options={"CalibMaxIntermediateOutputs": 16},
            )
    except EdgeInferError:
        raise
    except OSError as exc:
        raise OutputError(f"cannot write the quantised model beside {target}: {exc}") from exc
    except Exception as exc:
        raise OptimizeError(f"ONNX Runtime could not quantise {source}: {first_line(exc)}") from exc
    finally:
        ort.set_default_logger_severity(ORT_LOG_WARNING)
        with contextlib.suppress(OSError):
            prepared.unlink()
    return keep_float


def int8_arithmetic(options: OptimizeOptions) -> tuple[dict[str, Any], list[str]]:
    """How this CPU computes the INT8 model on the validating delegates, for the report, and the notes that say it.

    On an x86 CPU without VNNI, uint8 x int8 products pairwise saturate in 16 bits (device.host.u8s8_saturates).
    The onnxruntime delegate runs ONNX Runtime's exact U8U8 kernels there; OpenVINO has no such mode, so an
    artifact it validates here shows what such CPUs compute, not what the model computes on one with VNNI.
    ``--reduce-range`` (7-bit weights) cannot saturate anywhere, at some accuracy (measured on this project's
    photos: MobileNet v2 flips 2 of 8, the fall detector loses 1 of 7 boxes).
    """
    from ...device.host import host_u8s8_saturates

    saturates = host_u8s8_saturates()
    delegates = [options.delegate] + (["openvino"] if options.export_ir else [])
    exact_ort = saturates and any(name.startswith("onnxruntime") for name in delegates)
    # OpenVINO (oneDNN) has no exact mode: 8-bit weights saturate on such a CPU
    saturating = sorted({name for name in delegates if name == "openvino"}) if saturates and not options.reduce_range \
        else []
    facts = {"cpu_saturates_u8s8": saturates, "weight_bits": 7 if options.reduce_range else 8,
             "onnxruntime_exact_kernels": exact_ort, "saturating_delegates": saturating}
    notes = []
    if exact_ort:
        notes.append("this CPU (x86 without VNNI) saturates ONNX Runtime's fast U8S8 INT8 kernels: the onnxruntime "
                     "delegate runs its exact U8U8 ones here, about as slow as float; a CPU with VNNI, or ARM, "
                     "computes the same at INT8 speed")
    if saturating:
        notes.append("OpenVINO's INT8 kernels saturate on this CPU (x86 without VNNI) and have no exact mode: "
                     "its figures above are what such CPUs compute, where one with VNNI computes the ONNX "
                     "model's; --reduce-range (7-bit weights) avoids it, at some accuracy")
    if options.reduce_range:
        notes.append("7-bit weights (--reduce-range): exact on the fast INT8 kernels of x86 CPUs without VNNI, "
                     "coarser everywhere")
    return facts, notes


def float_nodes(model: Any, detector: bool) -> dict[str, str]:
    """The nodes of ``model`` (an ``onnx.ModelProto`` with named nodes) that INT8 quantisation leaves float,
    by name, with their op types, in graph order.

    Softmax is cheap in float, and an 8-bit softmax output (1/255 steps) only adds rounding that turns
    close calls into ties (float_outputs does the same for the logits feeding it). A detector's decode
    tail stays float too (decode_tail).
    """
    tail = set(decode_tail(model)) if detector else set()
    return {node.name: node.op_type for node in model.graph.node if node.op_type in FLOAT_OPS or node.name in tail}


def decode_tail(model: Any) -> list[str]:
    """The nodes between a detector's last learned layers and its outputs, in graph order.

    In a YOLO export that is the head's box decode: the per-scale outputs reshaped and concatenated, the
    DFL (a softmax over distance bins and a fixed Conv taking its expectation), the anchor arithmetic
    (Sub/Add/Div/Mul), the class Sigmoid and the final Concat of boxes (0-640 px) with scores (0-1). One
    8-bit scale over that Concat is 2.5 px a step: every score rounds to 0 or 2.5 and the boxes move, the
    collapse Ultralytics users report. Walks back from every output and stops at each learned layer
    (LEARNED_OPS), except a Conv fed by a Softmax: DFL's expectation is arithmetic, not a learned layer.
    """
    graph = model.graph
    producers = {out: node for node in graph.node for out in node.output}
    tail: set[str] = set()
    pending = [output.name for output in graph.output]
    while pending:
        node = producers.get(pending.pop())
        if node is None or node.name in tail:
            continue
        if node.op_type in LEARNED_OPS:
            feeder = producers.get(node.input[0])
            if feeder is None or feeder.op_type != "Softmax":
                continue
        tail.add(node.name)
        pending.extend(node.input)
    return [node.name for node in graph.node if node.name in tail]


def _calibration_reader(base: type, images: Sequence[Path], feeder: ImageFeeder, engine: Engine,
                        say: Progress) -> Any:
    """A CalibrationDataReader (``base``) that preprocesses one image per ``get_next()``."""
    import numpy as np

    input_name = feeder.spec.name
    shape = engine.input_view(0).shape
    dtype = engine.input_view(0).dtype

    class Reader(base):
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

    return Reader()


def _prepared_graph(source: Path, prepared: Path, notes: list[str], say: Progress) -> tuple[Path, Any]:
    """Run ORT's pre-pass and name nodes / lift the opset: the file to quantise and its loaded graph."""
    shape_inference = import_optional("onnxruntime.quantization.shape_inference", "onnx", "INT8 quantisation")
    say("quantising: preparing the graph (shape inference, graph optimisation)")
    try:
        with quiet_vendor_logging():
            shape_inference.quant_pre_process(str(source), str(prepared), skip_symbolic_shape=True)
        quant_input = prepared
    except Exception as exc:  # the pre-pass is an optimisation; quantise the model as it is
        notes.append(f"quantisation pre-processing skipped: {squashed(exc, 200)}")
        quant_input = source
    onnx = import_optional("onnx", "onnx", "INT8 quantisation")
    model = onnx.load(str(quant_input))
    if prepare_for_qdq(model, notes):
        onnx.save(model, str(prepared))
        quant_input = prepared
    return quant_input, model


def prepare_for_qdq(model: Any, notes: list[str]) -> bool:
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
                f"failed ({squashed(exc, 160)}) — re-export the model with opset >= {MIN_QDQ_OPSET}"
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
