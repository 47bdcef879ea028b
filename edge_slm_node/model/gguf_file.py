"""Open a GGUF file: metadata (gguf_metadata.parse_header), tensor directory, mmap'd tensor bytes.

Tensor data is never copied: each tensor is a read-only numpy view into one mmap of the file.
"""
from __future__ import annotations

import mmap
import os
import struct
import weakref
from dataclasses import dataclass

import numpy as np

from .gguf_metadata import parse_header
from ..kernels.quants import QuantType, UnsupportedQuantError, quant_type

DEFAULT_ALIGNMENT = 32


class GGUFError(ValueError):
    """The file is not a GGUF file this engine can read; the message says what was found."""


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]      # GGUF order: shape[0] is the contiguous (row) dimension
    quant: QuantType
    offset: int                 # byte offset inside the data section
    num_bytes: int


class _Cursor:
    """Reads the tensor directory (little-endian scalars and strings) after the metadata."""

    def __init__(self, buffer: memoryview, path: str, pos: int):
        self.buffer = buffer
        self.pos = pos
        self.path = path

    def take(self, num_bytes: int) -> memoryview:
        end = self.pos + num_bytes
        if num_bytes < 0 or end > len(self.buffer):
            raise GGUFError(f"{self.path}: truncated GGUF header (needs byte {end}, file has {len(self.buffer)})")
        view = self.buffer[self.pos:end]
        self.pos = end
        return view

    def u32(self) -> int:
        return struct.unpack("<I", self.take(4))[0]

    def u64(self) -> int:
        return struct.unpack("<Q", self.take(8))[0]

    def string(self) -> str:
        return bytes(self.take(self.u64())).decode("utf-8", errors="replace")


class GGUFFile:
    """An open GGUF file. `metadata` maps keys to Python values; `tensor(name)` maps bytes."""

    def __init__(self, path: str):
        if not os.path.isfile(path):
            raise FileNotFoundError(f"model file not found: {path!r}")
        self.path = path
        self.file_size = os.path.getsize(path)
        if self.file_size < 24:
            raise GGUFError(f"{path}: file is {self.file_size} bytes, too small to be GGUF")
        with open(path, "rb") as handle:
            self._mmap = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
        self._buffer = memoryview(self._mmap)
        self.metadata: dict[str, object] = {}
        self.tensors: dict[str, TensorInfo] = {}
        self._parse()

    def _parse(self) -> None:
        try:
            header = parse_header(self._buffer)
        except ValueError as error:
            raise GGUFError(f"{self.path}: {error}") from None
        if header.byte_order != "<":
            raise GGUFError(f"{self.path}: big-endian GGUF files are not supported")
        self.metadata = header.metadata
        cursor = _Cursor(self._buffer, self.path, header.tensor_info_offset)
        infos = []
        for _ in range(header.tensor_count):
            name = cursor.string()
            num_dims = cursor.u32()
            shape = tuple(cursor.u64() for _ in range(num_dims))
            type_id = cursor.u32()
            offset = cursor.u64()
            infos.append((name, shape, type_id, offset))
        alignment = int(self.metadata.get("general.alignment", DEFAULT_ALIGNMENT))
        self.data_start = (cursor.pos + alignment - 1) // alignment * alignment
        for name, shape, type_id, offset in infos:
            try:
                quant = quant_type(type_id, name)
            except UnsupportedQuantError as error:
                raise GGUFError(f"{self.path}: {error}") from error
            num_elements = int(np.prod(shape)) if shape else 1
            if shape[0] % quant.block_size:
                raise GGUFError(f"{self.path}: tensor {name!r} row length {shape[0]} is not a multiple "
                                f"of the {quant.name} block size {quant.block_size}")
            num_bytes = num_elements // quant.block_size * quant.type_size
            end = self.data_start + offset + num_bytes
            if end > self.file_size:
                raise GGUFError(f"{self.path}: truncated: tensor {name!r} ends at byte {end}, "
                                f"file has {self.file_size} bytes")
            self.tensors[name] = TensorInfo(name, shape, quant, offset, num_bytes)

    def tensor_bytes(self, name: str) -> np.ndarray:
        """Raw bytes of one tensor as a read-only uint8 view of shape (rows, bytes_per_row)."""
        info = self.tensors[name]
        start = self.data_start + info.offset
        flat = np.frombuffer(self._buffer, dtype=np.uint8, count=info.num_bytes, offset=start)
        row_bytes = info.shape[0] // info.quant.block_size * info.quant.type_size
        return flat.reshape(-1, row_bytes)

    def row_reader(self, name: str) -> "TensorRowReader":
        """Rows of one tensor read from the file with pread (see TensorRowReader)."""
        info = self.tensors[name]
        row_bytes = info.shape[0] // info.quant.block_size * info.quant.type_size
        return TensorRowReader(self.path, self.data_start + info.offset, row_bytes, info.num_bytes // row_bytes)

    def advise_willneed(self) -> None:
        """Ask the kernel to read the whole file ahead (weights are touched on every token)."""
        if hasattr(self._mmap, "madvise") and hasattr(mmap, "MADV_WILLNEED"):
            self._mmap.madvise(mmap.MADV_WILLNEED)

    def get(self, key: str, default=None):
        return self.metadata.get(key, default)

    def require(self, key: str):
        if key not in self.metadata:
            raise GGUFError(f"{self.path}: metadata key {key!r} missing")
        return self.metadata[key]


class TensorRowReader:
    """Reads chosen rows of a tensor with pread(2) instead of through the mapping.

    A row looked up through the mapping faults its page (and the pages around it) into this
    process: RSS grows with every token id seen for the first time, up to the whole tensor. pread
    copies from the page cache and maps nothing: the token embedding costs no resident memory and
    no page fault, whatever ids come."""

    def __init__(self, path: str, start: int, row_bytes: int, num_rows: int):
        # the file as opened now, like the mapping (a model file replaced on disk is not read);
        # the descriptor is closed when this object is collected
        self._fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        weakref.finalize(self, os.close, self._fd)
        self.path, self.start, self.row_bytes, self.num_rows = path, start, row_bytes, num_rows

    def read(self, rows: np.ndarray, out: np.ndarray) -> None:
        """out[k] = row rows[k] for every k; out: (len(rows), row_bytes) uint8, C-contiguous."""
        for k, row in enumerate(rows.tolist()):
            if not 0 <= row < self.num_rows:
                raise IndexError(f"row {row} of a tensor with {self.num_rows} rows")
            got = os.preadv(self._fd, [out[k]], self.start + row * self.row_bytes)
            if got != self.row_bytes:
                raise OSError(f"{self.path}: short read of row {row}: {got} of {self.row_bytes} bytes")
