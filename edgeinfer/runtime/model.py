"""Model file inspection: format by content, tensor specs, quantisation, sha256.

Nothing here needs a vendor runtime: .tflite is read by our own flatbuffer reader, ONNX by the
``onnx`` package when installed (else by our own protobuf reader, quantisation included), OpenVINO
IR by parsing its XML.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from enum import Enum
from functools import lru_cache
from pathlib import Path

from ..errors import FlatbufferError, ModelFormatError, ModelNotFound, UnsizedInput
from ..util.fs import sha256_file
from . import _onnx_schema, _tflite_schema
from .metadata import SIDECAR, ModelMetadata, read_metadata

EDGETPU_CUSTOM_OP = "edgetpu-custom-op"


class ModelFormat(str, Enum):
    """A model file format, detected from the file's bytes."""

    TFLITE = "tflite"
    EDGETPU_TFLITE = "edgetpu-tflite"
    ONNX = "onnx"
    OPENVINO_IR = "openvino-ir"
    TENSORRT_PLAN = "tensorrt-plan"


@dataclass(frozen=True)
class TensorSpec:
    """One model input or output: name, shape, dtype, layout and affine quantisation."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    layout: str | None = None
    scale: float | None = None
    zero_point: int | None = None

    @property
    def quantized(self) -> bool:
        return self.scale is not None and self.scale > 0

    def dequantize(self, values):  # numpy array in, float32 array out
        """Real values of ``values`` (quantised data is scaled, float data passes through)."""
        import numpy as np

        if not self.quantized:
            return np.asarray(values, dtype=np.float32)
        return (np.asarray(values, dtype=np.float32) - float(self.zero_point or 0)) * float(self.scale)


@dataclass(frozen=True)
class ModelInfo:
    """What ``edgeinfer info`` prints: everything knowable about a model without running it."""

    path: str
    format: ModelFormat
    size_bytes: int
    sha256: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    custom_ops: tuple[str, ...] = ()
    #: files packed into a .tflite by TFLite metadata (labels, vocabularies)
    associated_files: tuple[str, ...] = ()
    weights_path: str | None = None  # OpenVINO IR .bin
    notes: tuple[str, ...] = field(default=())
    #: what the model says about itself (task, class names, input size ...): runtime.metadata
    metadata: ModelMetadata = field(default_factory=ModelMetadata)

    @property
    def is_edgetpu(self) -> bool:
        return self.format is ModelFormat.EDGETPU_TFLITE

    def to_dict(self) -> dict:
        data = asdict(self)
        data["format"] = self.format.value
        data["metadata"] = self.metadata.to_dict()
        return data


def guess_layout(shape: tuple[int, ...]) -> str | None:
    """NHWC / NCHW for image-like 4-D tensors, NC for 2-D; None when it cannot be told."""
    if len(shape) == 4:
        channels_last, channels_first = shape[3] in (1, 3, 4), shape[1] in (1, 3, 4)
        if channels_last and not channels_first:
            return "NHWC"
        if channels_first and not channels_last:
            return "NCHW"
        return None
    if len(shape) == 2:
        return "NC"
    return None


# ---------------------------------------------------------------------------- format detection

_IMAGE_MAGIC = {b"\xff\xd8\xff": "a JPEG image", b"\x89PNG": "a PNG image", b"BM": "a BMP image"}


def _looks_like_onnx(path: Path, size: int) -> None:
    """Walk the top-level protobuf fields of ModelProto; raise ModelFormatError if they do not fit.

    ONNX has no magic number. A ModelProto is a sequence of (tag, value) records whose lengths
    must add up exactly to the file size, with ir_version (field 1) and graph (field 7) present.
    """
    seen: set[int] = set()
    with open(path, "rb") as fh:
        data = fh.read(min(size, 1 << 16))
        pos, offset = 0, 0  # pos within data, offset of data within file

        def varint() -> int:
            nonlocal pos
            try:
                value, pos = _onnx_schema.varint(data, pos, len(data))
            except ModelFormatError as exc:  # "truncated" is what detect_format tells a cut-short file by
                raise ModelFormatError("truncated" if "truncated" in str(exc) else "bad varint") from None
            return value

        while offset + pos < size:
            if pos > len(data) - 16 and offset + len(data) < size:  # refill the window
                fh.seek(offset + pos)
                offset += pos
                data, pos = fh.read(1 << 16), 0
            tag = varint()
            number, wire = tag >> 3, tag & 7
            if number == 0 or number > 64:
                raise ModelFormatError(f"field {number}")
            if wire == 0:
                varint()
            elif wire == 2:
                length = varint()
                absolute = offset + pos + length
                if absolute > size:
                    raise ModelFormatError("truncated")
                fh.seek(absolute)
                offset, pos = absolute, 0
                data = fh.read(1 << 16)
            elif wire in (1, 5):
                pos += 8 if wire == 1 else 4
            else:
                raise ModelFormatError(f"wire type {wire}")
            seen.add(number)
    if not {1, 7} <= seen:
        raise ModelFormatError("no ir_version/graph")


def detect_format(path: str | os.PathLike) -> ModelFormat:
    """Tell a model's format from its content (not its name); raise ModelFormatError if unknown."""
    path = Path(path)
    if not path.exists():
        raise ModelNotFound(f"model not found: {path} — check the path")
    if not path.is_file():
        raise ModelNotFound(f"model path is not a file: {path}")
    size = path.stat().st_size
    with open(path, "rb") as fh:
        head = fh.read(4096)
    if not head:
        raise ModelFormatError(f"{path} is empty (0 bytes) — the download or copy failed; fetch the model again")
    if head[4:8] == _tflite_schema.FILE_IDENTIFIER:
        return ModelFormat.TFLITE  # refined to EDGETPU_TFLITE after reading op codes
    stripped = head.lstrip(b"\xef\xbb\xbf \t\r\n")
    if stripped.startswith(b"<?xml") or stripped.startswith(b"<net"):
        if b"<net" in head:
            return ModelFormat.OPENVINO_IR
        raise ModelFormatError(f"{path} is an XML file but not an OpenVINO IR (no <net> element)")
    if b"ftrt" in head[:32] or b"ptrt" in head[:32]:
        return ModelFormat.TENSORRT_PLAN
    for magic, what in _IMAGE_MAGIC.items():
        if head.startswith(magic):
            raise ModelFormatError(f"{path} is {what}, not a model — pass the model first, then the images")
    try:
        _looks_like_onnx(path, size)
    except ModelFormatError as exc:
        if str(exc) == "truncated" and head[:1] == b"\x08":
            raise ModelFormatError(
                f"{path} looks like a truncated ONNX model (its records run past the end of the "
                f"{size}-byte file) — copy or download it again"
            ) from None
        raise ModelFormatError(
            f"{path} is not a model edgeinfer can read (expected .tflite, ONNX, OpenVINO IR .xml "
            "or a TensorRT plan)"
        ) from None
    return ModelFormat.ONNX


# ---------------------------------------------------------------------------- per-format specs

def _tflite_specs(path: Path) -> tuple[ModelFormat, tuple, tuple, tuple[str, ...], tuple[str, ...]]:
    try:
        raw = _tflite_schema.read_model(path.read_bytes())
    except FlatbufferError as exc:
        raise ModelFormatError(
            f"{path} is a corrupt or truncated .tflite ({exc}) — copy or download it again"
        ) from None

    def spec(t: _tflite_schema.RawTensor) -> TensorSpec:
        per_tensor = len(t.scales) == 1
        return TensorSpec(
            name=t.name, shape=t.shape, dtype=t.dtype, layout=guess_layout(t.shape),
            scale=float(t.scales[0]) if per_tensor and t.scales[0] > 0 else None,
            zero_point=int(t.zero_points[0]) if per_tensor and t.zero_points else None,
        )

    fmt = ModelFormat.EDGETPU_TFLITE if EDGETPU_CUSTOM_OP in raw.custom_ops else ModelFormat.TFLITE
    return fmt, tuple(map(spec, raw.inputs)), tuple(map(spec, raw.outputs)), raw.custom_ops, raw.associated_files


_ONNX_DTYPES = {1: "float32", 2: "uint8", 3: "int8", 4: "uint16", 5: "int16", 6: "int32",
                7: "int64", 9: "bool", 10: "float16", 11: "float64", 12: "uint32", 13: "uint64"}
_LAYOUT_OPS = {"Transpose", "Reshape", "Identity", "Squeeze", "Unsqueeze"}


def _onnx_specs(path: Path) -> tuple[tuple, tuple, dict[str, str]]:
    """Specs of an ONNX model, quantisation included: an integer input's scale and zero point are
    those of the DequantizeLinear it feeds, an output's those of the QuantizeLinear that makes it
    (through layout-only ops). The graph is read by the ``onnx`` package when installed, else by
    our own protobuf reader (_onnx_schema) — never from ONNX Runtime, whose session metadata has
    no quantisation."""
    graph = _onnx_schema.read_graph(path)
    consumers: dict[str, list[_onnx_schema.Node]] = {}
    for node in graph.nodes:
        for name in node.inputs:
            consumers.setdefault(name, []).append(node)
    producers = {out: node for node in graph.nodes for out in node.outputs}

    def affine(node: _onnx_schema.Node) -> tuple[float | None, int | None]:
        scale = graph.scalars.get(node.inputs[1]) if len(node.inputs) > 1 else None
        zp = graph.scalars.get(node.inputs[2], 0) if len(node.inputs) > 2 and node.inputs[2] else 0
        return (float(scale) if scale is not None else None), int(zp or 0)

    def input_quant(name: str) -> tuple[float | None, int | None]:
        # Follow layout-only ops (Transpose, ...) down to a DequantizeLinear.
        for _ in range(4):
            nodes = consumers.get(name, [])
            if len(nodes) != 1:
                return None, None
            node = nodes[0]
            if node.op_type == "DequantizeLinear":
                return affine(node)
            if node.op_type not in _LAYOUT_OPS:
                return None, None
            name = node.outputs[0]
        return None, None

    def output_quant(name: str) -> tuple[float | None, int | None]:
        for _ in range(4):
            node = producers.get(name)
            if node is None:
                return None, None
            if node.op_type == "QuantizeLinear":
                return affine(node)
            if node.op_type not in _LAYOUT_OPS:
                return None, None
            name = node.inputs[0]
        return None, None

    def spec(value: _onnx_schema.ValueInfo, quant) -> TensorSpec:
        dtype = _ONNX_DTYPES.get(value.elem_type, f"onnx-type-{value.elem_type}")
        scale, zero_point = quant(value.name) if dtype in ("uint8", "int8") else (None, None)
        return TensorSpec(value.name, value.dims, dtype, guess_layout(value.dims), scale, zero_point)

    inputs = tuple(spec(v, input_quant) for v in graph.inputs if v.name not in graph.initializers)
    outputs = tuple(spec(v, output_quant) for v in graph.outputs)
    return inputs, outputs, graph.metadata


_IR_DTYPES = {"f32": "float32", "f16": "float16", "u8": "uint8", "i8": "int8", "i32": "int32",
              "i64": "int64", "boolean": "bool", "f64": "float64"}


def _ir_specs(xml_path: Path) -> tuple[tuple, tuple, object]:
    import xml.etree.ElementTree as ET  # only OpenVINO IR needs an XML parser (0.5 MiB in the agent)

    try:
        root = ET.parse(xml_path).getroot()
    except ET.ParseError as exc:
        raise ModelFormatError(f"{xml_path} is a corrupt OpenVINO IR ({exc})") from None
    layers = root.find("layers")
    inputs, outputs = [], []
    for layer in layers if layers is not None else ():
        kind = layer.get("type")
        if kind == "Parameter":
            data = layer.find("data")
            shape_text = data.get("shape", "") if data is not None else ""
            shape = tuple(int(d) if d.lstrip("-").isdigit() else -1 for d in shape_text.split(",") if d)
            dtype = _IR_DTYPES.get(data.get("element_type", "") if data is not None else "", "unknown")
            inputs.append(TensorSpec(layer.get("name", ""), shape, dtype, guess_layout(shape)))
        elif kind == "Result":
            port = layer.find("input/port")
            dims = tuple(int(d.text) if d.text and d.text.isdigit() else -1
                         for d in (port.findall("dim") if port is not None else ()))
            precision = (port.get("precision", "") if port is not None else "").lower()
            dtype = {"fp32": "float32", "fp16": "float16", "u8": "uint8", "i64": "int64",
                     "i32": "int32"}.get(precision, "unknown")
            outputs.append(TensorSpec(layer.get("name", ""), dims, dtype, guess_layout(dims)))
    return tuple(inputs), tuple(outputs), root


@lru_cache(maxsize=64)
def _inspect_cached(path: str, mtime_ns: int, size: int, siblings: tuple) -> ModelInfo:
    model_path = Path(path)
    fmt = detect_format(model_path)
    custom_ops: tuple[str, ...] = ()
    associated: tuple[str, ...] = ()
    weights: str | None = None
    notes: list[str] = []
    onnx_props: dict[str, str] = {}
    xml_root = None
    if fmt is ModelFormat.TFLITE:
        fmt, inputs, outputs, custom_ops, associated = _tflite_specs(model_path)
    elif fmt is ModelFormat.ONNX:
        inputs, outputs, onnx_props = _onnx_specs(model_path)
        notes += [f"output {s.name!r} is {s.dtype} with no QuantizeLinear scale in the graph: its values are "
                  "raw integers (a classifier reads uint8 steps as shares of their sum)" for s in outputs
                  if s.dtype in ("uint8", "int8")
                  and not s.quantized]
    elif fmt is ModelFormat.OPENVINO_IR:
        bin_path = model_path.with_suffix(".bin")
        if not bin_path.is_file():
            raise ModelFormatError(
                f"OpenVINO IR {model_path} has no weights file {bin_path.name} beside it — copy both files"
            )
        weights = str(bin_path)
        inputs, outputs, xml_root = _ir_specs(model_path)
    else:
        inputs, outputs = (), ()
        notes.append("tensor specs of a TensorRT plan need TensorRT installed (delegate 'tensorrt')")
    digest = sha256_file(model_path, *([weights] if weights else []))
    metadata = read_metadata(model_path, fmt.value, onnx_props=onnx_props, xml_root=xml_root)
    inputs = _sized_inputs(inputs, metadata, notes)
    return ModelInfo(
        path=str(model_path), format=fmt, size_bytes=size, sha256=digest, inputs=inputs,
        outputs=outputs, custom_ops=custom_ops, associated_files=associated, weights_path=weights,
        notes=tuple(notes) + metadata.notes, metadata=metadata,
    )


def image_axes(shape: tuple[int, ...]) -> tuple[int, int] | None:
    """The (height, width) axes of a 4-D image tensor, told by where its channels (1, 3 or 4) are; None when
    it is not one or cannot be told (every dimension dynamic)."""
    if len(shape) != 4:
        return None
    if shape[1] in (1, 3, 4) and shape[3] not in (1, 3, 4):
        return 2, 3
    if shape[3] in (1, 3, 4) and shape[1] not in (1, 3, 4):
        return 1, 2
    return None


def _unsized_axes(spec: TensorSpec) -> tuple[int, int] | None:
    """The image axes of ``spec`` when its height or width is unknown (-1), else None."""
    axes = image_axes(spec.shape)
    return axes if axes is not None and any(spec.shape[i] < 0 for i in axes) else None


def unsized_inputs(inputs: tuple[TensorSpec, ...]) -> tuple[TensorSpec, ...]:
    """The image inputs whose height or width is still unknown (-1): dynamic, and no metadata sized them."""
    return tuple(spec for spec in inputs if _unsized_axes(spec) is not None)


def _unsized_words(spec: TensorSpec) -> str:
    shape = "x".join(str(d) if d > 0 else "?" for d in spec.shape)
    return (f"input {spec.name!r} has a dynamic image size ({shape}) and neither the model nor a "
            f"{SIDECAR} beside it states a size")


UNSIZED_FIX = (f"export the model with a fixed input size (Ultralytics: imgsz=640 without dynamic=True), or put a "
               f"{SIDECAR} with 'imgsz: [height, width]' beside it")


def require_sized_inputs(model: ModelInfo) -> None:
    """Raise UnsizedInput when an image input of ``model`` has no size: an engine's buffers, and the frames a
    pipeline resizes into them, need one."""
    unsized = unsized_inputs(model.inputs)
    if unsized:
        raise UnsizedInput(f"{model.path}: {_unsized_words(unsized[0])} — {UNSIZED_FIX}", unsized[0].name)


def _sized_inputs(inputs: tuple[TensorSpec, ...], metadata: ModelMetadata, notes: list[str]) -> tuple[TensorSpec, ...]:
    """A dynamic image input (height and width unknown: -1) given the size the model's metadata states."""
    sized = []
    for spec in inputs:
        axes = _unsized_axes(spec)
        if axes is not None and metadata.imgsz:
            shape = list(spec.shape)
            for axis, size in zip(axes, metadata.imgsz):
                shape[axis] = shape[axis] if shape[axis] > 0 else size
            shape[0] = shape[0] if shape[0] > 0 else 1
            notes.append(f"input {spec.name!r} has a dynamic size; {metadata.imgsz[0]}x{metadata.imgsz[1]} "
                         f"(height x width) from the model's metadata ({metadata.source})")
            spec = TensorSpec(spec.name, tuple(shape), spec.dtype, "NCHW" if axes == (2, 3) else "NHWC",
                              spec.scale, spec.zero_point)
        elif axes is not None:
            notes.append(f"{_unsized_words(spec)}: loading it fails — {UNSIZED_FIX}")
        sized.append(spec)
    return tuple(sized)


def inspect_model(path: str | os.PathLike) -> ModelInfo:
    """Inspect a model file: format, tensor specs, custom ops, sha256. Cached per (path, mtime)."""
    model_path = Path(path)
    try:
        stat = model_path.stat()
    except FileNotFoundError:
        raise ModelNotFound(f"model not found: {model_path} — check the path") from None
    if not model_path.is_file():
        raise ModelNotFound(f"model path is not a file: {model_path}")
    # an IR's weights are part of its identity, and what a metadata.yaml beside it says part of its reading
    siblings = (_stamp(model_path.with_suffix(".bin")), _stamp(model_path.parent / SIDECAR))
    return _inspect_cached(str(model_path.resolve()), stat.st_mtime_ns, stat.st_size, siblings)


def _stamp(path: Path) -> tuple[int, ...]:
    """(mtime, size) of a file beside a model, () when there is none."""
    try:
        stat = path.stat()
    except OSError:
        return ()
    return (stat.st_mtime_ns, stat.st_size) if path.is_file() else ()
