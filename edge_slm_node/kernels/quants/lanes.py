"""Lane arithmetic the packed and row kernels of several weight types share.

llama.cpp's x86 AVX2+FMA dot products for Q4_1, Q8_0 (and the K-quants' sub-blocks) keep 8 float
lanes; lane l sums the 4-weight group l of each 32-weight block, block after block:
    a_l = fma(d_w * d_x, float(isum_l), a_l)          d_w * d_x: one float32 product
and the result is ((a4 + a0) + (a6 + a2)) + ((a5 + a1) + (a7 + a3)) (hsum_float_8), with fma
rounding once (llvm.fma) and every other operation rounded. Packed kernels (kernels/simd.py)
hold those lanes for 8 rows at once, one vector lane per row; row kernels as 8 scalars.
"""
import numpy as np
from numba import njit

from ..cpu import cpu_vendor
from ..half import half_to_float
from ..simd import (EXACT_BIAS, add, concat, each_twice, even_plus_odd, fma, load_halves_as_f32, mul, prefetch,
                    prefetch_to_l2, splat_f32, splat_i32, store_f32x8, unbias, zeros_f32x8)
from ..simd_int import (add_pairs_i16, broadcast_i32x2, broadcast_i8x4, broadcast_i8x8, dot4_any_u8_acc,
                        dot_pairs_u8_i8, high_nibbles, low_nibbles)

# Decode streams the weights from memory. Software prefetch of them (each block asking for the
# bytes PREFETCH_BYTES ahead) is on for Intel CPUs only: on the AMD EPYC hosts of 2026-12-03 the
# hardware prefetchers did better alone (1.5B: all of a token's matmuls 1.20x, the two-thread
# decode step 1.12x faster without); on the Intel Xeon host of 2026-12-05 the SmolLM2 decode step
# was ~1.3x faster with, the 1.5B's 1.06x (README, speed); every 4-token tile prefetches as well
# (2026-12-06: without it a 4-session step paid memory stalls and compute one after the other), and
# the K-quant kernels on every CPU, into L2 elsewhere (below). Fixed when a kernel compiles
# (numba's disk cache keeps one entry per CPU model).
PREFETCH_WEIGHTS = cpu_vendor() == "GenuineIntel"
PREFETCH_BYTES = 2048
# A 4-token K-quant tile (decode steps of 4+ sessions) computes ~3x longer per weight byte than one token,
# and left to the hardware prefetchers it waited on memory and then computed, one after the other:
# on the AMD EPYC host of 2026-12-07 the 1.5B's gate and up matrices for 4 tokens on 2 threads
# streamed at 20 GB/s where one token's read 33 GB/s. There the K-quant kernels prefetch into L2
# (prefetcht1) L2_PREFETCH_BYTES ahead: 21.3 -> 13.9 ms for those matrices; prefetching into L1
# (prefetcht0) or 2048 bytes ahead made them slower than none (8-32 KiB ahead: within noise); the
# Q6_K head for 4 tokens 9.5 -> 7.5 ms (README, speed). The one-token Q4_K and Q6_K kernels as well
# (later that day): the 1.5B's 28 down matrices (Q4_K and Q6_K, K = 8960) streamed on one thread
# in 11.9 ms against 15.2 (medians of 6 alternations), gate, up and the head unchanged (README, speed).
# Intel CPUs keep prefetch_lines, measured there (2026-12-06). SmolLM2's Q4_1 and Q8_0 tiles keep
# prefetch_lines: with this L2 prefetch its 4-session step did not move (2026-12-07; those tiles
# are bound by their arithmetic, README).
L2_PREFETCH_BYTES = 16384


# ------------------------------------------------------------- 8 rows at once (vector lanes)

@njit(cache=True, inline="always")
def vector_lane_sum(a0, a1, a2, a3, a4, a5, a6, a7):
    """lane_sum for F32x8 accumulators (8 rows at once)."""
    return add(add(add(a4, a0), add(a6, a2)), add(add(a5, a1), add(a7, a3)))


@njit(cache=True, inline="always")
def nibble_dot(q, x, at):
    """32 packed nibble bytes (8 rows x 4) . x[at..at+3] (low) and x[at+16..at+19] (high) -> I32x8."""
    low = dot_pairs_u8_i8(low_nibbles(q), broadcast_i8x4(x, at))
    high = dot_pairs_u8_i8(high_nibbles(q), broadcast_i8x4(x, at + 16))
    return add_pairs_i16(add(low, high))


@njit(cache=True, inline="always")
def prefetch_lines(w, at, lines):
    """Prefetch `lines` cache lines from w[at] on if PREFETCH_WEIGHTS (past w's end is fine:
    prefetches never fault)."""
    if PREFETCH_WEIGHTS:
        for i in range(lines):
            prefetch(w, at + 64 * i)


@njit(cache=True, inline="always")
def prefetch_streamed_lines(w, at, lines):
    """A K-quant kernel (one token or a 4-token tile) over one row group, reading its block at
    w[at] now: prefetch_lines from PREFETCH_BYTES on where PREFETCH_WEIGHTS, else `lines` lines
    into L2 from L2_PREFETCH_BYTES on (past the group's end: the groups after it, read next)."""
    if PREFETCH_WEIGHTS:
        prefetch_lines(w, at + PREFETCH_BYTES, lines)
    else:
        for i in range(lines):
            prefetch_to_l2(w, at + L2_PREFETCH_BYTES + 64 * i)



# ------------------------------------------ 8 rows as four 16-lane vectors (Q4_1, Q5_x, Q8_0)
# Packed layouts with 8 bytes of a row per 64-byte chunk put lanes l, l+1 of row r in lanes 2r,
# 2r+1 of one vector: a block is 4 such vectors (lanes 0,1 | 2,3 | 4,5 | 6,7), each one vpdpbusd
# of its 4-byte words against the token's 8 activation bytes broadcast.

@njit(cache=True, inline="always")
def no_wide_lanes():
    """The 4 F32x16 lane vectors of 8 rows, zero."""
    zero = concat(zeros_f32x8(), zeros_f32x8())
    return zero, zero, zero, zero


@njit(cache=True, inline="always")
def _wide_lane(values, x, at, start, dd, acc):
    """acc + dd * float(start - EXACT_BIAS + each 4-byte word of values . the word of x[at..at+7]
    it lines up with), the integer below 2^22 in magnitude."""
    return fma(dd, unbias(dot4_any_u8_acc(start, values, broadcast_i8x8(x, at))), acc)


@njit(cache=True, inline="always")
def wide_block(values, d_w, x, at, d_x, acc):
    """One block of one token: acc (no_wide_lanes) + d_w * d_x (d_w: F32x8 of the 8 rows) times
    the integer dots of the block's 4 value vectors (unsigned bytes) with x[at..at+31]."""
    v01, v23, v45, v67 = values
    lanes01, lanes23, lanes45, lanes67 = acc
    dd = mul(each_twice(d_w), concat(splat_f32(d_x), splat_f32(d_x)))
    bias = concat(splat_i32(EXACT_BIAS), splat_i32(EXACT_BIAS))
    return (_wide_lane(v01, x, at, bias, dd, lanes01), _wide_lane(v23, x, at + 8, bias, dd, lanes23),
            _wide_lane(v45, x, at + 16, bias, dd, lanes45), _wide_lane(v67, x, at + 24, bias, dd, lanes67))


@njit(cache=True, inline="always")
def wide_block_offset(values, d_w, x, offsets, at, d_x, acc):
    """wide_block with each lane's integer dot started from offsets[(at + 4 * lane's group) / 4]
    (int32, one per 4 activations: what turns unsigned stored values into the signed weights,
    plus EXACT_BIAS: common.quantize_with_offsets)."""
    v01, v23, v45, v67 = values
    lanes01, lanes23, lanes45, lanes67 = acc
    dd = mul(each_twice(d_w), concat(splat_f32(d_x), splat_f32(d_x)))
    g = at // 4
    return (_wide_lane(v01, x, at, broadcast_i32x2(offsets, g), dd, lanes01),
            _wide_lane(v23, x, at + 8, broadcast_i32x2(offsets, g + 2), dd, lanes23),
            _wide_lane(v45, x, at + 16, broadcast_i32x2(offsets, g + 4), dd, lanes45),
            _wide_lane(v67, x, at + 24, broadcast_i32x2(offsets, g + 6), dd, lanes67))


@njit(cache=True, inline="always")
def wide_result(acc):
    """llama.cpp's ((a4 + a0) + (a6 + a2)) + ((a5 + a1) + (a7 + a3)) of 8 rows -> F32x8."""
    lanes01, lanes23, lanes45, lanes67 = acc
    return even_plus_odd(add(add(lanes45, lanes01), add(lanes67, lanes23)))


# 4 tokens t0..t0+3 sharing each block's value vectors (prompt tiles, decode steps of 4+ sessions):
# their activation rows, per-block figures and lanes as 4-tuples.

@njit(cache=True, inline="always")
def tile_rows(a, t0):
    """Rows t0..t0+3 of a (T, ·) array."""
    return a[t0], a[t0 + 1], a[t0 + 2], a[t0 + 3]


@njit(cache=True, inline="always")
def tile_column(a, t0, b):
    """a[t0..t0+3, b] of a (T, ·) array."""
    return a[t0, b], a[t0 + 1, b], a[t0 + 2, b], a[t0 + 3, b]


@njit(cache=True, inline="always")
def wide_tile(values, d_w, x, at, d_x, accs):
    """wide_block for each of 4 tokens (x: their activation rows, d_x: their d of this block)."""
    return (wide_block(values, d_w, x[0], at, d_x[0], accs[0]), wide_block(values, d_w, x[1], at, d_x[1], accs[1]),
            wide_block(values, d_w, x[2], at, d_x[2], accs[2]), wide_block(values, d_w, x[3], at, d_x[3], accs[3]))


@njit(cache=True, inline="always")
def wide_tile_offset(values, d_w, x, offsets, at, d_x, accs):
    """wide_block_offset for each of 4 tokens (offsets: their offset rows)."""
    return (wide_block_offset(values, d_w, x[0], offsets[0], at, d_x[0], accs[0]),
            wide_block_offset(values, d_w, x[1], offsets[1], at, d_x[1], accs[1]),
            wide_block_offset(values, d_w, x[2], offsets[2], at, d_x[2], accs[2]),
            wide_block_offset(values, d_w, x[3], offsets[3], at, d_x[3], accs[3]))


@njit(cache=True, inline="always")
def summs_tile(m_w, s_x, summs):
    """summs = fma(m_w, s_x, summs) for each of 4 tokens (Q4_1, Q5_1: the m of each row)."""
    return (fma(m_w, splat_f32(s_x[0]), summs[0]), fma(m_w, splat_f32(s_x[1]), summs[1]),
            fma(m_w, splat_f32(s_x[2]), summs[2]), fma(m_w, splat_f32(s_x[3]), summs[3]))


@njit(cache=True, inline="always")
def block_with_min(values, w, base, x, at, d_x, s_x, acc, summs):
    """One block of a type whose 8 rows' d and m are halves at w[base] and w[base + 16] (Q4_1,
    Q5_1), for one token: (wide_block's lanes, summs + m * the token's block sum s_x)."""
    return (wide_block(values, load_halves_as_f32(w, base), x, at, d_x, acc),
            fma(load_halves_as_f32(w, base + 16), splat_f32(s_x), summs))


@njit(cache=True, inline="always")
def tile_block_with_min(values, w, base, x, at, xd, xs, t0, b, accs, summs):
    """block_with_min for the 4 tokens t0.. of a tile (block b; xd, xs: every token's d and sums)."""
    return (wide_tile(values, load_halves_as_f32(w, base), x, at, tile_column(xd, t0, b), accs),
            summs_tile(load_halves_as_f32(w, base + 16), tile_column(xs, t0, b), summs))


@njit(cache=True, inline="always")
def store_tile(out, t0, col, results):
    """out[t0 + i, col:col+8] = results[i] (F32x8) for the 4 tokens."""
    store_f32x8(out[t0], col, results[0])
    store_f32x8(out[t0 + 1], col, results[1])
    store_f32x8(out[t0 + 2], col, results[2])
    store_f32x8(out[t0 + 3], col, results[3])


@njit(cache=True, inline="always")
def tile_results(accs):
    """wide_result of each of 4 tokens' lanes."""
    return wide_result(accs[0]), wide_result(accs[1]), wide_result(accs[2]), wide_result(accs[3])


@njit(cache=True, inline="always")
def tile_results_plus(accs, summs):
    """wide_result + summs of each of 4 tokens."""
    return (add(wide_result(accs[0]), summs[0]), add(wide_result(accs[1]), summs[1]),
            add(wide_result(accs[2]), summs[2]), add(wide_result(accs[3]), summs[3]))


# ---------------------------------------------------------------- one row (scalar lanes)

@njit(cache=True, inline="always")
def scale_at(row, offset):
    """The fp16 scale stored little-endian at row[offset] as float32."""
    return half_to_float(np.uint16(np.int64(row[offset]) | (np.int64(row[offset + 1]) << 8)))


@njit(cache=True, inline="always")
def lane_sum(a0, a1, a2, a3, a4, a5, a6, a7):
    """llama.cpp's horizontal sum of its 8 float lanes (hsum_float_8), float32 scalars."""
    return ((a4 + a0) + (a6 + a2)) + ((a5 + a1) + (a7 + a3))


@njit(cache=True, inline="always")
def nibbles4(row, at, shift, xq, x_at):
    """float32(sum over e < 4 of nibble (row[at+e] >> shift) & 15 times xq[x_at+e]), exact."""
    isum = np.int32(0)
    for e in range(4):
        isum += ((np.int32(row[at + e]) >> shift) & 15) * np.int32(xq[x_at + e])
    return np.float32(isum)


@njit(cache=True, inline="always")
def int8s4(signed, at, xq, x_at):
    """float32(sum over e < 4 of signed[at+e] * xq[x_at+e]), exact."""
    isum = np.int32(0)
    for e in range(4):
        isum += np.int32(signed[at + e]) * np.int32(xq[x_at + e])
    return np.float32(isum)
