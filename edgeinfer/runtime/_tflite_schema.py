"""A bounds-checked reader for the few parts of the TFLite flatbuffer schema inspection needs.

Reading the file ourselves lets ``edgeinfer info`` describe any .tflite (Edge TPU ones included)
without a runtime installed, and tells a truncated file from a valid one: every offset is checked
against the file size, so a cut file raises :class:`FlatbufferError` instead of reading garbage.
Field numbers follow tensorflow/lite/schema/schema.fbs.
"""

from __future__ import annotations

import io
import struct
import zipfile
from dataclasses import dataclass

from ..errors import FlatbufferError

FILE_IDENTIFIER = b"TFL3"

# TensorType enum -> numpy dtype name.
TENSOR_TYPES = {
    0: "float32", 1: "float16", 2: "int32", 3: "uint8", 4: "int64", 5: "object", 6: "bool",
    7: "int16", 8: "complex64", 9: "int8", 10: "float64", 11: "complex128", 12: "uint64",
    14: "uint32", 15: "uint16", 17: "int4",
}


@dataclass(frozen=True)
class RawTensor:
    name: str
    shape: tuple[int, ...]
    dtype: str
    scales: tuple[float, ...]
    zero_points: tuple[int, ...]


@dataclass(frozen=True)
class RawModel:
    inputs: tuple[RawTensor, ...]
    outputs: tuple[RawTensor, ...]
    custom_ops: tuple[str, ...]
    description: str
    associated_files: tuple[str, ...] = ()


class _Reader:
    def __init__(self, buf: bytes) -> None:
        self.buf = buf
        self.extent = 0  # the furthest byte any object reached

    def _need(self, pos: int, size: int) -> None:
        if pos < 0 or pos + size > len(self.buf):
            raise FlatbufferError(f"truncated: offset {pos}+{size} lies outside the {len(self.buf)}-byte file")
        self.extent = max(self.extent, pos + size)

    def u8(self, pos: int) -> int:
        self._need(pos, 1)
        return self.buf[pos]

    def u16(self, pos: int) -> int:
        self._need(pos, 2)
        return struct.unpack_from("<H", self.buf, pos)[0]

    def i32(self, pos: int) -> int:
        self._need(pos, 4)
        return struct.unpack_from("<i", self.buf, pos)[0]

    def u32(self, pos: int) -> int:
        self._need(pos, 4)
        return struct.unpack_from("<I", self.buf, pos)[0]

    def u64(self, pos: int) -> int:
        self._need(pos, 8)
        return struct.unpack_from("<Q", self.buf, pos)[0]

    def field(self, table: int, index: int) -> int | None:
        """Absolute position of field ``index`` of the table at ``table``, or None if absent."""
        vtable = table - self.i32(table)
        vtable_size = self.u16(vtable)
        slot = 4 + 2 * index
        if slot + 2 > vtable_size:
            return None
        offset = self.u16(vtable + slot)
        return table + offset if offset else None

    def indirect(self, pos: int) -> int:
        return pos + self.u32(pos)

    def table(self, table: int, index: int) -> int | None:
        pos = self.field(table, index)
        return None if pos is None else self.indirect(pos)

    def vector(self, table: int, index: int) -> tuple[int, int]:
        """(start, length) of a vector field; (0, 0) when absent."""
        pos = self.field(table, index)
        if pos is None:
            return 0, 0
        vec = self.indirect(pos)
        length = self.u32(vec)
        return vec + 4, length

    def vector_bytes(self, table: int, index: int, element_size: int) -> tuple[int, int]:
        start, length = self.vector(table, index)
        self._need(start, length * element_size)
        return start, length

    def string(self, table: int, index: int) -> str:
        start, length = self.vector_bytes(table, index, 1)
        return self.buf[start : start + length].decode("utf-8", errors="replace")

    def ints(self, table: int, index: int) -> tuple[int, ...]:
        start, length = self.vector_bytes(table, index, 4)
        return struct.unpack_from(f"<{length}i", self.buf, start) if length else ()

    def tables(self, table: int, index: int) -> list[int]:
        start, length = self.vector_bytes(table, index, 4)
        return [self.indirect(start + 4 * i) for i in range(length)]


def _tensor(r: _Reader, tensor: int) -> RawTensor:
    type_pos = r.field(tensor, 1)
    type_code = r.u8(type_pos) if type_pos is not None else 0
    scales: tuple[float, ...] = ()
    zero_points: tuple[int, ...] = ()
    quant = r.table(tensor, 4)
    if quant is not None:
        r.vector_bytes(quant, 0, 4)  # min
        r.vector_bytes(quant, 1, 4)  # max
        start, length = r.vector_bytes(quant, 2, 4)
        scales = struct.unpack_from(f"<{length}f", r.buf, start) if length else ()
        start, length = r.vector_bytes(quant, 3, 8)
        zero_points = struct.unpack_from(f"<{length}q", r.buf, start) if length else ()
    return RawTensor(
        name=r.string(tensor, 3),
        shape=tuple(r.ints(tensor, 0)),
        dtype=TENSOR_TYPES.get(type_code, f"tflite-type-{type_code}"),
        scales=tuple(scales),
        zero_points=tuple(zero_points),
    )


def _check_complete(r: _Reader, model: int) -> None:
    """Walk every tensor, operator, buffer and metadata entry so a truncated file cannot pass.

    Flatbuffers are written back to front, so the end of a file holds the first-serialised
    objects (strings, operator vectors, tensor tables): each must lie inside the file.
    """
    for graph in r.tables(model, 2):
        for tensor in r.tables(graph, 0):
            _tensor(r, tensor)
        for operator in r.tables(graph, 3):
            r.ints(operator, 1)
            r.ints(operator, 2)
            options = r.field(operator, 4)
            if options is not None:
                r.u32(options)
                r.indirect(options)
            r.vector_bytes(operator, 5, 1)  # custom_options
        r.string(graph, 4)
    r.string(model, 3)  # description
    r.ints(model, 5)  # metadata_buffer
    for code in r.tables(model, 1):
        r.string(code, 1)
    for metadata in r.tables(model, 6):
        r.string(metadata, 0)
    for signature in r.tables(model, 7):
        for io_index in (0, 1):
            for entry in r.tables(signature, io_index):
                r.string(entry, 0)
        r.string(signature, 2)
    for buffer in r.tables(model, 4):
        r.vector_bytes(buffer, 0, 1)
        offset_pos, size_pos = r.field(buffer, 1), r.field(buffer, 2)
        if offset_pos is not None and size_pos is not None:
            offset, size = r.u64(offset_pos), r.u64(size_pos)
            if offset > 1:  # 0/1 are sentinels for "no external data"
                r._need(offset, size)


def _associated_files(buf: bytes, extent: int) -> tuple[str, ...]:
    """Names in the zip that TFLite metadata appends after the flatbuffer (labels, vocabularies).

    A cut archive means a cut download, so it is reported as truncation.
    """
    start = buf.find(b"PK\x03\x04", extent)
    if start < 0:
        return ()
    try:
        with zipfile.ZipFile(io.BytesIO(buf[start:])) as archive:
            return tuple(archive.namelist())
    except zipfile.BadZipFile as exc:
        raise FlatbufferError(f"truncated: the metadata archive appended to the model is cut ({exc})") from None


def read_model(buf: bytes) -> RawModel:
    """Parse the first subgraph's inputs/outputs and the custom operator codes of a .tflite."""
    if len(buf) < 8 or buf[4:8] != FILE_IDENTIFIER:
        raise FlatbufferError("missing the TFL3 file identifier")
    r = _Reader(buf)
    model = r.indirect(0)
    subgraphs = r.tables(model, 2)
    if not subgraphs:
        raise FlatbufferError("the model has no subgraph")
    graph = subgraphs[0]
    tensors = r.tables(graph, 0)

    def pick(indices: tuple[int, ...]) -> tuple[RawTensor, ...]:
        try:
            return tuple(_tensor(r, tensors[i]) for i in indices)
        except IndexError as exc:
            raise FlatbufferError("a graph input/output names a tensor that does not exist") from exc

    custom_ops = []
    for code in r.tables(model, 1):
        name = r.string(code, 1)
        if name:
            custom_ops.append(name)
    _check_complete(r, model)
    return RawModel(
        associated_files=_associated_files(buf, r.extent),
        inputs=pick(r.ints(graph, 1)),
        outputs=pick(r.ints(graph, 2)),
        custom_ops=tuple(custom_ops),
        description=r.string(model, 3),
    )
