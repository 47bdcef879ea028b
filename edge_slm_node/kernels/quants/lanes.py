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

from ..half import half_to_float
from ..simd import add, prefetch, to_f32
from ..simd_int import add_pairs_i16, broadcast_i8x4, dot_pairs_u8_i8, high_nibbles, low_nibbles

# Decode (one token) streams the weights from memory. Software prefetch of them (each block
# asking for the bytes PREFETCH_BYTES ahead) once measured ~1.3x on the whole decode pass; on
# the AMD EPYC hosts of 2026-12-03 the hardware prefetchers did better alone (1.5B: all of a
# token's matmuls 1.20x, the two-thread decode step 1.12x faster without; README, speed), so off.
PREFETCH_WEIGHTS = False
PREFETCH_BYTES = 2048


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
