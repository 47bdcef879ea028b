"""Quantized matrix products: packed (row-interleaved) kernels and the GGUF-layout references.

Activations arrive quantized by kernels/quantize.py (int8 + per-32-block scales), so a block's
products are an exact integer sum; per row, the float accumulation over blocks runs in block
order, acc += d*xd*isum (+ m*xs for Q4_1), identically in every kernel here: the packed
kernels are bit-for-bit equal to the reference kernels, which read the GGUF bytes directly.

Packed kernels (layout in kernels/repack.py) work on groups of 8 rows: one vector lane per row,
so the block scales are applied with 8-wide float ops outside the integer inner loop. Several
matrices sharing one input can be concatenated (q|k|v, gate|up): `outs` is a tuple of output
arrays (T, rows_p) and part_ends[p] is the number of groups up to and including part p. Rows
that do not fill a group ("tail", GGUF layout) belong to the last part. Prefill takes tokens in
tiles of 4 per weight load. Each packed kernel has a parallel driver (one prange region, groups
split across threads) and a serial one; model/linear.py picks by the size of the call.

Threads: numba's `omp` layer (GNU libgomp) by default lets idle workers spin for a long time
after each parallel region. With other processes on the 2 cores, a spinning worker gets
preempted and every region then waits for its next time slice (measured: an empty region
went from ~4 us to ~11 ms, a decode pass from ~10 ms to ~1 s). Importing this module
therefore sets OMP_WAIT_POLICY=PASSIVE (unless the process already set it) before numba
starts its threads: regions then cost ~12-20 us (a futex wake) but stay that cheap under
load. It only takes effect if no parallel numba code has run yet in the process.
"""
import os

import numpy as np
from numba import njit, prange

from .repack import (ROWS_PER_GROUP, add, add_pairs_i16, broadcast_i16x2, broadcast_i8x4, dot_pairs_i16,
                     dot_pairs_u8_i8, high_nibbles, load_halves_as_f32, load_i8x16_as_i16, load_i8x32, low_nibbles,
                     mul, prefetch, splat_f32, splat_i32, store_f32x8, to_f32, zeros_f32x8, zeros_i32x8)

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")    # see "Threads" above; before numba's first region

# Decode (one token) streams the weights from memory: each block also prefetches the bytes
# this far ahead (the next group, contiguous); measured ~1.3x on the whole decode pass.
PREFETCH_BYTES = 2048


# ------------------------------------------------------------------ one row, GGUF layout

@njit(cache=True, inline="always")
def _scale(row, offset, half_to_float):
    return half_to_float[np.int64(row[offset]) | (np.int64(row[offset + 1]) << 8)]


@njit(cache=True)
def _row_q4_1(row, xq, xd, xs, half_to_float):
    """One Q4_1 row (nb*20 B) . one token's Q8_1 activations -> float32."""
    acc = np.float32(0.0)
    for b in range(xd.shape[0]):
        base = b * 20
        d = _scale(row, base, half_to_float)
        m = _scale(row, base + 2, half_to_float)
        isum = np.int32(0)
        for j in range(16):
            byte = np.int32(row[base + 4 + j])
            isum += (byte & 15) * np.int32(xq[b * 32 + j]) + (byte >> 4) * np.int32(xq[b * 32 + 16 + j])
        acc += d * xd[b] * np.float32(isum) + m * xs[b]
    return acc


@njit(cache=True)
def _row_q4_0(row, xq, xd, half_to_float):
    acc = np.float32(0.0)
    for b in range(xd.shape[0]):
        base = b * 18
        d = _scale(row, base, half_to_float)
        isum = np.int32(0)
        for j in range(16):
            byte = np.int32(row[base + 2 + j])
            isum += ((byte & 15) - 8) * np.int32(xq[b * 32 + j]) + ((byte >> 4) - 8) * np.int32(xq[b * 32 + 16 + j])
        acc += d * xd[b] * np.float32(isum)
    return acc


@njit(cache=True)
def _row_q8_0(row, xq, xd, half_to_float):
    acc = np.float32(0.0)
    signed = row.view(np.int8)
    for b in range(xd.shape[0]):
        base = b * 34
        d = _scale(row, base, half_to_float)
        isum = np.int32(0)
        for j in range(32):
            isum += np.int32(signed[base + 2 + j]) * np.int32(xq[b * 32 + j])
        acc += d * xd[b] * np.float32(isum)
    return acc


# ------------------------------------------------------- reference kernels (GGUF layout)

@njit(parallel=True, cache=True)
def matmul_q4_1(weights, xq, xd, xs, half_to_float, out):
    """W Q4_1 (rows, nb*20 B) @ x Q8_1 (T, nb*32) -> out (T, rows)."""
    for r in prange(weights.shape[0]):
        for t in range(xd.shape[0]):
            out[t, r] = _row_q4_1(weights[r], xq[t], xd[t], xs[t], half_to_float)


@njit(parallel=True, cache=True)
def matmul_q4_0(weights, xq, xd, half_to_float, out):
    """W Q4_0 (rows, nb*18 B) @ x Q8_0 (T, nb*32) -> out (T, rows)."""
    for r in prange(weights.shape[0]):
        for t in range(xd.shape[0]):
            out[t, r] = _row_q4_0(weights[r], xq[t], xd[t], half_to_float)


@njit(parallel=True, cache=True)
def matmul_q8_0(weights, xq, xd, half_to_float, out):
    """W Q8_0 (rows, nb*34 B) @ x Q8_0 (T, nb*32) -> out (T, rows)."""
    for r in prange(weights.shape[0]):
        for t in range(xd.shape[0]):
            out[t, r] = _row_q8_0(weights[r], xq[t], xd[t], half_to_float)


@njit(parallel=True, cache=True)
def matmul_f16(weights, x, half_to_float, out):
    """W F16 (rows, K*2 B) @ x (T, K) f32 (already rounded to fp16) -> out (T, rows)."""
    num_rows = weights.shape[0]
    num_tokens, length = x.shape
    halves = weights.view(np.uint16)
    for r in prange(num_rows):
        for t in range(num_tokens):
            acc = np.float32(0.0)
            for k in range(length):
                acc += half_to_float[halves[r, k]] * x[t, k]
            out[t, r] = acc


@njit(parallel=True, cache=True)
def matmul_f32(weights, x, out):
    """W F32 (rows, K*4 B) @ x (T, K) f32 -> out (T, rows)."""
    num_rows = weights.shape[0]
    num_tokens, length = x.shape
    floats = weights.view(np.float32)
    for r in prange(num_rows):
        for t in range(num_tokens):
            acc = np.float32(0.0)
            for k in range(length):
                acc += floats[r, k] * x[t, k]
            out[t, r] = acc


# ------------------------------------------------------------- packed: one group of 8 rows

@njit(cache=True, inline="always")
def _nibble_dot(q, x, at):
    """32 packed nibble bytes (8 rows x 4) . x[at..at+3] (low) and x[at+16..at+19] (high) -> I32x8."""
    low = dot_pairs_u8_i8(low_nibbles(q), broadcast_i8x4(x, at))
    high = dot_pairs_u8_i8(high_nibbles(q), broadcast_i8x4(x, at + 16))
    return add_pairs_i16(add(low, high))


@njit(cache=True, inline="always")
def _int8_dot(w, base, x16, at):
    """A Q8_0 block of 8 rows at w[base:] (16 chunks of 8 rows x 2) . x16[at:at+32] -> I32x8."""
    isum = zeros_i32x8()
    for c in range(16):
        isum = add(isum, dot_pairs_i16(load_i8x16_as_i16(w, base + 16 * c), broadcast_i16x2(x16, at + 2 * c)))
    return isum


@njit(cache=True, inline="always")
def _prefetch_lines(w, at, lines):
    """Prefetch `lines` cache lines from w[at] on (past w's end is fine: prefetches never fault)."""
    for i in range(lines):
        prefetch(w, at + 64 * i)


@njit(cache=True)
def block_sums(xq, out):
    """xq (T, nb*32) int8 -> out (T, nb) int32 per-block sums (Q4_0 subtracts 8 * these)."""
    for t in range(xq.shape[0]):
        for b in range(out.shape[1]):
            total = np.int32(0)
            for j in range(32):
                total += np.int32(xq[t, b * 32 + j])
            out[t, b] = total


@njit(cache=True)
def _group_q4_1(w, xq, xd, xs, out, t0, col):
    """8 rows (packed Q4_1 group w) x tokens t0..t0+3 -> out[t, col:col+8]."""
    acc0 = acc1 = acc2 = acc3 = zeros_f32x8()
    x0, x1, x2, x3 = xq[t0], xq[t0 + 1], xq[t0 + 2], xq[t0 + 3]
    for b in range(xd.shape[1]):
        base = b * 160
        i0 = i1 = i2 = i3 = zeros_i32x8()
        for c in range(4):
            q = load_i8x32(w, base + 32 + 32 * c)
            at = b * 32 + 4 * c
            i0 = add(i0, _nibble_dot(q, x0, at))
            i1 = add(i1, _nibble_dot(q, x1, at))
            i2 = add(i2, _nibble_dot(q, x2, at))
            i3 = add(i3, _nibble_dot(q, x3, at))
        d = load_halves_as_f32(w, base)
        m = load_halves_as_f32(w, base + 16)
        acc0 = add(acc0, add(mul(mul(d, splat_f32(xd[t0, b])), to_f32(i0)), mul(m, splat_f32(xs[t0, b]))))
        acc1 = add(acc1, add(mul(mul(d, splat_f32(xd[t0 + 1, b])), to_f32(i1)), mul(m, splat_f32(xs[t0 + 1, b]))))
        acc2 = add(acc2, add(mul(mul(d, splat_f32(xd[t0 + 2, b])), to_f32(i2)), mul(m, splat_f32(xs[t0 + 2, b]))))
        acc3 = add(acc3, add(mul(mul(d, splat_f32(xd[t0 + 3, b])), to_f32(i3)), mul(m, splat_f32(xs[t0 + 3, b]))))
    store_f32x8(out[t0], col, acc0)
    store_f32x8(out[t0 + 1], col, acc1)
    store_f32x8(out[t0 + 2], col, acc2)
    store_f32x8(out[t0 + 3], col, acc3)


@njit(cache=True)
def _group_q4_1_one(w, xq, xd, xs, out, t, col):
    """8 rows (packed Q4_1 group w) x token t -> out[t, col:col+8]."""
    acc = zeros_f32x8()
    x = xq[t]
    for b in range(xd.shape[1]):
        base = b * 160
        _prefetch_lines(w, base + PREFETCH_BYTES, 3)
        isum = zeros_i32x8()
        for c in range(4):
            isum = add(isum, _nibble_dot(load_i8x32(w, base + 32 + 32 * c), x, b * 32 + 4 * c))
        d = load_halves_as_f32(w, base)
        m = load_halves_as_f32(w, base + 16)
        acc = add(acc, add(mul(mul(d, splat_f32(xd[t, b])), to_f32(isum)), mul(m, splat_f32(xs[t, b]))))
    store_f32x8(out[t], col, acc)


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


@njit(cache=True)
def _group_q8_0(w, xq16, xd, out, t0, col):
    """8 rows (packed Q8_0 group w) x tokens t0..t0+3 (int16 activations) -> out[t, col:col+8]."""
    acc0 = acc1 = acc2 = acc3 = zeros_f32x8()
    x0, x1, x2, x3 = xq16[t0], xq16[t0 + 1], xq16[t0 + 2], xq16[t0 + 3]
    for b in range(xd.shape[1]):
        base = b * 272
        i0 = i1 = i2 = i3 = zeros_i32x8()
        for c in range(16):
            q = load_i8x16_as_i16(w, base + 16 + 16 * c)
            at = b * 32 + 2 * c
            i0 = add(i0, dot_pairs_i16(q, broadcast_i16x2(x0, at)))
            i1 = add(i1, dot_pairs_i16(q, broadcast_i16x2(x1, at)))
            i2 = add(i2, dot_pairs_i16(q, broadcast_i16x2(x2, at)))
            i3 = add(i3, dot_pairs_i16(q, broadcast_i16x2(x3, at)))
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
def _group_q8_0_one(w, xq16, xd, out, t, col):
    """8 rows (packed Q8_0 group w) x token t (int16 activations) -> out[t, col:col+8]."""
    acc = zeros_f32x8()
    x = xq16[t]
    for b in range(xd.shape[1]):
        base = b * 272
        _prefetch_lines(w, base + PREFETCH_BYTES, 5)
        isum = _int8_dot(w, base + 16, x, b * 32)
        acc = add(acc, mul(mul(load_halves_as_f32(w, base), splat_f32(xd[t, b])), to_f32(isum)))
    store_f32x8(out[t], col, acc)


@njit(cache=True, inline="always")
def _locate(part_ends, group):
    """-> (part index, first output column) of a group of concatenated parts."""
    part = 0
    while group >= part_ends[part]:
        part += 1
    first = part_ends[part - 1] if part > 0 else 0
    return part, (group - first) * ROWS_PER_GROUP


# ------------------------------------------------------------------------ packed kernels
# Iteration i < groups computes group i for every token; iteration `groups` the tail rows.
# Each type has a parallel driver (one prange region) and a serial one (no region: for
# calls too small to repay waking the worker threads).

@njit(cache=True)
def _q4_1_iteration(i, packed, tail, xq, xd, xs, half_to_float, outs, part_ends):
    num_tokens = xd.shape[0]
    if i < packed.shape[0]:
        part, col = _locate(part_ends, i)
        out = outs[part]
        full_tiles = num_tokens // 4 * 4
        for t0 in range(0, full_tiles, 4):
            _group_q4_1(packed[i], xq, xd, xs, out, t0, col)
        for t in range(full_tiles, num_tokens):
            _group_q4_1_one(packed[i], xq, xd, xs, out, t, col)
    else:
        out = outs[len(outs) - 1]
        first = out.shape[1] - tail.shape[0]
        for r in range(tail.shape[0]):
            for t in range(num_tokens):
                out[t, first + r] = _row_q4_1(tail[r], xq[t], xd[t], xs[t], half_to_float)


@njit(parallel=True, cache=True)
def matmul_q4_1_packed(packed, tail, xq, xd, xs, half_to_float, outs, part_ends):
    """W Q4_1 packed (groups, nb*160 B) + tail (n, nb*20 B) @ x Q8_1 (T, nb*32) -> outs[p] (T, rows_p)."""
    for i in prange(packed.shape[0] + 1):
        _q4_1_iteration(i, packed, tail, xq, xd, xs, half_to_float, outs, part_ends)


@njit(cache=True)
def matmul_q4_1_packed_serial(packed, tail, xq, xd, xs, half_to_float, outs, part_ends):
    """matmul_q4_1_packed on the calling thread only."""
    for i in range(packed.shape[0] + 1):
        _q4_1_iteration(i, packed, tail, xq, xd, xs, half_to_float, outs, part_ends)


@njit(cache=True)
def _q4_0_iteration(i, packed, tail, xq, xsum, xd, half_to_float, outs, part_ends):
    num_tokens = xd.shape[0]
    if i < packed.shape[0]:
        part, col = _locate(part_ends, i)
        out = outs[part]
        full_tiles = num_tokens // 4 * 4
        for t0 in range(0, full_tiles, 4):
            _group_q4_0(packed[i], xq, xsum, xd, out, t0, col)
        for t in range(full_tiles, num_tokens):
            _group_q4_0_one(packed[i], xq, xsum, xd, out, t, col)
    else:
        out = outs[len(outs) - 1]
        first = out.shape[1] - tail.shape[0]
        for r in range(tail.shape[0]):
            for t in range(num_tokens):
                out[t, first + r] = _row_q4_0(tail[r], xq[t], xd[t], half_to_float)


@njit(parallel=True, cache=True)
def matmul_q4_0_packed(packed, tail, xq, xsum, xd, half_to_float, outs, part_ends):
    """W Q4_0 packed (groups, nb*144 B) + tail (n, nb*18 B) @ x Q8_0 (T, nb*32), xsum = block_sums(xq)
    -> outs[p] (T, rows_p)."""
    for i in prange(packed.shape[0] + 1):
        _q4_0_iteration(i, packed, tail, xq, xsum, xd, half_to_float, outs, part_ends)


@njit(cache=True)
def matmul_q4_0_packed_serial(packed, tail, xq, xsum, xd, half_to_float, outs, part_ends):
    """matmul_q4_0_packed on the calling thread only."""
    for i in range(packed.shape[0] + 1):
        _q4_0_iteration(i, packed, tail, xq, xsum, xd, half_to_float, outs, part_ends)


@njit(cache=True)
def _q8_0_iteration(i, packed, tail, xq, xq16, xd, half_to_float, outs, part_ends):
    num_tokens = xd.shape[0]
    if i < packed.shape[0]:
        part, col = _locate(part_ends, i)
        out = outs[part]
        full_tiles = num_tokens // 4 * 4
        for t0 in range(0, full_tiles, 4):
            _group_q8_0(packed[i], xq16, xd, out, t0, col)
        for t in range(full_tiles, num_tokens):
            _group_q8_0_one(packed[i], xq16, xd, out, t, col)
    else:
        out = outs[len(outs) - 1]
        first = out.shape[1] - tail.shape[0]
        for r in range(tail.shape[0]):
            for t in range(num_tokens):
                out[t, first + r] = _row_q8_0(tail[r], xq[t], xd[t], half_to_float)


@njit(parallel=True, cache=True)
def matmul_q8_0_packed(packed, tail, xq, xq16, xd, half_to_float, outs, part_ends):
    """W Q8_0 packed (groups, nb*272 B) + tail (n, nb*34 B) @ x Q8_0 (T, nb*32), xq16 = xq as int16
    -> outs[p] (T, rows_p)."""
    for i in prange(packed.shape[0] + 1):
        _q8_0_iteration(i, packed, tail, xq, xq16, xd, half_to_float, outs, part_ends)


@njit(cache=True)
def matmul_q8_0_packed_serial(packed, tail, xq, xq16, xd, half_to_float, outs, part_ends):
    """matmul_q8_0_packed on the calling thread only."""
    for i in range(packed.shape[0] + 1):
        _q8_0_iteration(i, packed, tail, xq, xq16, xd, half_to_float, outs, part_ends)
