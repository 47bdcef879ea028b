"""Quantized matrix products on the packed GGUF bytes, one kernel per weight type.

Weights stay as stored in the file (mmap, no dequantized copy). Activations arrive
quantized by kernels/quantize.py (int8 + per-block scales), so the inner loops are
integer dot products of one 32-weight block; the block scale is applied once per block.
Rows are split across threads; every token of the batch reuses a weight row while it is
in L1, so prefill reads the weights once per call.
"""
import numpy as np
from numba import njit, prange



@njit(cache=True, inline="always")
def _scale(row, offset, half_to_float):
    return half_to_float[np.int64(row[offset]) | (np.int64(row[offset + 1]) << 8)]


@njit(parallel=True, cache=True)
def matmul_q4_1(weights, xq, xd, xs, half_to_float, out):
    """W Q4_1 (rows, nb*20 B) @ x Q8_1 (T, nb*32) -> out (T, rows)."""
    num_rows = weights.shape[0]
    num_tokens, num_blocks = xd.shape
    for r in prange(num_rows):
        row = weights[r]
        for t in range(num_tokens):
            acc = np.float32(0.0)
            for b in range(num_blocks):
                base = b * 20
                d = _scale(row, base, half_to_float)
                m = _scale(row, base + 2, half_to_float)
                isum = np.int32(0)
                for j in range(16):
                    byte = np.int32(row[base + 4 + j])
                    isum += (byte & 15) * np.int32(xq[t, b * 32 + j]) + (byte >> 4) * np.int32(xq[t, b * 32 + 16 + j])
                acc += d * xd[t, b] * np.float32(isum) + m * xs[t, b]
            out[t, r] = acc


@njit(parallel=True, cache=True)
def matmul_q4_0(weights, xq, xd, half_to_float, out):
    """W Q4_0 (rows, nb*18 B) @ x Q8_0 (T, nb*32) -> out (T, rows)."""
    num_rows = weights.shape[0]
    num_tokens, num_blocks = xd.shape
    for r in prange(num_rows):
        row = weights[r]
        for t in range(num_tokens):
            acc = np.float32(0.0)
            for b in range(num_blocks):
                base = b * 18
                d = _scale(row, base, half_to_float)
                isum = np.int32(0)
                for j in range(16):
                    byte = np.int32(row[base + 2 + j])
                    isum += ((byte & 15) - 8) * np.int32(xq[t, b * 32 + j]) + ((byte >> 4) - 8) * np.int32(xq[t, b * 32 + 16 + j])
                acc += d * xd[t, b] * np.float32(isum)
            out[t, r] = acc


@njit(parallel=True, cache=True)
def matmul_q8_0(weights, xq, xd, half_to_float, out):
    """W Q8_0 (rows, nb*34 B) @ x Q8_0 (T, nb*32) -> out (T, rows)."""
    num_rows = weights.shape[0]
    num_tokens, num_blocks = xd.shape
    signed = weights.view(np.int8)
    for r in prange(num_rows):
        row = weights[r]
        signed_row = signed[r]
        for t in range(num_tokens):
            acc = np.float32(0.0)
            for b in range(num_blocks):
                base = b * 34
                d = _scale(row, base, half_to_float)
                isum = np.int32(0)
                for j in range(32):
                    isum += np.int32(signed_row[base + 2 + j]) * np.int32(xq[t, b * 32 + j])
                acc += d * xd[t, b] * np.float32(isum)
            out[t, r] = acc


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
