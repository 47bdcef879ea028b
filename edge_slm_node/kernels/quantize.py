"""Quantize activations to 8 bits, as llama.cpp does before quantized matmuls.

Q8_0 (per 32 values: int8 q, fp16 d) is the partner of Q8_0, Q4_0 and Q5_0 weights, Q8_1 (which
adds s = d * sum(q)) of Q4_1 and Q5_1 weights: scales rounded through fp16 exactly as they are
stored in ggml's block structs. Q8_K (per 256 values: f32 d, int8 q, and the sum of every 16 q)
is the partner of the K-quants (Q4_K, Q5_K, Q6_K).
"""
import numpy as np
from numba import njit

from .half import round_to_half
from .ops import bits_float, float_bits

QUANT_BLOCK = 32
SUPER_BLOCK = 256     # Q8_K values per scale
SUM_BLOCK = 16        # Q8_K values per bsum
_ABS_MASK = np.int32(0x7FFFFFFF)
_INFINITY_BITS = np.int32(0x7F800000)


@njit(cache=True, inline="always")
def _largest_magnitude(row, start, count):
    """-> (max |row[start:start+count]|, the first value of that magnitude), NaNs ignored as
    ggml's `if (ax > amax)` ignores them. The bit patterns of |x| order as the values do, so the
    maximum is an integer reduction (vectorized); a scalar pass only when a NaN is there."""
    bits = np.int32(0)
    for j in range(count):
        bits = max(bits, float_bits(row[start + j]) & _ABS_MASK)
    if bits > _INFINITY_BITS:
        amax = largest = np.float32(0.0)
        for j in range(count):
            a = abs(row[start + j])
            if a > amax:
                amax, largest = a, row[start + j]
        return amax, largest
    amax = bits_float(bits)
    for j in range(count):
        if abs(row[start + j]) == amax:
            return amax, row[start + j]
    return amax, amax                   # not reached: some value has the largest magnitude


@njit(cache=True, nogil=True)
def quantize_rows_q8(x, xq, xd, xs):
    """x (T, K) f32 -> xq (T, K) int8, xd (T, K/32) f16-rounded scales, xs (T, K/32) f16-rounded d*sum(q)."""
    num_rows, length = x.shape
    for t in range(num_rows):
        for b in range(length // QUANT_BLOCK):
            start = b * QUANT_BLOCK
            amax, _ = _largest_magnitude(x[t], start, QUANT_BLOCK)
            d = amax / np.float32(127.0)
            inverse = np.float32(127.0) / amax if amax != 0 else np.float32(0.0)
            total = 0
            for j in range(QUANT_BLOCK):
                q = np.int32(np.rint(x[t, start + j] * inverse))
                xq[t, start + j] = q
                total += q
            xd[t, b] = round_to_half(d)
            xs[t, b] = round_to_half(d * np.float32(total))


@njit(cache=True, nogil=True)
def quantize_rows_q8_k(x, xq, xd, bsums):
    """x (T, K) f32 -> xq (T, K) int8, xd (T, K/256) f32, bsums (T, K/16) int32: ggml's
    quantize_row_q8_K_ref (the x86 build uses it for every row): per 256 values, max = the first
    value of largest |x|, iscale = -127/max, q = min(127, round-half-even(iscale * x)), d = 1/iscale
    (d = 0 and q = 0 when all are zero), bsums[j] = sum of q[16j..16j+15]."""
    num_rows, length = x.shape
    for t in range(num_rows):
        for b in range(length // SUPER_BLOCK):
            start = b * SUPER_BLOCK
            amax, largest = _largest_magnitude(x[t], start, SUPER_BLOCK)
            if amax == 0:
                xd[t, b] = 0
                for j in range(SUPER_BLOCK):
                    xq[t, start + j] = 0
                for j in range(SUPER_BLOCK // SUM_BLOCK):
                    bsums[t, b * (SUPER_BLOCK // SUM_BLOCK) + j] = 0
                continue
            iscale = np.float32(-127.0) / largest
            for j in range(SUPER_BLOCK):
                xq[t, start + j] = min(127, np.int32(np.rint(iscale * x[t, start + j])))
            for j in range(SUPER_BLOCK // SUM_BLOCK):
                total = np.int32(0)
                for i in range(SUM_BLOCK):
                    total += np.int32(xq[t, start + j * SUM_BLOCK + i])
                bsums[t, b * (SUPER_BLOCK // SUM_BLOCK) + j] = total
            xd[t, b] = np.float32(1.0) / iscale


@njit(cache=True)
def scaled_group_sums(xq, factor, bias, out):
    """out (T, K/4) int32 = bias + factor x the sum of each 4 consecutive int8 activations xq (T, K):
    the start of a lane's integer dot that turns unsigned stored weights (w + offset) into signed ones."""
    for t in range(xq.shape[0]):
        for g in range(xq.shape[1] // 4):
            total = np.int32(0)
            for e in range(4):
                total += np.int32(xq[t, 4 * g + e])
            out[t, g] = bias + factor * total
