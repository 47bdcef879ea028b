"""Weight matrices for the quantized matmuls, and the activations prepared for them.

Q4_0 / Q4_1 / Q8_0 weights are repacked once at load time into the row-interleaved layout of
kernels/repack.py (same number of bytes as the GGUF tensor); the file mapping's pages of the
tensor are then released (madvise DONTNEED), so the weights are resident once. F16 / F32
weights stay in the file mapping and use the simple kernels.
"""
from __future__ import annotations

import mmap
from typing import Sequence

import numpy as np

from ..kernels import matmul, matmul_rows
from ..kernels.half import HALF_TO_FLOAT
from ..kernels.quantize import quantize_rows_q8
from ..kernels.repack import ROWS_PER_GROUP, repack
from .buffers import resident_zeros
from .quant import F16, F32, Q4_0, Q4_1, Q8_0, QuantType

PACKED_TYPES = (Q4_0, Q4_1, Q8_0)

# A packed matmul runs on numba's thread pool only when it is big enough to repay waking the
# worker (~15 us idle, 40-70 us with the cores contended, OMP_WAIT_POLICY=PASSIVE; see
# kernels/matmul.py); smaller calls run on the calling thread. Big: at least this many bytes
# of weights (decode streams them from memory) or this many multiply-adds (prefill).
PARALLEL_MIN_BYTES = 1 << 20
PARALLEL_MIN_MACS = 4_000_000


class PreparedInput:
    """One activation matrix x (T, K) plus the encodings the weights reading it need.

    Buffers are allocated once for `max_tokens` rows; `prepare` fills views of them. The int16
    copy of xq (Q8_0 weights) and the per-block sums of xq (Q4_0 weights) are made on first use.
    """

    def __init__(self, max_tokens: int, length: int, need_q8: bool, need_half: bool):
        self.length = length
        self.need_q8 = need_q8 and length % 32 == 0
        self.need_half = need_half
        blocks = length // 32
        self._xq = resident_zeros((max_tokens, length), np.int8)
        self._xd = resident_zeros((max_tokens, blocks), np.float32)
        self._xs = resident_zeros((max_tokens, blocks), np.float32)
        self._xq16 = self._sums = None              # allocated on first use
        self._half = np.zeros((max_tokens, length), np.float32) if need_half else None
        self.x = self.xq = self.xd = self.xs = self.x_half = None
        self.num_tokens = 0
        self._xq16_ready = self._sums_ready = False

    def buffers(self) -> list:
        """Every buffer allocated so far."""
        return [b for b in (self._xq, self._xd, self._xs, self._xq16, self._sums, self._half) if b is not None]

    def quantized_buffers(self, int16: bool, sums: bool) -> tuple:
        """(xq, xd, xs, xq16, sums) whole buffers, for kernels that quantize x themselves
        (kernels/decoder_layers.py); xq16 / sums are empty (0, 0) arrays unless asked for."""
        if int16 and self._xq16 is None:
            self._xq16 = resident_zeros(self._xq.shape, np.int16)
        if sums and self._sums is None:
            self._sums = resident_zeros(self._xd.shape, np.int32)
        return (self._xq, self._xd, self._xs,
                self._xq16 if int16 else np.zeros((0, 0), np.int16), self._sums if sums else np.zeros((0, 0), np.int32))

    def prepare(self, x: np.ndarray) -> "PreparedInput":
        num_tokens = x.shape[0]
        self.x = x
        self.num_tokens = num_tokens
        if self.need_q8:
            self.xq, self.xd, self.xs = self._xq[:num_tokens], self._xd[:num_tokens], self._xs[:num_tokens]
            quantize_rows_q8(x, self.xq, self.xd, self.xs)
            self._xq16_ready = self._sums_ready = False
        if self.need_half:
            self.x_half = self._half[:num_tokens]
            np.copyto(self.x_half, x.astype(np.float16))   # only for F16 weights (test models)
        return self

    @property
    def xq16(self) -> np.ndarray:
        """xq (T, K) as int16 (the Q8_0 kernels broadcast int16 pairs)."""
        if self._xq16 is None:
            self._xq16 = resident_zeros(self._xq.shape, np.int16)
        view = self._xq16[:self.num_tokens]
        if not self._xq16_ready:
            np.copyto(view, self.xq)
            self._xq16_ready = True
        return view

    @property
    def block_sums(self) -> np.ndarray:
        """(T, K/32) int32 sums of each 32-block of xq (Q4_0 kernels)."""
        if self._sums is None:
            self._sums = resident_zeros(self._xd.shape, np.int32)
        view = self._sums[:self.num_tokens]
        if not self._sums_ready:
            matmul.block_sums(self.xq, view)
            self._sums_ready = True
        return view


def release_file_pages(raw: np.ndarray) -> bool:
    """Drop this process's pages of a read-only file mapping under `raw` (re-read on access).

    Only for arrays backed by an mmap.mmap (GGUF tensors); in-memory arrays are left alone
    (DONTNEED would zero anonymous memory). Returns True when pages were released."""
    base = raw
    while isinstance(base, np.ndarray):
        base = base.base
    if isinstance(base, memoryview):
        base = base.obj
    if not isinstance(base, mmap.mmap) or not hasattr(mmap, "MADV_DONTNEED") or raw.nbytes == 0:
        return False
    map_start = np.frombuffer(base, np.uint8, count=1).ctypes.data
    start = raw.ctypes.data - map_start
    end = start + raw.nbytes
    first = -(-start // mmap.PAGESIZE) * mmap.PAGESIZE      # only pages entirely inside the tensor
    last = end // mmap.PAGESIZE * mmap.PAGESIZE
    if last > first:
        base.madvise(mmap.MADV_DONTNEED, first, last - first)
    return True


class QuantizedLinear:
    """y = W x for W (out_features, in_features), given as GGUF bytes (rows, bytes_per_row).

    `raw` stays the GGUF view (file-backed, not resident after repacking); `packed` and `tail`
    are what the kernels read; `nbytes` is what the weights cost in memory."""

    def __init__(self, name: str, raw: np.ndarray, quant: QuantType, in_features: int):
        if quant not in (F32, F16, Q4_0, Q4_1, Q8_0):
            raise ValueError(f"tensor {name!r}: quantization {quant.name} has no matmul kernel")
        self.name = name
        self.raw = raw
        self.quant = quant
        self.in_features = in_features
        self.out_features = raw.shape[0]
        self.packed = self.tail = None
        if quant in PACKED_TYPES:
            self.packed, self.tail = repack(raw, quant)
            release_file_pages(raw)
        self.part_ends = np.array([0 if self.packed is None else self.packed.shape[0]], np.int64)

    @property
    def nbytes(self) -> int:
        return self.raw.nbytes if self.packed is None else self.packed.nbytes + self.tail.nbytes

    def kernel_arrays(self) -> list:
        """The arrays the kernels read (for locking them in memory)."""
        return [self.raw] if self.packed is None else [self.packed, self.tail]

    @property
    def needs_q8(self) -> bool:
        return self.quant in PACKED_TYPES

    @property
    def needs_half(self) -> bool:
        return self.quant is F16

    def apply(self, prepared: PreparedInput, out: np.ndarray, parallel: bool = True) -> None:
        """prepared x (T, in_features) -> out (T, out_features), C-contiguous float32.
        parallel=False: on the calling thread only (else on the thread pool when big enough)."""
        _check_out(out, prepared, self.out_features, self.name)
        quant = self.quant
        if quant in PACKED_TYPES:
            _packed_kernel(quant, self.packed, self.tail, prepared, (out,), self.part_ends, self.in_features,
                           parallel)
        elif quant is F16:
            matmul_rows.matmul_f16(self.raw, prepared.x_half, HALF_TO_FLOAT, out)
        else:
            matmul_rows.matmul_f32(self.raw, prepared.x, out)


class FusedLinear:
    """Several QuantizedLinear reading the same input (q|k|v, gate|up), run as one kernel call.

    The parts' packed rows are concatenated once; each part's `packed` then becomes a view of
    the fused array (no second copy; the parts stay usable on their own). Parts that cannot be
    fused (different types, unpacked types, or a row count not a multiple of 8 before the last
    part) are applied one after the other instead."""

    def __init__(self, parts: Sequence[QuantizedLinear]):
        self.parts = list(parts)
        first = self.parts[0]
        self.quant = first.quant
        self.in_features = first.in_features
        self.out_features = tuple(p.out_features for p in self.parts)
        self.fused = (first.quant in PACKED_TYPES
                      and all(p.quant is first.quant and p.in_features == first.in_features for p in self.parts)
                      and all(p.tail.shape[0] == 0 for p in self.parts[:-1]))
        self.packed = self.tail = None
        if self.fused:
            self.packed = _adjacent_rows([p.packed for p in self.parts])
            if self.packed is None:
                self.packed = np.concatenate([p.packed for p in self.parts], axis=0)
            self.tail = self.parts[-1].tail
            ends = np.cumsum([p.packed.shape[0] for p in self.parts])
            starts = ends - [p.packed.shape[0] for p in self.parts]
            for part, start, end in zip(self.parts, starts, ends):
                part.packed = self.packed[start:end]
            self.part_ends = ends.astype(np.int64)

    @property
    def needs_q8(self) -> bool:
        return any(p.needs_q8 for p in self.parts)

    @property
    def needs_half(self) -> bool:
        return any(p.needs_half for p in self.parts)

    def apply(self, prepared: PreparedInput, outs: Sequence[np.ndarray], parallel: bool = True) -> None:
        """prepared x (T, in_features) -> outs[i] (T, parts[i].out_features), one per part."""
        if not self.fused:
            for part, out in zip(self.parts, outs, strict=True):
                part.apply(prepared, out, parallel)
            return
        outs = tuple(outs)
        if len(outs) != len(self.parts):
            raise ValueError(f"fused {[p.name for p in self.parts]} needs {len(self.parts)} outputs, got {len(outs)}")
        for part, out in zip(self.parts, outs):
            _check_out(out, prepared, part.out_features, part.name)
        _packed_kernel(self.quant, self.packed, self.tail, prepared, outs, self.part_ends, self.in_features, parallel)


def _adjacent_rows(arrays):
    """The one array whose consecutive row slices `arrays` are (parts fused before), else None."""
    base = arrays[0].base
    if base is None or any(a.base is not base for a in arrays):
        return None
    for before, after in zip(arrays, arrays[1:]):
        if before.ctypes.data + before.nbytes != after.ctypes.data:
            return None
    first = (arrays[0].ctypes.data - base.ctypes.data) // base.strides[0]
    rows = sum(a.shape[0] for a in arrays)
    view = base[first:first + rows]
    return view if view.ctypes.data == arrays[0].ctypes.data else None


def _check_out(out: np.ndarray, prepared: PreparedInput, rows: int, name: str) -> None:
    if out.shape != (prepared.num_tokens, rows) or out.dtype != np.float32 or not out.flags.c_contiguous:
        raise ValueError(f"{name}: output must be C-contiguous float32 of shape ({prepared.num_tokens}, {rows}), "
                         f"got {out.dtype} {out.shape}")


def _packed_kernel(quant, packed, tail, prepared, outs, part_ends, in_features, allow_parallel) -> None:
    rows = packed.shape[0] * ROWS_PER_GROUP + tail.shape[0]
    parallel = allow_parallel and (packed.nbytes >= PARALLEL_MIN_BYTES
                                   or prepared.num_tokens * rows * in_features >= PARALLEL_MIN_MACS)
    if quant is Q4_1:
        kernel = matmul.matmul_q4_1_packed if parallel else matmul.matmul_q4_1_packed_serial
        kernel(packed, tail, prepared.xq, prepared.xd, prepared.xs, HALF_TO_FLOAT, outs, part_ends)
    elif quant is Q8_0:
        kernel = matmul.matmul_q8_0_packed if parallel else matmul.matmul_q8_0_packed_serial
        kernel(packed, tail, prepared.xq, prepared.xq16, prepared.xd, HALF_TO_FLOAT, outs, part_ends)
    else:
        kernel = matmul.matmul_q4_0_packed if parallel else matmul.matmul_q4_0_packed_serial
        kernel(packed, tail, prepared.xq, prepared.block_sums, prepared.xd, HALF_TO_FLOAT, outs, part_ends)
