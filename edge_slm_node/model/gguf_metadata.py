"""Read the key/value metadata section of a GGUF file into plain Python values.

GGUF layout (https://github.com/ggml-org/ggml/blob/master/docs/gguf.md):
    magic "GGUF" (u32) | version (u32) | tensor_count (u64) | kv_count (u64)
    kv_count x [key: string | value_type: u32 | value]
    tensor_count x [tensor info]  <- ``GGUFHeader.tensor_info_offset`` points here
    padding to ``general.alignment`` | tensor data
A string is a u64 byte length followed by UTF-8 bytes; an array is an element type (u32),
a u64 count and the elements (arrays may nest).

``gguf.GGUFReader`` builds a numpy view per string part and takes seconds on a 49152-token
vocabulary; this parser walks only the metadata section of a memory map and needs tens of
milliseconds. ``metadata_from_reader`` gives the same dict for code that already holds a
``GGUFReader``.

Value conversion: integers -> int, floats -> float, bool -> bool, string -> str, array ->
list (numeric arrays via numpy ``tolist``). Strings that are not valid UTF-8 are decoded with
``surrogateescape`` so ``value.encode("utf-8", "surrogateescape")`` restores the exact bytes.
"""
from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass, field
from typing import Any, Union

import numpy as np
from gguf.constants import GGUF_MAGIC, GGUFValueType

MetadataValue = Union[int, float, bool, str, list]

# scalar value type -> (struct code, byte size)
_SCALAR_FORMATS: dict[GGUFValueType, tuple[str, int]] = {
    GGUFValueType.UINT8: ("B", 1),
    GGUFValueType.INT8: ("b", 1),
    GGUFValueType.UINT16: ("H", 2),
    GGUFValueType.INT16: ("h", 2),
    GGUFValueType.UINT32: ("I", 4),
    GGUFValueType.INT32: ("i", 4),
    GGUFValueType.FLOAT32: ("f", 4),
    GGUFValueType.BOOL: ("?", 1),
    GGUFValueType.UINT64: ("Q", 8),
    GGUFValueType.INT64: ("q", 8),
    GGUFValueType.FLOAT64: ("d", 8),
}
_SUPPORTED_VERSIONS = (2, 3)


@dataclass(frozen=True)
class GGUFHeader:
    version: int
    tensor_count: int
    metadata: dict[str, MetadataValue]
    # key -> value type; for arrays (ARRAY, element type)
    value_types: dict[str, tuple[GGUFValueType, ...]] = field(repr=False)
    byte_order: str  # "<" little endian or ">" big endian (struct/numpy prefix)
    tensor_info_offset: int  # byte offset of the first tensor info record


class _Cursor:
    """Bounds-checked little/big-endian reader over a buffer."""

    def __init__(self, buffer, byte_order: str) -> None:
        self.buffer = buffer
        self.size = len(buffer)
        self.offset = 0
        self.byte_order = byte_order
        self._u64 = struct.Struct(byte_order + "Q")

    def need(self, num_bytes: int, what: str) -> None:
        if num_bytes < 0 or self.offset + num_bytes > self.size:
            raise ValueError(
                f"GGUF truncated or corrupt: {what} needs {num_bytes} bytes at offset "
                f"{self.offset}, file has {self.size} bytes"
            )

    def scalar(self, code: str, size: int, what: str):
        self.need(size, what)
        (value,) = struct.unpack_from(self.byte_order + code, self.buffer, self.offset)
        self.offset += size
        return value

    def string(self, what: str) -> str:
        self.need(8, what)
        (length,) = self._u64.unpack_from(self.buffer, self.offset)
        self.offset += 8
        self.need(length, what)
        raw = bytes(self.buffer[self.offset:self.offset + length])
        self.offset += length
        return raw.decode("utf-8", "surrogateescape")

    def string_array(self, count: int, key: str) -> list[str]:
        # hot loop (49152 vocabulary strings): no per-item checks beyond one bound test
        buffer, offset, size, unpack_u64 = self.buffer, self.offset, self.size, self._u64.unpack_from
        strings = []
        append = strings.append
        for index in range(count):
            if offset + 8 > size:
                self.offset = offset
                self.need(8, f"length of element {index} of {key!r}")
            (length,) = unpack_u64(buffer, offset)
            offset += 8
            end = offset + length
            if end > size:
                self.offset = offset
                self.need(length, f"element {index} of {key!r}")
            append(str(buffer[offset:end], "utf-8", "surrogateescape"))
            offset = end
        self.offset = offset
        return strings

    def value_type(self, what: str) -> GGUFValueType:
        raw = self.scalar("I", 4, what)
        try:
            return GGUFValueType(raw)
        except ValueError:
            raise ValueError(f"GGUF {what}: unknown value type {raw} at offset {self.offset - 4}") from None


def _read_value(cursor: _Cursor, value_type: GGUFValueType, key: str) -> tuple[MetadataValue, tuple]:
    if value_type == GGUFValueType.STRING:
        return cursor.string(f"string value of {key!r}"), (value_type,)
    if value_type != GGUFValueType.ARRAY:
        code, size = _SCALAR_FORMATS[value_type]
        return cursor.scalar(code, size, f"value of {key!r}"), (value_type,)
    element_type = cursor.value_type(f"array element type of {key!r}")
    count = cursor.scalar("Q", 8, f"array length of {key!r}")
    if element_type == GGUFValueType.STRING:
        return cursor.string_array(count, key), (value_type, element_type)
    if element_type == GGUFValueType.ARRAY:
        items = []
        inner_types: tuple = (element_type,)
        for _ in range(count):
            item, inner_types = _read_value(cursor, element_type, key)
            items.append(item)
        return items, (value_type,) + inner_types
    code, size = _SCALAR_FORMATS[element_type]
    cursor.need(count * size, f"{count} elements of {key!r}")
    dtype = np.dtype(code).newbyteorder(cursor.byte_order)
    array = np.frombuffer(cursor.buffer, dtype=dtype, count=count, offset=cursor.offset)
    cursor.offset += count * size
    return array.tolist(), (value_type, element_type)


def parse_header(buffer) -> GGUFHeader:
    """Parse magic, counts and all metadata from a bytes-like object holding a GGUF file."""
    if len(buffer) < 4 or struct.unpack_from("<I", buffer, 0)[0] != GGUF_MAGIC:
        raise ValueError(f"not a GGUF file: first bytes are {bytes(buffer[:4])!r}, expected b'GGUF'")
    (version,) = struct.unpack_from("<I", buffer, 4) if len(buffer) >= 8 else (None,)
    byte_order = "<"
    if version is not None and version & 0xFFFF == 0:  # written on a big-endian host
        byte_order, version = ">", struct.unpack_from(">I", buffer, 4)[0]
    if version not in _SUPPORTED_VERSIONS:
        raise ValueError(f"unsupported GGUF version {version}, supported: {_SUPPORTED_VERSIONS}")
    cursor = _Cursor(buffer, byte_order)
    cursor.offset = 8
    tensor_count = cursor.scalar("Q", 8, "tensor count")
    kv_count = cursor.scalar("Q", 8, "metadata count")
    metadata: dict[str, MetadataValue] = {}
    value_types: dict[str, tuple] = {}
    for index in range(kv_count):
        key = cursor.string(f"key of metadata entry {index}")
        value_type = cursor.value_type(f"type of {key!r}")
        metadata[key], value_types[key] = _read_value(cursor, value_type, key)
    return GGUFHeader(version, tensor_count, metadata, value_types, byte_order, cursor.offset)


def read_header(path: Union[str, os.PathLike]) -> GGUFHeader:
    """Memory-map ``path`` read-only and parse its header; only metadata pages are touched."""
    with open(path, "rb") as file:
        if os.fstat(file.fileno()).st_size == 0:
            raise ValueError(f"not a GGUF file: {os.fspath(path)!r} is empty")
        with mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
            try:
                return parse_header(mapped)
            except ValueError as error:
                raise ValueError(f"{os.fspath(path)}: {error}") from None


def read_metadata(path: Union[str, os.PathLike]) -> dict[str, MetadataValue]:
    """All metadata key/values of a GGUF file as Python values (see module docstring)."""
    return read_header(path).metadata


def metadata_from_reader(reader: Any) -> dict[str, MetadataValue]:
    """The same dict as ``read_metadata`` from an open ``gguf.GGUFReader``.

    The reader's pseudo-fields ``GGUF.version``, ``GGUF.tensor_count`` and ``GGUF.kv_count``
    are not metadata and are left out.
    """
    metadata: dict[str, MetadataValue] = {}
    byte_order = ">" if getattr(reader.endianess, "name", "") == "BIG" else "<"
    for key, reader_field in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        main_type = reader_field.types[0]
        if len(reader_field.types) > 2:  # nested arrays: GGUFReader flattens them, re-parse the field
            cursor = _Cursor(reader.data, byte_order)
            cursor.offset = reader_field.offset
            cursor.string("key")
            metadata[key] = _read_value(cursor, cursor.value_type("type"), key)[0]
        elif main_type == GGUFValueType.ARRAY and reader_field.types[-1] == GGUFValueType.STRING:
            metadata[key] = [
                bytes(reader_field.parts[i]).decode("utf-8", "surrogateescape") for i in reader_field.data
            ]
        elif main_type == GGUFValueType.STRING:
            metadata[key] = bytes(reader_field.parts[reader_field.data[0]]).decode("utf-8", "surrogateescape")
        else:
            value = reader_field.contents()
            metadata[key] = value.tolist() if isinstance(value, np.ndarray) else value
    return metadata
