"""Q5_1: blocks of 32 weights in 24 bytes: f16 d, f16 m, uint32 qh (5th bits), 16 nibble bytes;
w = d * q + m, q = nibble | fifth bit << 4 (0..31).

Packed layout (a group of 8 rows, per block, 192 bytes): d[8] f16 | m[8] f16 | fifth bits 32 B |
4 chunks of 32 B (kernels/quants/bits5.py). Activations: Q8_1 (kernels/quantize.py: int8 q,
f16-rounded d and s = d * sum(q) per 32). llama.cpp's AVX2 ggml_vec_dot_q5_1_q8_1 order, which
every kernel here follows (bit-equal), the same as Q4_1's (kernels/quants/q4_1.py):
    a_l = fma(isum_l, d_w * d_x, a_l) block after block;  summs = fma(m_w, s_x, summs)
    result = ((a4 + a0) + (a6 + a2)) + ((a5 + a1) + (a7 + a3)) + summs
"""
import numpy as np
from numba import njit

from ..quantize import quantize_rows_q8
from ..simd import add, fma, load_halves_as_f32, mul, splat_f32, store_f32x8, to_f32, zeros_f32x8, zeros_i32x8
from ..simd_int import bits_or, broadcast_i8x4, dot4_acc, high_nibbles, load_i8x32, low_nibbles
from .bits5 import fifth_bit, fifth_bits, five_bit_values, repack5
from .common import MATMUL_SIGNATURE, dequantize_halves, locate, rows_of, run_parallel, run_serial
from .lanes import PREFETCH_BYTES, lane_sum, prefetch_lines, scale_at, vector_lane_sum

FUSABLE = True           # several matrices concatenated, one output per part
SCRATCH_SLOTS = ("q8", "scales", "sums")
TYPE_SIZE = 24
GROUP_BLOCK_BYTES = 192


def dequantize(blocks: np.ndarray) -> np.ndarray:
    """NumPy reference: GGUF blocks (n, 24) u8 -> (n, 32) f32."""
    return dequantize_halves(blocks, 0) * five_bit_values(blocks, 4) + dequantize_halves(blocks, 2)


def pack(raw: np.ndarray) -> tuple:
    """GGUF rows (rows, nb*24) -> (packed groups, tail rows); see the layout above."""
    return repack5(raw, TYPE_SIZE, 4)


@njit(cache=True, inline="always")
def _prepare(x, scratch):
    """x (T, K) -> its activations for this type, quantized into scratch (see the module docstring)."""
    num_tokens, length = x.shape
    xq = rows_of(scratch.q8, num_tokens, length)
    xd = rows_of(scratch.scales, num_tokens, length // 32)
    xs = rows_of(scratch.sums, num_tokens, length // 32)
    quantize_rows_q8(x, xq, xd, xs)
    return xq, xd, xs


@njit(cache=True, inline="always")
def _lane(q, bits, k, x, at):
    """8 rows' 5-bit weights (nibbles q, fifth bits at bit k of bits) . x[at..at+3] -> F32x8 (exact)."""
    return to_f32(dot4_acc(zeros_i32x8(), bits_or(q, fifth_bits(bits, k)), broadcast_i8x4(x, at)))


@njit(cache=True)
def _group_one(w, xq, xd, xs, out, t, col):
    """8 rows (packed Q5_1 group w) x token t -> out[t, col:col+8]."""
    a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = summs = zeros_f32x8()
    x = xq[t]
    for b in range(xd.shape[1]):
        base = b * GROUP_BLOCK_BYTES
        prefetch_lines(w, base + PREFETCH_BYTES, 3)
        dd = mul(load_halves_as_f32(w, base), splat_f32(xd[t, b]))
        summs = fma(load_halves_as_f32(w, base + 16), splat_f32(xs[t, b]), summs)
        bits = load_i8x32(w, base + 32)
        at = b * 32
        q = load_i8x32(w, base + 64)
        a0 = fma(_lane(low_nibbles(q), bits, 0, x, at), dd, a0)
        a4 = fma(_lane(high_nibbles(q), bits, 1, x, at + 16), dd, a4)
        q = load_i8x32(w, base + 96)
        a1 = fma(_lane(low_nibbles(q), bits, 2, x, at + 4), dd, a1)
        a5 = fma(_lane(high_nibbles(q), bits, 3, x, at + 20), dd, a5)
        q = load_i8x32(w, base + 128)
        a2 = fma(_lane(low_nibbles(q), bits, 4, x, at + 8), dd, a2)
        a6 = fma(_lane(high_nibbles(q), bits, 5, x, at + 24), dd, a6)
        q = load_i8x32(w, base + 160)
        a3 = fma(_lane(low_nibbles(q), bits, 6, x, at + 12), dd, a3)
        a7 = fma(_lane(high_nibbles(q), bits, 7, x, at + 28), dd, a7)
    store_f32x8(out[t], col, add(vector_lane_sum(a0, a1, a2, a3, a4, a5, a6, a7), summs))


@njit(cache=True)
def _groups(first, last, packed, acts, outs, part_ends):
    """Row groups first..last-1 of packed x the activations -> their columns of outs (every token)."""
    xq, xd, xs = acts
    for i in range(first, last):
        part, col = locate(part_ends, i)
        out = outs[part]
        for t in range(xd.shape[0]):
            _group_one(packed[i], xq, xd, xs, out, t, col)


@njit(cache=True)
def _tail(tail, acts, outs, part_ends):
    """The rows after the last full group (GGUF layout) x every token -> the last columns of the last out."""
    xq, xd, xs = acts
    out = outs[part_ends.shape[0] - 1]
    first = out.shape[1] - tail.shape[0]
    for r in range(tail.shape[0]):
        for t in range(xd.shape[0]):
            out[t, first + r] = row_dot(tail[r], xq[t], xd[t], xs[t])


@njit(cache=True)
def row_dot(row, xq, xd, xs):
    """One Q5_1 row (nb*24 B) . one token's Q8_1 activations -> float32 (llama.cpp's order)."""
    lanes = np.zeros(8, np.float32)
    summs = np.float32(0.0)
    for b in range(xd.shape[0]):
        base = b * TYPE_SIZE
        dd = scale_at(row, base) * xd[b]
        summs = fma(scale_at(row, base + 2), xs[b], summs)
        for lane in range(8):
            isum = np.int32(0)
            for e in range(4):
                j = 4 * lane + e
                byte = np.int32(row[base + 8 + j % 16])
                nibble = byte & 15 if j < 16 else byte >> 4
                isum += (nibble | fifth_bit(row, base + 4, j)) * np.int32(xq[b * 32 + j])
            lanes[lane] = fma(np.float32(isum), dd, lanes[lane])
    return lane_sum(lanes[0], lanes[1], lanes[2], lanes[3], lanes[4], lanes[5], lanes[6], lanes[7]) + summs


@njit(cache=True, nogil=True)
def embed_rows(raw, rows, out):
    """Dequantize rows (T,) of a GGUF-layout Q5_1 matrix (vocab, nb*24) -> out (T, n) f32 (d * q + m)."""
    for t in range(rows.shape[0]):
        source = raw[rows[t]]
        for b in range(out.shape[1] // 32):
            d, m = scale_at(source, b * TYPE_SIZE), scale_at(source, b * TYPE_SIZE + 2)
            for j in range(32):
                byte = np.int32(source[b * TYPE_SIZE + 8 + j % 16])
                nibble = byte & 15 if j < 16 else byte >> 4
                out[t, b * 32 + j] = d * np.float32(nibble | fifth_bit(source, b * TYPE_SIZE + 4, j)) + m


# ------------------------------------------------------------------ the two entry points

@njit(MATMUL_SIGNATURE, cache=True, nogil=True)
def matmul_serial(packed, tail, part_ends, x, scratch, outs):
    """W Q5_1 packed + tail @ x (T, K) -> outs (kernels/quants/common.py), on this thread."""
    run_serial(_prepare, _groups, _tail, packed, tail, part_ends, x, scratch, outs)


@njit(MATMUL_SIGNATURE, cache=True, parallel=True)
def matmul_parallel(packed, tail, part_ends, x, scratch, outs):
    """The same on numba's thread pool when big enough."""
    run_parallel(_prepare, _groups, _tail, packed, tail, part_ends, x, scratch, outs)
