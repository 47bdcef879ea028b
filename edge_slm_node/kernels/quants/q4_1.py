"""Q4_1: blocks of 32 weights in 20 bytes: f16 d, f16 m, 16 nibble bytes; w = d * q + m.

Nibble order (GGUF): byte j holds weight j in its low nibble and weight j+16 in its high one.
Activations: Q8_1 (kernels/quantize.py: int8 q, f16-rounded d and s = d * sum(q) per 32).
Packed layout (a group of 8 rows, per block, 160 bytes): d[8] f16 | m[8] f16 | 4 chunks c of
32 bytes, row r's GGUF nibble bytes 4c..4c+3 (rows after the last full group stay in GGUF
layout, the "tail"). Chunk c holds weights 4c..4c+3 (low nibbles) and 16+4c..16+4c+3 (high):
exactly the 4-weight groups llama.cpp's AVX2 ggml_vec_dot_q4_1_q8_1 sums into one float
lane, so lanes c and 4+c come from chunk c, and the result is bit-equal to llama.cpp's:
    a_l = fma(d_w * d_x, isum_l, a_l) block after block;  summs = fma(m_w, s_x, summs)
    result = ((a4 + a0) + (a6 + a2)) + ((a5 + a1) + (a7 + a3)) + summs
One token (decode) runs blocks in order with all 9 accumulators in registers. Prefill takes
tokens in tiles of 4 per weight load and, to keep 4 tokens' accumulators in registers, makes
one pass over the blocks per lane pair (a_c, a_{4+c}) after one pass that stores d_w * d_x of
every block in a scratch row and runs the summs chains: each lane's chain stays in block
order, the group's weights stay in L1 between passes (measured: as fast as the one-token
kernel per token when the weights stream from memory).
"""
import numpy as np
from numba import njit

from ..quantize import quantize_rows_q8
from ..simd import add, fma, load_f32x8, load_halves_as_f32, mul, prefetch, splat_f32, store_f32x8, zeros_f32x8
from ..simd_int import load_i8x32
from .common import MATMUL_SIGNATURE, dequantize_halves, locate, nibbles, repack, rows_of, run_parallel, run_serial
from .lanes import PREFETCH_BYTES, lane_sum, nibble_lanes, nibbles4, prefetch_lines, scale_at, vector_lane_sum

FUSABLE = True           # several matrices concatenated, one output per part
SCRATCH_SLOTS = ("q8", "scales", "sums")


def dequantize(blocks: np.ndarray) -> np.ndarray:
    """NumPy reference: GGUF blocks (n, 20) u8 -> (n, 32) f32."""
    return dequantize_halves(blocks, 0) * nibbles(blocks[:, 4:]) + dequantize_halves(blocks, 2)


def pack(raw: np.ndarray) -> tuple:
    """GGUF rows (rows, nb*20) -> (packed groups, tail rows); see the layout above."""
    return repack(raw, 20, 4, 4)


@njit(cache=True, inline="always")
def _prepare(x, scratch):
    num_tokens, length = x.shape
    xq = rows_of(scratch.q8, num_tokens, length)
    xd = rows_of(scratch.scales, num_tokens, length // 32)
    xs = rows_of(scratch.sums, num_tokens, length // 32)
    quantize_rows_q8(x, xq, xd, xs)
    return xq, xd, xs


@njit(cache=True, inline="always")
def _lane_pair(w, x0, x1, x2, x3, scales, c):
    """Lanes c and 4+c (chunk c) of 4 tokens (activation rows x0..x3) over all blocks, with
    scales[32b + 8t:][:8] = d_w * d_x of block b, token t -> a_{4+c} + a_c per token."""
    lo0 = lo1 = lo2 = lo3 = hi0 = hi1 = hi2 = hi3 = zeros_f32x8()
    blocks = scales.shape[0] // 32
    for b in range(blocks):
        prefetch(w, (blocks + b) * 160 + 40 * c)     # next group (after w): its block b over the 4 passes
        q = load_i8x32(w, b * 160 + 32 + 32 * c)
        at, s = b * 32 + 4 * c, b * 32
        low, high = nibble_lanes(q, x0, at)
        dd = load_f32x8(scales, s)
        lo0, hi0 = fma(dd, low, lo0), fma(dd, high, hi0)
        low, high = nibble_lanes(q, x1, at)
        dd = load_f32x8(scales, s + 8)
        lo1, hi1 = fma(dd, low, lo1), fma(dd, high, hi1)
        low, high = nibble_lanes(q, x2, at)
        dd = load_f32x8(scales, s + 16)
        lo2, hi2 = fma(dd, low, lo2), fma(dd, high, hi2)
        low, high = nibble_lanes(q, x3, at)
        dd = load_f32x8(scales, s + 24)
        lo3, hi3 = fma(dd, low, lo3), fma(dd, high, hi3)
    return add(hi0, lo0), add(hi1, lo1), add(hi2, lo2), add(hi3, lo3)


@njit(cache=True)
def _group(w, xq, xd, xs, out, t0, col, scales):
    """8 rows (packed Q4_1 group w) x tokens t0..t0+3 -> out[t, col:col+8]; scales: scratch (nb*32,) f32."""
    x0, x1, x2, x3 = xq[t0], xq[t0 + 1], xq[t0 + 2], xq[t0 + 3]
    d0, d1, d2, d3 = xd[t0], xd[t0 + 1], xd[t0 + 2], xd[t0 + 3]
    m0, m1, m2, m3 = xs[t0], xs[t0 + 1], xs[t0 + 2], xs[t0 + 3]
    s0 = s1 = s2 = s3 = zeros_f32x8()
    for b in range(xd.shape[1]):                  # summs, and d_w * d_x once for the 4 lane-pair passes
        m = load_halves_as_f32(w, b * 160 + 16)
        s0 = fma(m, splat_f32(m0[b]), s0)
        s1 = fma(m, splat_f32(m1[b]), s1)
        s2 = fma(m, splat_f32(m2[b]), s2)
        s3 = fma(m, splat_f32(m3[b]), s3)
        d = load_halves_as_f32(w, b * 160)
        store_f32x8(scales, b * 32, mul(d, splat_f32(d0[b])))
        store_f32x8(scales, b * 32 + 8, mul(d, splat_f32(d1[b])))
        store_f32x8(scales, b * 32 + 16, mul(d, splat_f32(d2[b])))
        store_f32x8(scales, b * 32 + 24, mul(d, splat_f32(d3[b])))
    p0, p1, p2, p3 = _lane_pair(w, x0, x1, x2, x3, scales, 0)
    r0, r1, r2, r3 = _lane_pair(w, x0, x1, x2, x3, scales, 2)
    e0, e1, e2, e3 = add(p0, r0), add(p1, r1), add(p2, r2), add(p3, r3)    # (a4+a0) + (a6+a2)
    p0, p1, p2, p3 = _lane_pair(w, x0, x1, x2, x3, scales, 1)
    r0, r1, r2, r3 = _lane_pair(w, x0, x1, x2, x3, scales, 3)
    store_f32x8(out[t0], col, add(add(e0, add(p0, r0)), s0))              # + ((a5+a1) + (a7+a3)), + summs
    store_f32x8(out[t0 + 1], col, add(add(e1, add(p1, r1)), s1))
    store_f32x8(out[t0 + 2], col, add(add(e2, add(p2, r2)), s2))
    store_f32x8(out[t0 + 3], col, add(add(e3, add(p3, r3)), s3))


@njit(cache=True)
def _group_one(w, xq, xd, xs, out, t, col):
    """8 rows (packed Q4_1 group w) x token t -> out[t, col:col+8]."""
    a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = summs = zeros_f32x8()
    x = xq[t]
    for b in range(xd.shape[1]):
        base = b * 160
        prefetch_lines(w, base + PREFETCH_BYTES, 3)
        dd = mul(load_halves_as_f32(w, base), splat_f32(xd[t, b]))
        summs = fma(load_halves_as_f32(w, base + 16), splat_f32(xs[t, b]), summs)
        at = b * 32
        low, high = nibble_lanes(load_i8x32(w, base + 32), x, at)
        a0, a4 = fma(dd, low, a0), fma(dd, high, a4)
        low, high = nibble_lanes(load_i8x32(w, base + 64), x, at + 4)
        a1, a5 = fma(dd, low, a1), fma(dd, high, a5)
        low, high = nibble_lanes(load_i8x32(w, base + 96), x, at + 8)
        a2, a6 = fma(dd, low, a2), fma(dd, high, a6)
        low, high = nibble_lanes(load_i8x32(w, base + 128), x, at + 12)
        a3, a7 = fma(dd, low, a3), fma(dd, high, a7)
    store_f32x8(out[t], col, add(vector_lane_sum(a0, a1, a2, a3, a4, a5, a6, a7), summs))


@njit(cache=True)
def _groups(first, last, packed, acts, outs, part_ends):
    xq, xd, xs = acts
    num_tokens = xd.shape[0]
    full_tiles = num_tokens // 4 * 4
    scales = np.empty(xd.shape[1] * 32 if full_tiles else 0, np.float32)
    for i in range(first, last):
        part, col = locate(part_ends, i)
        out = outs[part]
        for t0 in range(0, full_tiles, 4):
            _group(packed[i], xq, xd, xs, out, t0, col, scales)
        for t in range(full_tiles, num_tokens):
            _group_one(packed[i], xq, xd, xs, out, t, col)


@njit(cache=True)
def _tail(tail, acts, outs, part_ends):
    xq, xd, xs = acts
    out = outs[part_ends.shape[0] - 1]
    first = out.shape[1] - tail.shape[0]
    for r in range(tail.shape[0]):
        for t in range(xd.shape[0]):
            out[t, first + r] = row_dot(tail[r], xq[t], xd[t], xs[t])


@njit(cache=True)
def row_dot(row, xq, xd, xs):
    """One Q4_1 row (nb*20 B) . one token's Q8_1 activations -> float32 (llama.cpp's order)."""
    a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = summs = np.float32(0.0)
    for b in range(xd.shape[0]):
        base = b * 20
        dd = scale_at(row, base) * xd[b]
        summs = fma(scale_at(row, base + 2), xs[b], summs)
        q, x = base + 4, b * 32
        a0 = fma(dd, nibbles4(row, q, 0, xq, x), a0)
        a1 = fma(dd, nibbles4(row, q + 4, 0, xq, x + 4), a1)
        a2 = fma(dd, nibbles4(row, q + 8, 0, xq, x + 8), a2)
        a3 = fma(dd, nibbles4(row, q + 12, 0, xq, x + 12), a3)
        a4 = fma(dd, nibbles4(row, q, 4, xq, x + 16), a4)
        a5 = fma(dd, nibbles4(row, q + 4, 4, xq, x + 20), a5)
        a6 = fma(dd, nibbles4(row, q + 8, 4, xq, x + 24), a6)
        a7 = fma(dd, nibbles4(row, q + 12, 4, xq, x + 28), a7)
    return lane_sum(a0, a1, a2, a3, a4, a5, a6, a7) + summs


# ------------------------------------------------------------------ the two entry points

@njit(MATMUL_SIGNATURE, cache=True, nogil=True)
def matmul_serial(packed, tail, part_ends, x, scratch, outs):
    """W Q4_1 packed + tail @ x (T, K) -> outs (kernels/quants/common.py), on this thread."""
    run_serial(_prepare, _groups, _tail, packed, tail, part_ends, x, scratch, outs)


@njit(MATMUL_SIGNATURE, cache=True, parallel=True)
def matmul_parallel(packed, tail, part_ends, x, scratch, outs):
    """The same on numba's thread pool when big enough."""
    run_parallel(_prepare, _groups, _tail, packed, tail, part_ends, x, scratch, outs)
