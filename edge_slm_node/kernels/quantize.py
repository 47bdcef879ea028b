"""Quantize activations to 8 bits per 32-value block, as llama.cpp does before quantized matmuls.

Q8_0 is the partner of Q8_0 and Q4_0 weights, Q8_1 (which adds s = d * sum(q)) of Q4_1 weights.
Scales are rounded through fp16 exactly as they are stored in ggml's block structs.
"""
import numpy as np
from numba import njit

from .half import round_to_half

QUANT_BLOCK = 32


@njit(cache=True, nogil=True)
def quantize_rows_q8(x, xq, xd, xs):
    """x (T, K) f32 -> xq (T, K) int8, xd (T, K/32) f16-rounded scales, xs (T, K/32) f16-rounded d*sum(q)."""
    num_rows, length = x.shape
    for t in range(num_rows):
        for b in range(length // QUANT_BLOCK):
            start = b * QUANT_BLOCK
            amax = np.float32(0.0)
            for j in range(QUANT_BLOCK):
                a = abs(x[t, start + j])
                if a > amax:
                    amax = a
            d = amax / np.float32(127.0)
            inverse = np.float32(127.0) / amax if amax != 0 else np.float32(0.0)
            total = 0
            for j in range(QUANT_BLOCK):
                q = np.int32(np.rint(x[t, start + j] * inverse))
                xq[t, start + j] = q
                total += q
            xd[t, b] = round_to_half(d)
            xs[t, b] = round_to_half(d * np.float32(total))
