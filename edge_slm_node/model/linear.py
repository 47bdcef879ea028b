"""Weight matrices in the form their kernels read, and matrices fused to share one input.

Every matrix is packed once at load time by its type's module (kernels/quants: Q4_0, Q4_1 and
Q8_0 into a row-interleaved layout, F16 / F32 as stored), into as many bytes as the GGUF
tensor; the file mapping's pages of the tensor are then released (madvise DONTNEED), so the
weights are resident once.
"""
from __future__ import annotations

import mmap
from typing import Sequence

import numpy as np

from ..kernels.quants import QuantType
from ..kernels.quants.common import Scratch, set_one_call, set_separate_calls

_EMPTY_OUT = np.zeros((0, 0), np.float32)


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


class Linear:
    """y = W x for W (out_features, in_features), given as GGUF bytes (rows, bytes_per_row).

    `raw` stays the GGUF view (file-backed, not resident once repacked); `packed`, `tail` and
    `part_ends` are what the kernels read; `nbytes` is what the weights cost in memory."""

    def __init__(self, name: str, raw: np.ndarray, quant: QuantType, in_features: int):
        self.name = name
        self.raw = raw
        self.quant = quant
        self.in_features = in_features
        self.out_features = raw.shape[0]
        self.packed, self.tail = quant.kernels.pack(raw)
        release_file_pages(raw)
        self.part_ends = np.array([self.packed.shape[0]], np.int64)

    @property
    def nbytes(self) -> int:
        return self.packed.nbytes + self.tail.nbytes

    def kernel_arrays(self) -> list:
        """The arrays the kernels read (for locking them in memory)."""
        return [self.packed, self.tail]

    @property
    def scratch_slots(self) -> tuple:
        return self.quant.kernels.SCRATCH_SLOTS

    def kernel(self, parallel: bool):
        return self.quant.kernels.matmul_parallel if parallel else self.quant.kernels.matmul_serial

    def apply(self, x: np.ndarray, scratch: Scratch, out: np.ndarray, parallel: bool = True,
              rows_alone: bool = False) -> None:
        """x (T, in_features) f32 -> out (T, out_features), both C-contiguous float32.
        parallel=False: on the calling thread only (else on the thread pool when big enough).
        Rows are summed as llama.cpp sums one call of T tokens, or with rows_alone as T calls of
        one token each (the output head: llama.cpp computes one sequence's logits row alone)."""
        _check(x, self.in_features, out, self.out_features, self.name)
        _set_calls(scratch, x.shape[0], rows_alone)
        self.kernel(parallel)(self.packed, self.tail, self.part_ends, x, scratch, (out, _EMPTY_OUT, _EMPTY_OUT))


class FusedLinear:
    """Several Linear reading the same input (q|k|v, gate|up), run as one kernel call.

    The parts' packed rows are concatenated once; each part's `packed` then becomes a view of
    the fused array (no second copy; the parts stay usable on their own). Parts that cannot be
    fused (different types, an unpacked type, or a row count not a multiple of 8 before the
    last part) are applied one after the other instead."""

    def __init__(self, parts: Sequence[Linear]):
        self.parts = list(parts)
        first = self.parts[0]
        self.quant = first.quant
        self.fused = (first.quant.fusable
                      and all(p.quant is first.quant and p.in_features == first.in_features for p in self.parts)
                      and all(p.tail.shape[0] == 0 for p in self.parts[:-1]))
        self.packed = self.tail = self.part_ends = None
        if self.fused:
            self.packed = _adjacent_rows([p.packed for p in self.parts])
            if self.packed is None:
                self.packed = np.concatenate([p.packed for p in self.parts], axis=0)
            self.tail = self.parts[-1].tail
            ends = np.cumsum([p.packed.shape[0] for p in self.parts])
            for part, start, end in zip(self.parts, ends - [p.packed.shape[0] for p in self.parts], ends):
                part.packed = self.packed[start:end]
            self.part_ends = ends.astype(np.int64)

    def apply(self, x: np.ndarray, scratch: Scratch, outs: Sequence[np.ndarray], parallel: bool = True) -> None:
        """x (T, in_features) -> outs[i] (T, parts[i].out_features), one per part; x is one call
        of T tokens (Linear.apply)."""
        outs = tuple(outs)
        if len(outs) != len(self.parts):
            raise ValueError(f"fused {[p.name for p in self.parts]} needs {len(self.parts)} outputs, got {len(outs)}")
        if not self.fused:
            for part, out in zip(self.parts, outs):
                part.apply(x, scratch, out, parallel)
            return
        for part, out in zip(self.parts, outs):
            _check(x, part.in_features, out, part.out_features, part.name)
        _set_calls(scratch, x.shape[0], False)
        padded = outs + (_EMPTY_OUT,) * (3 - len(outs))
        self.parts[0].kernel(parallel)(self.packed, self.tail, self.part_ends, x, scratch, padded)


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


def _set_calls(scratch: Scratch, num_tokens: int, rows_alone: bool) -> None:
    (set_separate_calls if rows_alone else set_one_call)(scratch, num_tokens)


def _check(x: np.ndarray, in_features: int, out: np.ndarray, rows: int, name: str) -> None:
    if x.ndim != 2 or x.shape[1] != in_features or x.dtype != np.float32 or not x.flags.c_contiguous:
        raise ValueError(f"{name}: input must be C-contiguous float32 of shape (T, {in_features}), "
                         f"got {x.dtype} {x.shape}")
    if out.shape != (x.shape[0], rows) or out.dtype != np.float32 or not out.flags.c_contiguous:
        raise ValueError(f"{name}: output must be C-contiguous float32 of shape ({x.shape[0]}, {rows}), "
                         f"got {out.dtype} {out.shape}")
