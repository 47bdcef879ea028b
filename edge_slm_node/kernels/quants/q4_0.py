"""Q4_0: blocks of 32 weights in 18 bytes: f16 d, 16 nibble bytes; w = d * (q - 8).

Nibble order as Q4_1's (kernels/quants/q4_1.py). Packed layout: a group of 8 rows takes 144
bytes per block, d[8] f16 | 4 chunks c of 32 bytes, row r's nibble bytes 4c..4c+3 at 4r.
Activations: Q8_0 (the same int8 q and f16-rounded d; the -8 offset is applied through
per-block sums of q). The summation order
is a simple one (per block acc += d_w * d_x * isum, one integer sum per block), bit-equal
between the packed and row kernels but not emulating llama.cpp, which repacks Q4_0 on AVX2
into interleaved kernels of its own.
"""
import numpy as np
from numba import njit

from ..quantize import quantize_rows_q8
from ..simd import (add, align_stack_frame, load_halves_as_f32, mul, splat_f32, splat_i32, store_f32x8, to_f32,
                    zeros_f32x8)
from ..simd_int import load_i8x32
from .common import MATMUL_SIGNATURE, dequantize_halves, locate, nibbles, repack, rows_of, run_parallel, run_serial
from .lanes import PREFETCH_BYTES, nibble_dot, prefetch_lines, scale_at

FUSABLE = True           # several matrices concatenated, one output per part
SCRATCH_SLOTS = ("q8", "scales", "sums", "isums")


def dequantize(blocks: np.ndarray) -> np.ndarray:
    """NumPy reference: GGUF blocks (n, 18) u8 -> (n, 32) f32."""
    return dequantize_halves(blocks, 0) * (nibbles(blocks[:, 2:]) - 8.0)


def pack(raw: np.ndarray) -> tuple:
    """GGUF rows (rows, nb*18) -> (packed groups, tail rows); see the layout above."""
    return repack(raw, 18, 2, 4)


@njit(cache=True, inline="always")
def _prepare(x, scratch):
    num_tokens, length = x.shape
    blocks = length // 32
    xq = rows_of(scratch.q8, num_tokens, length)
    xd = rows_of(scratch.scales, num_tokens, blocks)
    quantize_rows_q8(x, xq, xd, rows_of(scratch.sums, num_tokens, blocks))
    xsum = rows_of(scratch.isums, num_tokens, blocks)
    for t in range(num_tokens):                 # per-block sums of q: the -8 offset
        for b in range(blocks):
            total = np.int32(0)
            for j in range(32):
                total += np.int32(xq[t, b * 32 + j])
            xsum[t, b] = total
    return xq, xsum, xd


@njit(cache=True, inline="always")      # no refcount per group: common.py, run_serial
def _group(w, xq, xsum, xd, out, t0, col):
    """8 rows (packed Q4_0 group w) x tokens t0..t0+3 -> out[t, col:col+8]."""
    acc0 = acc1 = acc2 = acc3 = zeros_f32x8()
    x0, x1, x2, x3 = xq[t0], xq[t0 + 1], xq[t0 + 2], xq[t0 + 3]
    for b in range(xd.shape[1]):
        base = b * 144
        prefetch_lines(w, base + PREFETCH_BYTES, 3)
        i0 = splat_i32(-8 * xsum[t0, b])
        i1 = splat_i32(-8 * xsum[t0 + 1, b])
        i2 = splat_i32(-8 * xsum[t0 + 2, b])
        i3 = splat_i32(-8 * xsum[t0 + 3, b])
        for c in range(4):
            q = load_i8x32(w, base + 16 + 32 * c)
            at = b * 32 + 4 * c
            i0 = add(i0, nibble_dot(q, x0, at))
            i1 = add(i1, nibble_dot(q, x1, at))
            i2 = add(i2, nibble_dot(q, x2, at))
            i3 = add(i3, nibble_dot(q, x3, at))
        d = load_halves_as_f32(w, base)
        acc0 = add(acc0, mul(mul(d, splat_f32(xd[t0, b])), to_f32(i0)))
        acc1 = add(acc1, mul(mul(d, splat_f32(xd[t0 + 1, b])), to_f32(i1)))
        acc2 = add(acc2, mul(mul(d, splat_f32(xd[t0 + 2, b])), to_f32(i2)))
        acc3 = add(acc3, mul(mul(d, splat_f32(xd[t0 + 3, b])), to_f32(i3)))
    store_f32x8(out[t0], col, acc0)
    store_f32x8(out[t0 + 1], col, acc1)
    store_f32x8(out[t0 + 2], col, acc2)
    store_f32x8(out[t0 + 3], col, acc3)


@njit(cache=True, inline="always")
def _group_one(w, xq, xsum, xd, out, t, col):
    """8 rows (packed Q4_0 group w) x token t -> out[t, col:col+8]."""
    acc = zeros_f32x8()
    x = xq[t]
    for b in range(xd.shape[1]):
        base = b * 144
        prefetch_lines(w, base + PREFETCH_BYTES, 3)
        isum = splat_i32(-8 * xsum[t, b])
        for c in range(4):
            isum = add(isum, nibble_dot(load_i8x32(w, base + 16 + 32 * c), x, b * 32 + 4 * c))
        acc = add(acc, mul(mul(load_halves_as_f32(w, base), splat_f32(xd[t, b])), to_f32(isum)))
    store_f32x8(out[t], col, acc)


@njit(cache=True)
def _groups(first, last, packed, acts, outs, part_ends):
    align_stack_frame()
    xq, xsum, xd = acts
    num_tokens = xd.shape[0]
    full_tiles = num_tokens // 4 * 4
    for i in range(first, last):
        part, col = locate(part_ends, i)
        out = outs[part]
        for t0 in range(0, full_tiles, 4):
            _group(packed[i], xq, xsum, xd, out, t0, col)
        for t in range(full_tiles, num_tokens):
            _group_one(packed[i], xq, xsum, xd, out, t, col)


@njit(cache=True)
def _tail(tail, acts, outs, part_ends):
    xq, xsum, xd = acts
    out = outs[part_ends.shape[0] - 1]
    first = out.shape[1] - tail.shape[0]
    for r in range(tail.shape[0]):
        for t in range(xd.shape[0]):
            out[t, first + r] = row_dot(tail[r], xq[t], xd[t])


@njit(cache=True)
def row_dot(row, xq, xd):
    """One Q4_0 row (nb*18 B) . one token's Q8_0 activations -> float32 (simple order, see top)."""
    acc = np.float32(0.0)
    for b in range(xd.shape[0]):
        base = b * 18
        d = scale_at(row, base)
        isum = np.int32(0)
        for j in range(16):
            byte = np.int32(row[base + 2 + j])
            isum += ((byte & 15) - 8) * np.int32(xq[b * 32 + j]) + ((byte >> 4) - 8) * np.int32(xq[b * 32 + 16 + j])
        acc += d * xd[b] * np.float32(isum)
    return acc


# ------------------------------------------------------------------ the two entry points

@njit(MATMUL_SIGNATURE, cache=True, nogil=True)
def matmul_serial(packed, tail, part_ends, x, scratch, outs):
    """W Q4_0 packed + tail @ x (T, K) -> outs (kernels/quants/common.py), on this thread."""
    run_serial(_prepare, _groups, _tail, packed, tail, part_ends, x, scratch, outs)


@njit(MATMUL_SIGNATURE, cache=True, parallel=True)
def matmul_parallel(packed, tail, part_ends, x, scratch, outs):
    """The same on numba's thread pool when big enough."""
    run_parallel(_prepare, _groups, _tail, packed, tail, part_ends, x, scratch, outs)
