"""Element-wise and normalisation kernels of the transformer block (float32)."""
import numpy as np
from numba import njit, prange


@njit(cache=True)
def rms_norm(x, weight, eps, out):
    """x (T, n) f32, weight (n,) -> out (T, n) = x / sqrt(mean(x^2) + eps) * weight."""
    num_tokens, n = x.shape
    for t in range(num_tokens):
        total = 0.0                      # float64 accumulator, as ggml does
        for i in range(n):
            total += np.float64(x[t, i]) * np.float64(x[t, i])
        mean = np.float32(total / n)
        scale = np.float32(1.0) / np.sqrt(mean + np.float32(eps))
        for i in range(n):
            out[t, i] = (x[t, i] * scale) * weight[i]


@njit(cache=True)
def add_in_place(x, y):
    """x (T, n) += y (T, n)."""
    num_tokens, n = x.shape
    for t in range(num_tokens):
        for i in range(n):
            x[t, i] += y[t, i]


@njit(cache=True)
def add_bias(x, bias):
    """x (T, n) += bias (n,)."""
    num_tokens, n = x.shape
    for t in range(num_tokens):
        for i in range(n):
            x[t, i] += bias[i]


@njit(cache=True)
def silu_mul(gate, up, out):
    """gate, up (T, n) -> out (T, n) = gate * sigmoid(gate) * up."""
    num_tokens, n = gate.shape
    for t in range(num_tokens):
        for i in range(n):
            g = gate[t, i]
            out[t, i] = g / (np.float32(1.0) + np.exp(-g)) * up[t, i]


@njit(cache=True)
def rope_tables(max_positions, rotary_dims, freq_base):
    """-> cos, sin (max_positions, rotary_dims/2) f32, theta stepped in float32 as ggml does."""
    half = rotary_dims // 2
    cos = np.empty((max_positions, half), np.float32)
    sin = np.empty((max_positions, half), np.float32)
    theta_scale = np.float32(freq_base ** (-2.0 / rotary_dims))
    for p in range(max_positions):
        theta = np.float32(p)
        for i in range(half):
            cos[p, i] = np.float32(np.cos(theta))
            sin[p, i] = np.float32(np.sin(theta))
            theta = np.float32(theta * theta_scale)
    return cos, sin


@njit(parallel=True, cache=True)
def apply_rope(x, positions, cos, sin, neox):
    """x (T, heads, head_dim) rotated in place by positions (T,); neox pairs (i, i+d/2), else (2i, 2i+1)."""
    num_tokens, num_heads, head_dim = x.shape
    half = cos.shape[1]
    for t in prange(num_tokens):
        p = positions[t]
        for h in range(num_heads):
            for i in range(half):
                if neox:
                    a, b = i, i + half
                else:
                    a, b = 2 * i, 2 * i + 1
                x0 = x[t, h, a]
                x1 = x[t, h, b]
                x[t, h, a] = x0 * cos[p, i] - x1 * sin[p, i]
                x[t, h, b] = x0 * sin[p, i] + x1 * cos[p, i]


@njit(cache=True)
def embed_q8_0(table, token_ids, half_to_float, out):
    """Q8_0 table (vocab, n/32*34 B), token_ids (T,) -> out (T, n) f32."""
    signed = table.view(np.int8)
    for t in range(token_ids.shape[0]):
        row = token_ids[t]
        for b in range(out.shape[1] // 32):
            base = b * 34
            d = half_to_float[np.int64(table[row, base]) | (np.int64(table[row, base + 1]) << 8)]
            for j in range(32):
                out[t, b * 32 + j] = d * np.float32(signed[row, base + 2 + j])
