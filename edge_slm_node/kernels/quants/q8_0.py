"""Q8_0: blocks of 32 weights in 34 bytes: f16 d, 32 int8 q; w = d * q. Activations: Q8_0.

Packed layout (a group of 8 rows, per block, 272 bytes): d[8] f16 | 16 chunks c of 16 bytes,
row r's int8 weights 2c, 2c+1. Chunks 2l, 2l+1 hold weights 4l..4l+3 of each row: the 4-weight
group llama.cpp's AVX2 ggml_vec_dot_q8_0_q8_0 sums into float lane l, so every kernel here
is bit-equal to llama.cpp's (the lane order of kernels/quants/lanes.py). The kernels multiply
int16 pairs (pmaddwd), so the activations are also kept as int16. Prefill runs in tiles of 4
tokens with one pass per lane pair, as Q4_1's (kernels/quants/q4_1.py).
"""
import numpy as np
from numba import njit

from ..quantize import quantize_rows_q8
from ..simd import add, fma, load_f32x8, load_halves_as_f32, mul, splat_f32, store_f32x8, zeros_f32x8
from .common import (MATMUL_SIGNATURE, ROWS_PER_GROUP, dequantize_halves, locate, repack, rows_of, run_parallel,
                     run_serial)
from .lanes import PREFETCH_BYTES, int8_lane, int8s4, lane_sum, prefetch_lines, scale_at, vector_lane_sum

FUSABLE = True           # several matrices concatenated, one output per part
SCRATCH_SLOTS = ("q8", "q16", "scales", "sums")
GROUP_BLOCK_BYTES = 272


def dequantize(blocks: np.ndarray) -> np.ndarray:
    """NumPy reference: GGUF blocks (n, 34) u8 -> (n, 32) f32."""
    return dequantize_halves(blocks, 0) * blocks[:, 2:].view(np.int8).astype(np.float32)


def pack(raw: np.ndarray) -> tuple:
    """GGUF rows (rows, nb*34) -> (packed groups, tail rows); see the layout above."""
    return repack(raw, 34, 2, 2)


@njit(cache=True, inline="always")
def _prepare(x, scratch):
    num_tokens, length = x.shape
    xq = rows_of(scratch.q8, num_tokens, length)
    xd = rows_of(scratch.scales, num_tokens, length // 32)
    quantize_rows_q8(x, xq, xd, rows_of(scratch.sums, num_tokens, length // 32))
    xq16 = rows_of(scratch.q16, num_tokens, length)
    for t in range(num_tokens):
        for i in range(length):
            xq16[t, i] = xq[t, i]
    return xq, xq16, xd


@njit(cache=True, nogil=True)
def gather_rows(packed, tail, rows, out):
    """Dequantize rows (T,) of a packed Q8_0 matrix -> out (T, n) f32: a tied token embedding
    read from the output head's packed copy (the file pages under the GGUF copy were released
    after repacking; each new token id would page-fault on them)."""
    group_rows = packed.shape[0] * ROWS_PER_GROUP
    signed = packed.view(np.int8)
    for t in range(rows.shape[0]):
        row = rows[t]
        if row >= group_rows:                     # tail rows stay in GGUF layout
            _dequantize_row(tail[row - group_rows], out[t])
            continue
        g, r = row // ROWS_PER_GROUP, row % ROWS_PER_GROUP
        for b in range(out.shape[1] // 32):
            base = b * GROUP_BLOCK_BYTES
            d = scale_at(packed[g], base + 2 * r)
            for c in range(16):
                at = base + 2 * ROWS_PER_GROUP + c * 16 + 2 * r
                out[t, b * 32 + 2 * c] = d * np.float32(signed[g, at])
                out[t, b * 32 + 2 * c + 1] = d * np.float32(signed[g, at + 1])


@njit(cache=True, inline="always")
def _lane_pair(w, x0, x1, x2, x3, scales, l):
    """Lanes l and 4+l of 4 tokens (int16 activation rows x0..x3) over all blocks, with scales as in
    _q4_1_lane_pair -> a_{4+l} + a_l per token."""
    lo0 = lo1 = lo2 = lo3 = hi0 = hi1 = hi2 = hi3 = zeros_f32x8()
    blocks = scales.shape[0] // 32
    for b in range(blocks):
        prefetch_lines(w, (blocks + b) * 272 + 68 * l, 2)     # next group (after w): block b over 4 passes
        low_at, high_at = b * 272 + 16 + 32 * l, b * 272 + 16 + 32 * (4 + l)
        at, s = b * 32 + 4 * l, b * 32
        dd = load_f32x8(scales, s)
        lo0, hi0 = fma(dd, int8_lane(w, low_at, x0, at), lo0), fma(dd, int8_lane(w, high_at, x0, at + 16), hi0)
        dd = load_f32x8(scales, s + 8)
        lo1, hi1 = fma(dd, int8_lane(w, low_at, x1, at), lo1), fma(dd, int8_lane(w, high_at, x1, at + 16), hi1)
        dd = load_f32x8(scales, s + 16)
        lo2, hi2 = fma(dd, int8_lane(w, low_at, x2, at), lo2), fma(dd, int8_lane(w, high_at, x2, at + 16), hi2)
        dd = load_f32x8(scales, s + 24)
        lo3, hi3 = fma(dd, int8_lane(w, low_at, x3, at), lo3), fma(dd, int8_lane(w, high_at, x3, at + 16), hi3)
    return add(hi0, lo0), add(hi1, lo1), add(hi2, lo2), add(hi3, lo3)


@njit(cache=True)
def _group(w, xq16, xd, out, t0, col, scales):
    """8 rows (packed Q8_0 group w) x tokens t0..t0+3 (int16 activations) -> out[t, col:col+8];
    scales: scratch (nb*32,) f32."""
    x0, x1, x2, x3 = xq16[t0], xq16[t0 + 1], xq16[t0 + 2], xq16[t0 + 3]
    d0, d1, d2, d3 = xd[t0], xd[t0 + 1], xd[t0 + 2], xd[t0 + 3]
    for b in range(xd.shape[1]):                  # d_w * d_x once for the 4 lane-pair passes
        d = load_halves_as_f32(w, b * 272)
        store_f32x8(scales, b * 32, mul(d, splat_f32(d0[b])))
        store_f32x8(scales, b * 32 + 8, mul(d, splat_f32(d1[b])))
        store_f32x8(scales, b * 32 + 16, mul(d, splat_f32(d2[b])))
        store_f32x8(scales, b * 32 + 24, mul(d, splat_f32(d3[b])))
    p0, p1, p2, p3 = _lane_pair(w, x0, x1, x2, x3, scales, 0)
    r0, r1, r2, r3 = _lane_pair(w, x0, x1, x2, x3, scales, 2)
    e0, e1, e2, e3 = add(p0, r0), add(p1, r1), add(p2, r2), add(p3, r3)    # (a4+a0) + (a6+a2)
    p0, p1, p2, p3 = _lane_pair(w, x0, x1, x2, x3, scales, 1)
    r0, r1, r2, r3 = _lane_pair(w, x0, x1, x2, x3, scales, 3)
    store_f32x8(out[t0], col, add(e0, add(p0, r0)))                         # + ((a5+a1) + (a7+a3))
    store_f32x8(out[t0 + 1], col, add(e1, add(p1, r1)))
    store_f32x8(out[t0 + 2], col, add(e2, add(p2, r2)))
    store_f32x8(out[t0 + 3], col, add(e3, add(p3, r3)))


@njit(cache=True)
def _group_one(w, xq16, xd, out, t, col):
    """8 rows (packed Q8_0 group w) x token t (int16 activations) -> out[t, col:col+8]."""
    a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = zeros_f32x8()
    x = xq16[t]
    for b in range(xd.shape[1]):
        base = b * 272
        prefetch_lines(w, base + PREFETCH_BYTES, 5)
        dd = mul(load_halves_as_f32(w, base), splat_f32(xd[t, b]))
        q, at = base + 16, b * 32
        a0 = fma(dd, int8_lane(w, q, x, at), a0)
        a1 = fma(dd, int8_lane(w, q + 32, x, at + 4), a1)
        a2 = fma(dd, int8_lane(w, q + 64, x, at + 8), a2)
        a3 = fma(dd, int8_lane(w, q + 96, x, at + 12), a3)
        a4 = fma(dd, int8_lane(w, q + 128, x, at + 16), a4)
        a5 = fma(dd, int8_lane(w, q + 160, x, at + 20), a5)
        a6 = fma(dd, int8_lane(w, q + 192, x, at + 24), a6)
        a7 = fma(dd, int8_lane(w, q + 224, x, at + 28), a7)
    store_f32x8(out[t], col, vector_lane_sum(a0, a1, a2, a3, a4, a5, a6, a7))


@njit(cache=True)
def _groups(first, last, packed, acts, outs, part_ends):
    xq, xq16, xd = acts
    num_tokens = xd.shape[0]
    full_tiles = num_tokens // 4 * 4
    scales = np.empty(xd.shape[1] * 32 if full_tiles else 0, np.float32)
    for i in range(first, last):
        part, col = locate(part_ends, i)
        out = outs[part]
        for t0 in range(0, full_tiles, 4):
            _group(packed[i], xq16, xd, out, t0, col, scales)
        for t in range(full_tiles, num_tokens):
            _group_one(packed[i], xq16, xd, out, t, col)


@njit(cache=True)
def _tail(tail, acts, outs, part_ends):
    xq, xq16, xd = acts
    out = outs[part_ends.shape[0] - 1]
    first = out.shape[1] - tail.shape[0]
    for r in range(tail.shape[0]):
        for t in range(xd.shape[0]):
            out[t, first + r] = row_dot(tail[r], xq[t], xd[t])


@njit(cache=True)
def row_dot(row, xq, xd):
    """One Q8_0 row (nb*34 B) . one token's Q8_0 activations -> float32 (llama.cpp's order)."""
    a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = np.float32(0.0)
    signed = row.view(np.int8)
    for b in range(xd.shape[0]):
        base = b * 34
        dd = scale_at(row, base) * xd[b]
        q, x = base + 2, b * 32
        a0 = fma(dd, int8s4(signed, q, xq, x), a0)
        a1 = fma(dd, int8s4(signed, q + 4, xq, x + 4), a1)
        a2 = fma(dd, int8s4(signed, q + 8, xq, x + 8), a2)
        a3 = fma(dd, int8s4(signed, q + 12, xq, x + 12), a3)
        a4 = fma(dd, int8s4(signed, q + 16, xq, x + 16), a4)
        a5 = fma(dd, int8s4(signed, q + 20, xq, x + 20), a5)
        a6 = fma(dd, int8s4(signed, q + 24, xq, x + 24), a6)
        a7 = fma(dd, int8s4(signed, q + 28, xq, x + 28), a7)
    return lane_sum(a0, a1, a2, a3, a4, a5, a6, a7)


@njit(cache=True, nogil=True)
def embed_rows(raw, rows, out):
    """Dequantize rows (T,) of a GGUF-layout Q8_0 matrix (vocab, nb*34) -> out (T, n) f32."""
    for t in range(rows.shape[0]):
        _dequantize_row(raw[rows[t]], out[t])


@njit(cache=True, inline="always")
def _dequantize_row(source, out):
    """One GGUF-layout Q8_0 row (n/32*34 B) -> out (n,) f32."""
    values = source.view(np.int8)
    for b in range(out.shape[0] // 32):
        d = scale_at(source, b * 34)
        for j in range(32):
            out[b * 32 + j] = d * np.float32(values[b * 34 + 2 + j])


# ------------------------------------------------------------------ the two entry points

@njit(MATMUL_SIGNATURE, cache=True, nogil=True)
def matmul_serial(packed, tail, part_ends, x, scratch, outs):
    """W Q8_0 packed + tail @ x (T, K) -> outs (kernels/quants/common.py), on this thread."""
    run_serial(_prepare, _groups, _tail, packed, tail, part_ends, x, scratch, outs)


@njit(MATMUL_SIGNATURE, cache=True, parallel=True)
def matmul_parallel(packed, tail, part_ends, x, scratch, outs):
    """The same on numba's thread pool when big enough."""
    run_parallel(_prepare, _groups, _tail, packed, tail, part_ends, x, scratch, outs)
