"""Quantized matmuls one weight row at a time, on GGUF-layout bytes: the references the packed
kernels (kernels/matmul.py) are tested against, the dot products of their tail rows (rows after
the last full group of 8), and the kernels for F16 / F32 weights. The summation order is
llama.cpp's, as described in kernels/matmul.py.
Note: numba's cache does not notice edits to imported modules (simd.py); clear __pycache__
after changing them.
"""
import numpy as np
from numba import njit, prange

from .simd import fma


# ------------------------------------------------------------------ one row, GGUF layout

@njit(cache=True, inline="always")
def _scale(row, offset, half_to_float):
    return half_to_float[np.int64(row[offset]) | (np.int64(row[offset + 1]) << 8)]


@njit(cache=True, inline="always")
def _lane_sum(a0, a1, a2, a3, a4, a5, a6, a7):
    """llama.cpp's horizontal sum of its 8 float lanes (hsum_float_8), float32 scalars."""
    return ((a4 + a0) + (a6 + a2)) + ((a5 + a1) + (a7 + a3))


@njit(cache=True, inline="always")
def _nibbles4(row, at, shift, xq, x_at):
    """float32(sum over e < 4 of nibble (row[at+e] >> shift) & 15 times xq[x_at+e]), exact."""
    isum = np.int32(0)
    for e in range(4):
        isum += ((np.int32(row[at + e]) >> shift) & 15) * np.int32(xq[x_at + e])
    return np.float32(isum)


@njit(cache=True, inline="always")
def _int8s4(signed, at, xq, x_at):
    """float32(sum over e < 4 of signed[at+e] * xq[x_at+e]), exact."""
    isum = np.int32(0)
    for e in range(4):
        isum += np.int32(signed[at + e]) * np.int32(xq[x_at + e])
    return np.float32(isum)


@njit(cache=True)
def row_dot_q4_1(row, xq, xd, xs, half_to_float):
    """One Q4_1 row (nb*20 B) . one token's Q8_1 activations -> float32 (llama.cpp's order)."""
    a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = summs = np.float32(0.0)
    for b in range(xd.shape[0]):
        base = b * 20
        dd = _scale(row, base, half_to_float) * xd[b]
        summs = fma(_scale(row, base + 2, half_to_float), xs[b], summs)
        q, x = base + 4, b * 32
        a0 = fma(dd, _nibbles4(row, q, 0, xq, x), a0)
        a1 = fma(dd, _nibbles4(row, q + 4, 0, xq, x + 4), a1)
        a2 = fma(dd, _nibbles4(row, q + 8, 0, xq, x + 8), a2)
        a3 = fma(dd, _nibbles4(row, q + 12, 0, xq, x + 12), a3)
        a4 = fma(dd, _nibbles4(row, q, 4, xq, x + 16), a4)
        a5 = fma(dd, _nibbles4(row, q + 4, 4, xq, x + 20), a5)
        a6 = fma(dd, _nibbles4(row, q + 8, 4, xq, x + 24), a6)
        a7 = fma(dd, _nibbles4(row, q + 12, 4, xq, x + 28), a7)
    return _lane_sum(a0, a1, a2, a3, a4, a5, a6, a7) + summs


@njit(cache=True)
def row_dot_q4_0(row, xq, xd, half_to_float):
    """One Q4_0 row (nb*18 B) . one token's Q8_0 activations -> float32 (simple order, see top)."""
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
def row_dot_q8_0(row, xq, xd, half_to_float):
    """One Q8_0 row (nb*34 B) . one token's Q8_0 activations -> float32 (llama.cpp's order)."""
    a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = np.float32(0.0)
    signed = row.view(np.int8)
    for b in range(xd.shape[0]):
        base = b * 34
        dd = _scale(row, base, half_to_float) * xd[b]
        q, x = base + 2, b * 32
        a0 = fma(dd, _int8s4(signed, q, xq, x), a0)
        a1 = fma(dd, _int8s4(signed, q + 4, xq, x + 4), a1)
        a2 = fma(dd, _int8s4(signed, q + 8, xq, x + 8), a2)
        a3 = fma(dd, _int8s4(signed, q + 12, xq, x + 12), a3)
        a4 = fma(dd, _int8s4(signed, q + 16, xq, x + 16), a4)
        a5 = fma(dd, _int8s4(signed, q + 20, xq, x + 20), a5)
        a6 = fma(dd, _int8s4(signed, q + 24, xq, x + 24), a6)
        a7 = fma(dd, _int8s4(signed, q + 28, xq, x + 28), a7)
    return _lane_sum(a0, a1, a2, a3, a4, a5, a6, a7)


# ------------------------------------------------------- reference kernels (GGUF layout)

@njit(parallel=True, cache=True)
def matmul_q4_1(weights, xq, xd, xs, half_to_float, out):
    """W Q4_1 (rows, nb*20 B) @ x Q8_1 (T, nb*32) -> out (T, rows)."""
    for r in prange(weights.shape[0]):
        for t in range(xd.shape[0]):
            out[t, r] = row_dot_q4_1(weights[r], xq[t], xd[t], xs[t], half_to_float)


@njit(parallel=True, cache=True)
def matmul_q4_0(weights, xq, xd, half_to_float, out):
    """W Q4_0 (rows, nb*18 B) @ x Q8_0 (T, nb*32) -> out (T, rows)."""
    for r in prange(weights.shape[0]):
        for t in range(xd.shape[0]):
            out[t, r] = row_dot_q4_0(weights[r], xq[t], xd[t], half_to_float)


@njit(parallel=True, cache=True)
def matmul_q8_0(weights, xq, xd, half_to_float, out):
    """W Q8_0 (rows, nb*34 B) @ x Q8_0 (T, nb*32) -> out (T, rows)."""
    for r in prange(weights.shape[0]):
        for t in range(xd.shape[0]):
            out[t, r] = row_dot_q8_0(weights[r], xq[t], xd[t], half_to_float)


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
