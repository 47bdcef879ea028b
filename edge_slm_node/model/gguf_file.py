"""Read a GGUF file: metadata, tensor directory and memory-mapped tensor bytes.

The parser is our own (gguf-py's GGUFReader needs ~6 s for this model's
49k-entry vocabulary; this one needs well under a second). Tensor data is never
copied: each tensor is a read-only numpy view into one mmap of the file.
"""
from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass

import numpy as np

from .quant import QUANT_TYPES, QuantType

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32

# GGUF metadata value types.
_SCALAR_FORMATS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
                   10: "<Q", 11: "<q", 12: "<d"}
_NUMPY_DTYPES = {0: np.uint8, 1: np.int8, 2: np.uint16, 3: np.int16, 4: np.uint32, 5: np.int32,
                 6: np.float32, 7: np.bool_, 10: np.uint64, 11: np.int64, 12: np.float64}
_TYPE_STRING = 8
_TYPE_ARRAY = 9


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
    def __init__(self, buffer: memoryview, path: str):
        self.buffer = buffer
        self.pos = 0
        self.path = path

    def take(self, num_bytes: int) -> memoryview:
        end = self.pos + num_bytes
        if num_bytes < 0 or end > len(self.buffer):
            raise GGUFError(f"{self.path}: truncated GGUF header (needs byte {end}, file has {len(self.buffer)})")
        view = self.buffer[self.pos:end]
        self.pos = end
        return view

    def scalar(self, value_type: int):
        fmt = _SCALAR_FORMATS[value_type]
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def string(self) -> str:
        length = self.scalar(10)
        return bytes(self.take(length)).decode("utf-8", errors="replace")

    def value(self, value_type: int):
        if value_type in _SCALAR_FORMATS:
            return self.scalar(value_type)
        if value_type == _TYPE_STRING:
            return self.string()
        if value_type == _TYPE_ARRAY:
            item_type = self.scalar(4)
            count = self.scalar(10)
            if item_type in _NUMPY_DTYPES:
                dtype = np.dtype(_NUMPY_DTYPES[item_type])
                return np.frombuffer(self.take(count * dtype.itemsize), dtype=dtype).copy()
            if item_type == _TYPE_STRING:
                return [self.string() for _ in range(count)]
            return [self.value(item_type) for _ in range(count)]
        raise GGUFError(f"{self.path}: unknown GGUF metadata value type {value_type} at byte {self.pos}")


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
        cursor = _Cursor(self._buffer, self.path)
        magic = bytes(cursor.take(4))
        if magic != GGUF_MAGIC:
            raise GGUFError(f"{self.path}: not a GGUF file (magic {magic!r}, expected {GGUF_MAGIC!r})")
        version = cursor.scalar(4)
        if version not in SUPPORTED_VERSIONS:
            raise GGUFError(f"{self.path}: GGUF version {version} unsupported (supported {SUPPORTED_VERSIONS})")
        tensor_count = cursor.scalar(10)
        kv_count = cursor.scalar(10)
        for _ in range(kv_count):
            key = cursor.string()
            self.metadata[key] = cursor.value(cursor.scalar(4))
        infos = []
        for _ in range(tensor_count):
            name = cursor.string()
            num_dims = cursor.scalar(4)
            shape = tuple(int(cursor.scalar(10)) for _ in range(num_dims))
            type_id = cursor.scalar(4)
            offset = cursor.scalar(10)
            infos.append((name, shape, type_id, offset))
        alignment = int(self.metadata.get("general.alignment", DEFAULT_ALIGNMENT))
        self.data_start = (cursor.pos + alignment - 1) // alignment * alignment
        for name, shape, type_id, offset in infos:
            quant = QUANT_TYPES.get(type_id)
            if quant is None:
                raise GGUFError(f"{self.path}: tensor {name!r} has quantization type id {type_id}, "
                                f"supported: {sorted(q.name for q in QUANT_TYPES.values())}")
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
