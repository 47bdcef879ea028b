"""Quantized matrix products on packed (row-interleaved) weights; the one-row GGUF-layout kernels
(references, tail rows, F16/F32 weights) are in kernels/matmul_rows.py.

Activations arrive quantized by kernels/quantize.py (int8 + per-32-block scales), so integer
sums over a few weights are exact; what decides the float result is the order of the float
operations. For Q4_1 and Q8_0 weights every kernel (packed, tail rows, GGUF-layout
reference) computes one output value in the order of llama.cpp's x86 AVX2+FMA dot products
(ggml_vec_dot_q4_1_q8_1 / ggml_vec_dot_q8_0_q8_0), so results are bit-equal to llama.cpp's:

  8 float lanes a0..a7, lane l summing the 4-weight group l of each 32-weight block
  (Q4_1: lanes 0-3 = the low nibbles of GGUF bytes 4l..4l+3 (weights 4l..4l+3), lanes 4-7 =
  their high nibbles (weights 16+4l..); Q8_0: weights 4l..4l+3), block after block:
      a_l = fma(d_w * d_x, float(isum_l), a_l)         d_w * d_x: one float32 product
      summs = fma(m_w, s_x, summs)                      (Q4_1 only: its own chain)
  result = ((a4 + a0) + (a6 + a2)) + ((a5 + a1) + (a7 + a3))  [+ summs]

with fma rounding once (llvm.fma) and every other operation rounded. Q4_0 keeps a simpler
order (per block acc += d_w * d_x * isum, one integer sum per block, no fma), bit-equal between
its packed and reference kernels but not emulating llama.cpp (which repacks Q4_0 on AVX2 into
its own interleaved kernels).

Packed kernels (layout in kernels/repack.py, primitives in kernels/simd.py) work on groups of
8 rows: one vector lane per row, and one F32x8 accumulator per llama.cpp lane, so the chunked
layout feeds the lanes directly (Q4_1 chunk c: low nibbles -> a_c, high -> a_{4+c}; Q8_0 chunks
2l, 2l+1 -> a_l). One token (decode) runs blocks in order with all 9 accumulators in registers.
Prefill takes tokens in tiles of 4 per weight load and, to keep 4 tokens' accumulators in
registers, makes one pass over the blocks per lane pair (a_c, a_{4+c}), after one pass that
stores d_w * d_x of every block in a scratch row (and runs Q4_1's summs chains): each lane's
chain is still in block order, the group's weights stay in L1 between passes, and the passes
prefetch the next group (measured: as fast as the one-token kernel per token when the weights
stream from memory, a few % faster when they are cached). The exact
order has a price: every 4 weights x 8 rows need their own pmaddwd, int->float conversion and
fma (llama.cpp's own kernel does the same per weight), where one integer sum per block shares
them; measured on 1 core (Zen 3) against that order: ~1.45x the time at 64 tokens, ~1.1x for
one token (decode).
Several matrices sharing one input can be concatenated (q|k|v, gate|up): `outs` is a tuple of
output arrays (T, rows_p) and part_ends[p] is the number of groups up to and including part p.
Rows that do not fill a group ("tail", GGUF layout) belong to the last part. Each packed kernel
has a parallel driver (one prange region, groups split across threads) and a serial one;
model/linear.py picks by the size of the call.

Threads: numba's `omp` layer (GNU libgomp) by default lets idle workers spin for a long time
after each parallel region. With other processes on the 2 cores, a spinning worker gets
preempted and every region then waits for its next time slice (measured: an empty region
went from ~4 us to ~11 ms, a decode pass from ~10 ms to ~1 s). Importing the kernels package
therefore sets OMP_WAIT_POLICY=PASSIVE (kernels/__init__.py, unless the process already set
it) before numba starts its threads: regions then cost ~12-20 us (a futex wake) but stay that
cheap under load (README, "Threads", has the measurements). It only takes effect if no
parallel numba code has run yet in the process.
Note: numba's cache does not notice edits to imported modules (simd.py, repack.py); clear
__pycache__ after changing them.
"""
import numpy as np
from numba import njit, prange

from .matmul_rows import row_dot_q4_0, row_dot_q4_1, row_dot_q8_0
from .repack import ROWS_PER_GROUP
from .simd import (add, add_pairs_i16, broadcast_i16x2, broadcast_i8x4, dot_pairs_i16, dot_pairs_u8_i8, fma,
                   high_nibbles, load_f32x8, load_halves_as_f32, load_i8x16_as_i16, load_i8x32, low_nibbles, mul,
                   prefetch, splat_f32, splat_i32, store_f32x8, to_f32, zeros_f32x8, zeros_i32x8)


# Decode (one token) streams the weights from memory: each block also prefetches the bytes
# this far ahead (the next group, contiguous); measured ~1.3x on the whole decode pass.
PREFETCH_BYTES = 2048


# ------------------------------------------------------------- packed: one group of 8 rows

@njit(cache=True, inline="always")
def _vector_lane_sum(a0, a1, a2, a3, a4, a5, a6, a7):
    """matmul_rows._lane_sum for F32x8 accumulators (8 rows at once)."""
    return add(add(add(a4, a0), add(a6, a2)), add(add(a5, a1), add(a7, a3)))


@njit(cache=True, inline="always")
def _nibble_lanes(q, x, at):
    """32 packed nibble bytes (8 rows x 4) -> (low nibbles . x[at..at+3], high nibbles . x[at+16..at+19])
    as two F32x8 (exact integer sums, one per row)."""
    low = add_pairs_i16(dot_pairs_u8_i8(low_nibbles(q), broadcast_i8x4(x, at)))
    high = add_pairs_i16(dot_pairs_u8_i8(high_nibbles(q), broadcast_i8x4(x, at + 16)))
    return to_f32(low), to_f32(high)


@njit(cache=True, inline="always")
def _nibble_dot(q, x, at):
    """32 packed nibble bytes (8 rows x 4) . x[at..at+3] (low) and x[at+16..at+19] (high) -> I32x8."""
    low = dot_pairs_u8_i8(low_nibbles(q), broadcast_i8x4(x, at))
    high = dot_pairs_u8_i8(high_nibbles(q), broadcast_i8x4(x, at + 16))
    return add_pairs_i16(add(low, high))


@njit(cache=True, inline="always")
def _int8_lane(w, at, x16, x_at):
    """Two Q8_0 chunks w[at:at+32] (8 rows x weights 4l..4l+3) . x16[x_at:x_at+4] -> F32x8 (exact)."""
    first = dot_pairs_i16(load_i8x16_as_i16(w, at), broadcast_i16x2(x16, x_at))
    second = dot_pairs_i16(load_i8x16_as_i16(w, at + 16), broadcast_i16x2(x16, x_at + 2))
    return to_f32(add(first, second))


@njit(cache=True, inline="always")
def _prefetch_lines(w, at, lines):
    """Prefetch `lines` cache lines from w[at] on (past w's end is fine: prefetches never fault)."""
    for i in range(lines):
        prefetch(w, at + 64 * i)


@njit(cache=True, nogil=True)
def block_sums(xq, out):
    """xq (T, nb*32) int8 -> out (T, nb) int32 per-block sums (Q4_0 subtracts 8 * these)."""
    for t in range(xq.shape[0]):
        for b in range(out.shape[1]):
            total = np.int32(0)
            for j in range(32):
                total += np.int32(xq[t, b * 32 + j])
            out[t, b] = total


@njit(cache=True, inline="always")
def _q4_1_lane_pair(w, x0, x1, x2, x3, scales, c):
    """Lanes c and 4+c (chunk c) of 4 tokens (activation rows x0..x3) over all blocks, with
    scales[32b + 8t:][:8] = d_w * d_x of block b, token t -> a_{4+c} + a_c per token."""
    lo0 = lo1 = lo2 = lo3 = hi0 = hi1 = hi2 = hi3 = zeros_f32x8()
    blocks = scales.shape[0] // 32
    for b in range(blocks):
        prefetch(w, (blocks + b) * 160 + 40 * c)     # next group (after w): its block b over the 4 passes
        q = load_i8x32(w, b * 160 + 32 + 32 * c)
        at, s = b * 32 + 4 * c, b * 32
        low, high = _nibble_lanes(q, x0, at)
        dd = load_f32x8(scales, s)
        lo0, hi0 = fma(dd, low, lo0), fma(dd, high, hi0)
        low, high = _nibble_lanes(q, x1, at)
        dd = load_f32x8(scales, s + 8)
        lo1, hi1 = fma(dd, low, lo1), fma(dd, high, hi1)
        low, high = _nibble_lanes(q, x2, at)
        dd = load_f32x8(scales, s + 16)
        lo2, hi2 = fma(dd, low, lo2), fma(dd, high, hi2)
        low, high = _nibble_lanes(q, x3, at)
        dd = load_f32x8(scales, s + 24)
        lo3, hi3 = fma(dd, low, lo3), fma(dd, high, hi3)
    return add(hi0, lo0), add(hi1, lo1), add(hi2, lo2), add(hi3, lo3)


@njit(cache=True)
def _group_q4_1(w, xq, xd, xs, out, t0, col, scales):
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
    p0, p1, p2, p3 = _q4_1_lane_pair(w, x0, x1, x2, x3, scales, 0)
    r0, r1, r2, r3 = _q4_1_lane_pair(w, x0, x1, x2, x3, scales, 2)
    e0, e1, e2, e3 = add(p0, r0), add(p1, r1), add(p2, r2), add(p3, r3)    # (a4+a0) + (a6+a2)
    p0, p1, p2, p3 = _q4_1_lane_pair(w, x0, x1, x2, x3, scales, 1)
    r0, r1, r2, r3 = _q4_1_lane_pair(w, x0, x1, x2, x3, scales, 3)
    store_f32x8(out[t0], col, add(add(e0, add(p0, r0)), s0))              # + ((a5+a1) + (a7+a3)), + summs
    store_f32x8(out[t0 + 1], col, add(add(e1, add(p1, r1)), s1))
    store_f32x8(out[t0 + 2], col, add(add(e2, add(p2, r2)), s2))
    store_f32x8(out[t0 + 3], col, add(add(e3, add(p3, r3)), s3))


@njit(cache=True)
def _group_q4_1_one(w, xq, xd, xs, out, t, col):
    """8 rows (packed Q4_1 group w) x token t -> out[t, col:col+8]."""
    a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = summs = zeros_f32x8()
    x = xq[t]
    for b in range(xd.shape[1]):
        base = b * 160
        _prefetch_lines(w, base + PREFETCH_BYTES, 3)
        dd = mul(load_halves_as_f32(w, base), splat_f32(xd[t, b]))
        summs = fma(load_halves_as_f32(w, base + 16), splat_f32(xs[t, b]), summs)
        at = b * 32
        low, high = _nibble_lanes(load_i8x32(w, base + 32), x, at)
        a0, a4 = fma(dd, low, a0), fma(dd, high, a4)
        low, high = _nibble_lanes(load_i8x32(w, base + 64), x, at + 4)
        a1, a5 = fma(dd, low, a1), fma(dd, high, a5)
        low, high = _nibble_lanes(load_i8x32(w, base + 96), x, at + 8)
        a2, a6 = fma(dd, low, a2), fma(dd, high, a6)
        low, high = _nibble_lanes(load_i8x32(w, base + 128), x, at + 12)
        a3, a7 = fma(dd, low, a3), fma(dd, high, a7)
    store_f32x8(out[t], col, add(_vector_lane_sum(a0, a1, a2, a3, a4, a5, a6, a7), summs))


@njit(cache=True)
def _group_q4_0(w, xq, xsum, xd, out, t0, col):
    """8 rows (packed Q4_0 group w) x tokens t0..t0+3 -> out[t, col:col+8]."""
    acc0 = acc1 = acc2 = acc3 = zeros_f32x8()
    x0, x1, x2, x3 = xq[t0], xq[t0 + 1], xq[t0 + 2], xq[t0 + 3]
    for b in range(xd.shape[1]):
        base = b * 144
        i0 = splat_i32(-8 * xsum[t0, b])
        i1 = splat_i32(-8 * xsum[t0 + 1, b])
        i2 = splat_i32(-8 * xsum[t0 + 2, b])
        i3 = splat_i32(-8 * xsum[t0 + 3, b])
        for c in range(4):
            q = load_i8x32(w, base + 16 + 32 * c)
            at = b * 32 + 4 * c
            i0 = add(i0, _nibble_dot(q, x0, at))
            i1 = add(i1, _nibble_dot(q, x1, at))
            i2 = add(i2, _nibble_dot(q, x2, at))
            i3 = add(i3, _nibble_dot(q, x3, at))
        d = load_halves_as_f32(w, base)
        acc0 = add(acc0, mul(mul(d, splat_f32(xd[t0, b])), to_f32(i0)))
        acc1 = add(acc1, mul(mul(d, splat_f32(xd[t0 + 1, b])), to_f32(i1)))
        acc2 = add(acc2, mul(mul(d, splat_f32(xd[t0 + 2, b])), to_f32(i2)))
        acc3 = add(acc3, mul(mul(d, splat_f32(xd[t0 + 3, b])), to_f32(i3)))
    store_f32x8(out[t0], col, acc0)
    store_f32x8(out[t0 + 1], col, acc1)
    store_f32x8(out[t0 + 2], col, acc2)
    store_f32x8(out[t0 + 3], col, acc3)


@njit(cache=True)
def _group_q4_0_one(w, xq, xsum, xd, out, t, col):
    """8 rows (packed Q4_0 group w) x token t -> out[t, col:col+8]."""
    acc = zeros_f32x8()
    x = xq[t]
    for b in range(xd.shape[1]):
        base = b * 144
        _prefetch_lines(w, base + PREFETCH_BYTES, 3)
        isum = splat_i32(-8 * xsum[t, b])
        for c in range(4):
            isum = add(isum, _nibble_dot(load_i8x32(w, base + 16 + 32 * c), x, b * 32 + 4 * c))
        acc = add(acc, mul(mul(load_halves_as_f32(w, base), splat_f32(xd[t, b])), to_f32(isum)))
    store_f32x8(out[t], col, acc)


@njit(cache=True, inline="always")
def _q8_0_lane_pair(w, x0, x1, x2, x3, scales, l):
    """Lanes l and 4+l of 4 tokens (int16 activation rows x0..x3) over all blocks, with scales as in
    _q4_1_lane_pair -> a_{4+l} + a_l per token."""
    lo0 = lo1 = lo2 = lo3 = hi0 = hi1 = hi2 = hi3 = zeros_f32x8()
    blocks = scales.shape[0] // 32
    for b in range(blocks):
        _prefetch_lines(w, (blocks + b) * 272 + 68 * l, 2)     # next group (after w): block b over 4 passes
        low_at, high_at = b * 272 + 16 + 32 * l, b * 272 + 16 + 32 * (4 + l)
        at, s = b * 32 + 4 * l, b * 32
        dd = load_f32x8(scales, s)
        lo0, hi0 = fma(dd, _int8_lane(w, low_at, x0, at), lo0), fma(dd, _int8_lane(w, high_at, x0, at + 16), hi0)
        dd = load_f32x8(scales, s + 8)
        lo1, hi1 = fma(dd, _int8_lane(w, low_at, x1, at), lo1), fma(dd, _int8_lane(w, high_at, x1, at + 16), hi1)
        dd = load_f32x8(scales, s + 16)
        lo2, hi2 = fma(dd, _int8_lane(w, low_at, x2, at), lo2), fma(dd, _int8_lane(w, high_at, x2, at + 16), hi2)
        dd = load_f32x8(scales, s + 24)
        lo3, hi3 = fma(dd, _int8_lane(w, low_at, x3, at), lo3), fma(dd, _int8_lane(w, high_at, x3, at + 16), hi3)
    return add(hi0, lo0), add(hi1, lo1), add(hi2, lo2), add(hi3, lo3)


@njit(cache=True)
def _group_q8_0(w, xq16, xd, out, t0, col, scales):
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
    p0, p1, p2, p3 = _q8_0_lane_pair(w, x0, x1, x2, x3, scales, 0)
    r0, r1, r2, r3 = _q8_0_lane_pair(w, x0, x1, x2, x3, scales, 2)
    e0, e1, e2, e3 = add(p0, r0), add(p1, r1), add(p2, r2), add(p3, r3)    # (a4+a0) + (a6+a2)
    p0, p1, p2, p3 = _q8_0_lane_pair(w, x0, x1, x2, x3, scales, 1)
    r0, r1, r2, r3 = _q8_0_lane_pair(w, x0, x1, x2, x3, scales, 3)
    store_f32x8(out[t0], col, add(e0, add(p0, r0)))                         # + ((a5+a1) + (a7+a3))
    store_f32x8(out[t0 + 1], col, add(e1, add(p1, r1)))
    store_f32x8(out[t0 + 2], col, add(e2, add(p2, r2)))
    store_f32x8(out[t0 + 3], col, add(e3, add(p3, r3)))


@njit(cache=True)
def _group_q8_0_one(w, xq16, xd, out, t, col):
    """8 rows (packed Q8_0 group w) x token t (int16 activations) -> out[t, col:col+8]."""
    a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = zeros_f32x8()
    x = xq16[t]
    for b in range(xd.shape[1]):
        base = b * 272
        _prefetch_lines(w, base + PREFETCH_BYTES, 5)
        dd = mul(load_halves_as_f32(w, base), splat_f32(xd[t, b]))
        q, at = base + 16, b * 32
        a0 = fma(dd, _int8_lane(w, q, x, at), a0)
        a1 = fma(dd, _int8_lane(w, q + 32, x, at + 4), a1)
        a2 = fma(dd, _int8_lane(w, q + 64, x, at + 8), a2)
        a3 = fma(dd, _int8_lane(w, q + 96, x, at + 12), a3)
        a4 = fma(dd, _int8_lane(w, q + 128, x, at + 16), a4)
        a5 = fma(dd, _int8_lane(w, q + 160, x, at + 20), a5)
        a6 = fma(dd, _int8_lane(w, q + 192, x, at + 24), a6)
        a7 = fma(dd, _int8_lane(w, q + 224, x, at + 28), a7)
    store_f32x8(out[t], col, _vector_lane_sum(a0, a1, a2, a3, a4, a5, a6, a7))


@njit(cache=True, inline="always")
def _locate(part_ends, group):
    """-> (part index, first output column) of a group of concatenated parts."""
    part = 0
    while group >= part_ends[part]:
        part += 1
    first = part_ends[part - 1] if part > 0 else 0
    return part, (group - first) * ROWS_PER_GROUP


# ------------------------------------------------------------------------ packed kernels
# `_<type>_groups(first, last, ...)` computes groups [first, last) for every token, with one
# scratch allocation per call (per-group setup once cost as much as a one-token group's
# arithmetic); `_<type>_tail` the rows after the last group. Each type has a parallel driver
# (one prange region over up to MAX_RANGES contiguous group ranges, split evenly among the
# threads) and a serial one (no region: for calls too small to repay waking the worker threads).

MAX_RANGES = 32           # a constant: numba.get_num_threads() in a kernel disables its disk cache


@njit(cache=True, inline="always")
def _group_range(c, ranges, groups):
    """Groups [first, last) of range c out of `ranges` equal contiguous ranges."""
    return c * groups // ranges, (c + 1) * groups // ranges


@njit(cache=True, inline="always")
def _num_ranges(groups):
    return max(1, min(groups, MAX_RANGES))


@njit(cache=True)
def _q4_1_groups(first, last, packed, xq, xd, xs, outs, part_ends):
    num_tokens = xd.shape[0]
    full_tiles = num_tokens // 4 * 4
    scales = np.empty(xd.shape[1] * 32 if full_tiles else 0, np.float32)
    for i in range(first, last):
        part, col = _locate(part_ends, i)
        out = outs[part]
        for t0 in range(0, full_tiles, 4):
            _group_q4_1(packed[i], xq, xd, xs, out, t0, col, scales)
        for t in range(full_tiles, num_tokens):
            _group_q4_1_one(packed[i], xq, xd, xs, out, t, col)


@njit(cache=True)
def _q4_1_tail(tail, xq, xd, xs, half_to_float, outs):
    out = outs[len(outs) - 1]
    first = out.shape[1] - tail.shape[0]
    for r in range(tail.shape[0]):
        for t in range(xd.shape[0]):
            out[t, first + r] = row_dot_q4_1(tail[r], xq[t], xd[t], xs[t], half_to_float)


@njit(parallel=True, cache=True)
def matmul_q4_1_packed(packed, tail, xq, xd, xs, half_to_float, outs, part_ends):
    """W Q4_1 packed (groups, nb*160 B) + tail (n, nb*20 B) @ x Q8_1 (T, nb*32) -> outs[p] (T, rows_p)."""
    ranges = _num_ranges(packed.shape[0])
    for c in prange(ranges):
        first, last = _group_range(c, ranges, packed.shape[0])
        _q4_1_groups(first, last, packed, xq, xd, xs, outs, part_ends)
    _q4_1_tail(tail, xq, xd, xs, half_to_float, outs)


@njit(cache=True, nogil=True)
def matmul_q4_1_packed_serial(packed, tail, xq, xd, xs, half_to_float, outs, part_ends):
    """matmul_q4_1_packed on the calling thread only."""
    _q4_1_groups(0, packed.shape[0], packed, xq, xd, xs, outs, part_ends)
    _q4_1_tail(tail, xq, xd, xs, half_to_float, outs)


@njit(cache=True)
def _q4_0_groups(first, last, packed, xq, xsum, xd, outs, part_ends):
    num_tokens = xd.shape[0]
    full_tiles = num_tokens // 4 * 4
    for i in range(first, last):
        part, col = _locate(part_ends, i)
        out = outs[part]
        for t0 in range(0, full_tiles, 4):
            _group_q4_0(packed[i], xq, xsum, xd, out, t0, col)
        for t in range(full_tiles, num_tokens):
            _group_q4_0_one(packed[i], xq, xsum, xd, out, t, col)


@njit(cache=True)
def _q4_0_tail(tail, xq, xd, half_to_float, outs):
    out = outs[len(outs) - 1]
    first = out.shape[1] - tail.shape[0]
    for r in range(tail.shape[0]):
        for t in range(xd.shape[0]):
            out[t, first + r] = row_dot_q4_0(tail[r], xq[t], xd[t], half_to_float)


@njit(parallel=True, cache=True)
def matmul_q4_0_packed(packed, tail, xq, xsum, xd, half_to_float, outs, part_ends):
    """W Q4_0 packed (groups, nb*144 B) + tail (n, nb*18 B) @ x Q8_0 (T, nb*32), xsum = block_sums(xq)
    -> outs[p] (T, rows_p)."""
    ranges = _num_ranges(packed.shape[0])
    for c in prange(ranges):
        first, last = _group_range(c, ranges, packed.shape[0])
        _q4_0_groups(first, last, packed, xq, xsum, xd, outs, part_ends)
    _q4_0_tail(tail, xq, xd, half_to_float, outs)


@njit(cache=True, nogil=True)
def matmul_q4_0_packed_serial(packed, tail, xq, xsum, xd, half_to_float, outs, part_ends):
    """matmul_q4_0_packed on the calling thread only."""
    _q4_0_groups(0, packed.shape[0], packed, xq, xsum, xd, outs, part_ends)
    _q4_0_tail(tail, xq, xd, half_to_float, outs)


@njit(cache=True)
def _q8_0_groups(first, last, packed, xq16, xd, outs, part_ends):
    num_tokens = xd.shape[0]
    full_tiles = num_tokens // 4 * 4
    scales = np.empty(xd.shape[1] * 32 if full_tiles else 0, np.float32)
    for i in range(first, last):
        part, col = _locate(part_ends, i)
        out = outs[part]
        for t0 in range(0, full_tiles, 4):
            _group_q8_0(packed[i], xq16, xd, out, t0, col, scales)
        for t in range(full_tiles, num_tokens):
            _group_q8_0_one(packed[i], xq16, xd, out, t, col)


@njit(cache=True)
def _q8_0_tail(tail, xq, xd, half_to_float, outs):
    out = outs[len(outs) - 1]
    first = out.shape[1] - tail.shape[0]
    for r in range(tail.shape[0]):
        for t in range(xd.shape[0]):
            out[t, first + r] = row_dot_q8_0(tail[r], xq[t], xd[t], half_to_float)


@njit(parallel=True, cache=True)
def matmul_q8_0_packed(packed, tail, xq, xq16, xd, half_to_float, outs, part_ends):
    """W Q8_0 packed (groups, nb*272 B) + tail (n, nb*34 B) @ x Q8_0 (T, nb*32), xq16 = xq as int16
    -> outs[p] (T, rows_p)."""
    ranges = _num_ranges(packed.shape[0])
    for c in prange(ranges):
        first, last = _group_range(c, ranges, packed.shape[0])
        _q8_0_groups(first, last, packed, xq16, xd, outs, part_ends)
    _q8_0_tail(tail, xq, xd, half_to_float, outs)


@njit(cache=True, nogil=True)
def matmul_q8_0_packed_serial(packed, tail, xq, xq16, xd, half_to_float, outs, part_ends):
    """matmul_q8_0_packed on the calling thread only."""
    _q8_0_groups(0, packed.shape[0], packed, xq16, xd, outs, part_ends)
    _q8_0_tail(tail, xq, xd, half_to_float, outs)
