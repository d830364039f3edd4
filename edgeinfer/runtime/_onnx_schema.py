"""A bounds-checked reader for the few parts of an ONNX ModelProto that inspection needs.

Quantised ONNX models carry their inputs' and outputs' scale and zero point only in the graph: in
the DequantizeLinear after an input and the QuantizeLinear before an output, as one-element
initializers. ONNX Runtime's session metadata does not expose them, and the ``onnx`` package is
optional (``pip install onnxruntime`` alone is a working install), so without it this reader
walks the protobuf wire format itself: graph inputs and outputs (name, element type, shape), the
nodes (op type, input and output names) and every one-element initializer or Constant value.

Field numbers follow onnx/onnx.proto, which never renumbers a field (protobuf compatibility).
With ``onnx`` installed, :func:`read_graph` uses it instead; both give the same :class:`OnnxGraph`
(a test checks that on every shared model).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ModelFormatError

#: TensorProto.DataType -> struct format of one element in raw_data (little-endian)
_RAW_FORMATS = {1: "<f", 2: "<B", 3: "<b", 4: "<H", 5: "<h", 6: "<i", 7: "<q", 9: "<?", 10: "<e",
                11: "<d", 12: "<I", 13: "<Q"}
_INT32_DATA_TYPES = {2, 3, 4, 5, 6, 9}  # carried in int32_data when not in raw_data
_EXTERNAL = 1  # TensorProto.DataLocation.EXTERNAL


@dataclass(frozen=True)
class ValueInfo:
    """A graph input or output: name, TensorProto element type, dims (-1 where not a fixed size)."""

    name: str
    elem_type: int
    dims: tuple[int, ...]


@dataclass(frozen=True)
class Node:
    op_type: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]


@dataclass(frozen=True)
class OnnxGraph:
    """The main graph as inspection sees it."""

    inputs: tuple[ValueInfo, ...]
    outputs: tuple[ValueInfo, ...]
    nodes: tuple[Node, ...]
    initializers: frozenset[str]
    #: one-element initializers and Constant outputs: name -> value
    scalars: dict[str, float | int | bool] = field(default_factory=dict)
    #: the model's ``metadata_props`` (what an exporter says of the model: Ultralytics' task, names, imgsz ...)
    metadata: dict[str, str] = field(default_factory=dict)


def varint(buf: bytes, pos: int, end: int) -> tuple[int, int]:
    """The protobuf varint at ``buf[pos]`` and the position after it (ModelFormatError "truncated varint"
    past ``end``, "varint too long" beyond 64 bits)."""
    result, shift = 0, 0
    while True:
        if pos >= end:
            raise ModelFormatError("truncated varint")
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise ModelFormatError("varint too long")


def _fields(buf: bytes, start: int, end: int) -> Iterator[tuple[int, int, int, int]]:
    """(field number, wire type, a, b) of each field of the message in ``buf[start:end]``: a varint's
    value in ``a``; for length-delimited and fixed-size fields, the value's bytes are ``buf[a:b]``."""
    pos = start
    while pos < end:
        tag, pos = varint(buf, pos, end)
        number, wire = tag >> 3, tag & 7
        if wire == 0:
            value, pos = varint(buf, pos, end)
            yield number, wire, value, 0
            continue
        if wire == 2:
            size, pos = varint(buf, pos, end)
        elif wire in (1, 5):
            size = 8 if wire == 1 else 4
        else:
            raise ModelFormatError(f"wire type {wire} in field {number}")
        if pos + size > end:
            raise ModelFormatError(f"field {number} runs past the end of its message")
        yield number, wire, pos, pos + size
        pos += size


def _signed(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def _varints(buf: bytes, number_wire_a_b: tuple[int, int, int, int]) -> list[int]:
    """The values of a repeated varint field's record: one unpacked value, or a packed run."""
    _number, wire, a, b = number_wire_a_b
    if wire == 0:
        return [a]
    values, pos = [], a
    while pos < b:
        value, pos = varint(buf, pos, b)
        values.append(value)
    return values


def _string(buf: bytes, a: int, b: int) -> str:
    return bytes(buf[a:b]).decode("utf-8", errors="replace")


def _tensor(buf: bytes, start: int, end: int) -> tuple[str, float | int | bool | None]:
    """A TensorProto's name and, when it holds exactly one element stored inline, that element."""
    dims: list[int] = []
    data_type, name, location = 0, "", 0
    raw: bytes | None = None
    typed: dict[int, list] = {}
    for record in _fields(buf, start, end):
        number, wire, a, b = record
        if number == 1:
            dims += _varints(buf, record)
        elif number == 2 and wire == 0:
            data_type = a
        elif number == 8 and wire == 2:
            name = _string(buf, a, b)
        elif number == 9 and wire == 2:
            raw = bytes(buf[a:b]) if b - a <= 8 else b""  # one element is at most 8 bytes
        elif number == 14 and wire == 0:
            location = a
        elif number in (4, 10) and wire != 0:  # float_data (fixed32), double_data (fixed64), packed or not
            fmt = "<f" if number == 4 else "<d"
            typed.setdefault(number, []).extend(x for (x,) in struct.iter_unpack(fmt, bytes(buf[a:b])))
        elif number in (5, 7, 11):  # int32_data, int64_data, uint64_data: varints, packed or not
            typed.setdefault(number, []).extend(_varints(buf, record))
    count = 1
    for d in dims:
        count *= d
    if count != 1 or location == _EXTERNAL:
        return name, None
    return name, _element(data_type, raw, typed)


def _element(data_type: int, raw: bytes | None, typed: dict[int, list]) -> float | int | bool | None:
    fmt = _RAW_FORMATS.get(data_type)
    if raw is not None:
        if fmt is None or len(raw) != struct.calcsize(fmt):
            return None
        return struct.unpack(fmt, raw)[0]
    if data_type == 1 and len(typed.get(4, ())) == 1:
        return typed[4][0]
    if data_type == 11 and len(typed.get(10, ())) == 1:
        return typed[10][0]
    if data_type == 10 and len(typed.get(5, ())) == 1:  # float16 bits in int32_data
        return struct.unpack("<e", struct.pack("<H", typed[5][0] & 0xFFFF))[0]
    if data_type in _INT32_DATA_TYPES and len(typed.get(5, ())) == 1:
        value = _signed(typed[5][0])
        return bool(value) if data_type == 9 else value
    if data_type == 7 and len(typed.get(7, ())) == 1:
        return _signed(typed[7][0])
    if data_type in (12, 13) and len(typed.get(11, ())) == 1:
        return typed[11][0]
    return None


def _value_info(buf: bytes, start: int, end: int) -> ValueInfo:
    """ValueInfoProto: name (1), type (2) -> TypeProto.tensor_type (1) -> elem_type (1), shape (2) -> dim (1)."""
    name, elem_type, dims = "", 0, []
    for number, wire, a, b in _fields(buf, start, end):
        if number == 1 and wire == 2:
            name = _string(buf, a, b)
        elif number == 2 and wire == 2:
            for t_number, t_wire, t_a, t_b in _fields(buf, a, b):
                if t_number != 1 or t_wire != 2:  # sequence, map, optional types: no tensor type
                    continue
                for k_number, k_wire, k_a, k_b in _fields(buf, t_a, t_b):
                    if k_number == 1 and k_wire == 0:
                        elem_type = k_a
                    elif k_number == 2 and k_wire == 2:
                        dims += [_dimension(buf, d_a, d_b)
                                 for d_number, d_wire, d_a, d_b in _fields(buf, k_a, k_b)
                                 if d_number == 1 and d_wire == 2]
    return ValueInfo(name, elem_type, tuple(dims))


def _dimension(buf: bytes, start: int, end: int) -> int:
    """Dimension: dim_value (1) when fixed; a dim_param (2) or nothing is -1."""
    for number, wire, a, _b in _fields(buf, start, end):
        if number == 1 and wire == 0:
            value = _signed(a)
            return value if value > 0 else -1
    return -1


def _node(buf: bytes, start: int, end: int, scalars: dict) -> Node:
    """NodeProto: input (1), output (2), op_type (4), attribute (5)."""
    inputs, outputs, op_type, constant = [], [], "", None
    for number, wire, a, b in _fields(buf, start, end):
        if wire != 2:
            continue
        if number == 1:
            inputs.append(_string(buf, a, b))
        elif number == 2:
            outputs.append(_string(buf, a, b))
        elif number == 4:
            op_type = _string(buf, a, b)
        elif number == 5:
            constant = _constant_attribute(buf, a, b, constant)
    if op_type == "Constant" and outputs and constant is not None:
        scalars[outputs[0]] = constant
    return Node(op_type, tuple(inputs), tuple(outputs))


def _constant_attribute(buf: bytes, start: int, end: int,
                        found: float | int | bool | None) -> float | int | bool | None:
    """A Constant's scalar: AttributeProto name (1) ``value`` -> t (5), ``value_float`` -> f (2),
    ``value_int`` -> i (3); another attribute leaves ``found`` as it was."""
    name, values = "", {}
    for number, wire, a, b in _fields(buf, start, end):
        if number == 1 and wire == 2:
            name = _string(buf, a, b)
        elif number == 2 and wire == 5:
            values["value_float"] = struct.unpack_from("<f", buf, a)[0]
        elif number == 3 and wire == 0:
            values["value_int"] = _signed(a)
        elif number == 5 and wire == 2:
            values["value"] = _tensor(buf, a, b)[1]
    return values.get(name, found)


def parse_model(data: bytes) -> OnnxGraph:
    """The main graph of a serialised ModelProto (graph: field 7); raise ModelFormatError if malformed.

    GraphProto: node (1), initializer (5), input (11), output (12); ModelProto's metadata_props (14) are
    StringStringEntryProto records: key (1), value (2).
    """
    try:
        graph = None
        metadata: dict[str, str] = {}
        for number, wire, a, b in _fields(data, 0, len(data)):
            if number == 7 and wire == 2:
                graph = (a, b)
            elif number == 14 and wire == 2:
                entry = {n: _string(data, ea, eb) for n, w, ea, eb in _fields(data, a, b) if w == 2}
                if 1 in entry:
                    metadata[entry[1]] = entry.get(2, "")
        if graph is None:
            raise ModelFormatError("no graph")
        nodes, inputs, outputs, initializers, scalars = [], [], [], set(), {}
        for number, wire, a, b in _fields(data, *graph):
            if wire != 2:
                continue
            if number == 1:
                nodes.append(_node(data, a, b, scalars))
            elif number == 5:
                name, scalar = _tensor(data, a, b)
                initializers.add(name)
                if scalar is not None:
                    scalars[name] = scalar
            elif number == 11:
                inputs.append(_value_info(data, a, b))
            elif number == 12:
                outputs.append(_value_info(data, a, b))
    except struct.error as exc:
        raise ModelFormatError(f"corrupt ONNX protobuf: {exc}") from None
    return OnnxGraph(tuple(inputs), tuple(outputs), tuple(nodes), frozenset(initializers), scalars, metadata)


def graph_from_onnx(model: Any) -> OnnxGraph:
    """The same :class:`OnnxGraph` from an ``onnx.ModelProto`` (the ``onnx`` package's reading)."""
    from onnx import TensorProto, numpy_helper

    def scalar(tensor) -> float | int | bool | None:
        count = 1
        for d in tensor.dims:
            count *= d
        if count != 1 or tensor.data_location == TensorProto.EXTERNAL:
            return None
        return numpy_helper.to_array(tensor).item()

    def info(value) -> ValueInfo:
        tensor_type = value.type.tensor_type
        dims = tuple(d.dim_value if d.dim_value > 0 else -1 for d in tensor_type.shape.dim)
        return ValueInfo(value.name, tensor_type.elem_type, dims)

    graph = model.graph
    scalars: dict[str, float | int | bool] = {}
    for tensor in graph.initializer:
        value = scalar(tensor)
        if value is not None:
            scalars[tensor.name] = value
    for node in graph.node:
        if node.op_type != "Constant" or not node.output:
            continue
        value = None
        for attribute in node.attribute:
            if attribute.name == "value":
                value = scalar(attribute.t)
            elif attribute.name == "value_float":
                value = attribute.f
            elif attribute.name == "value_int":
                value = attribute.i
        if value is not None:
            scalars[node.output[0]] = value
    nodes = tuple(Node(n.op_type, tuple(n.input), tuple(n.output)) for n in graph.node)
    return OnnxGraph(tuple(map(info, graph.input)), tuple(map(info, graph.output)), nodes,
                     frozenset(t.name for t in graph.initializer), scalars,
                     {entry.key: entry.value for entry in model.metadata_props})


def read_graph(path: Path) -> OnnxGraph:
    """The graph of the ONNX model at ``path``: by the ``onnx`` package when installed, else our reader."""
    try:
        import onnx
    except ImportError:
        onnx = None
    if onnx is None:
        try:
            return parse_model(path.read_bytes())
        except ModelFormatError as exc:
            raise ModelFormatError(f"{path} is a corrupt ONNX model ({exc}) — copy or download it again") from None
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # protobuf DecodeError and friends
        raise ModelFormatError(f"{path} is a corrupt ONNX model ({exc}) — copy or download it again") from None
    return graph_from_onnx(model)
