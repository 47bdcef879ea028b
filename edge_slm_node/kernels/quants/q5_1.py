"""Q5_1: blocks of 32 weights in 24 bytes: f16 d, f16 m, uint32 qh (5th bits), 16 nibble bytes;
w = d * q + m, q = nibble | fifth bit << 4 (0..31).

Packed layout (a group of 8 rows, per block, 192 bytes): d[8] f16 | m[8] f16 | fifth bits 32 B |
2 chunks of 64 B (kernels/quants/bits5.py); a block is 4 vectors of 16 lanes per token
(kernels/quants/lanes.py, wide_block), 4 tokens of a prompt or a decode step sharing them.
Activations: Q8_1 (kernels/quantize.py: int8 q, f16-rounded d and s = d * sum(q) per 32).
llama.cpp's AVX2 ggml_vec_dot_q5_1_q8_1 order, which
every kernel here follows (bit-equal), the same as Q4_1's (kernels/quants/q4_1.py):
    a_l = fma(isum_l, d_w * d_x, a_l) block after block;  summs = fma(m_w, s_x, summs)
    result = ((a4 + a0) + (a6 + a2)) + ((a5 + a1) + (a7 + a3)) + summs
"""
import numpy as np
from numba import njit

from ..simd import add, align_stack_frame, fma, store_f32x8, zeros_f32x8
from .bits5 import fifth_bit, five_bit_values, five_bit_vectors, repack5
from .common import MATMUL_SIGNATURE, dequantize_halves, locate, quantize_with_sums, run_parallel, run_serial
from .lanes import (PREFETCH_BYTES, block_with_min, lane_sum, no_wide_lanes, prefetch_lines, scale_at, store_tile,
                    tile_block_with_min, tile_results_plus, tile_rows, wide_result)

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


@njit(cache=True, inline="always")      # no refcount per group: common.py, run_serial
def _group(w, xq, xd, xs, out, t0, col):
    """8 rows (packed Q5_1 group w) x tokens t0..t0+3 -> out[t, col:col+8]."""
    x = tile_rows(xq, t0)
    accs = no_wide_lanes(), no_wide_lanes(), no_wide_lanes(), no_wide_lanes()
    summs = zeros_f32x8(), zeros_f32x8(), zeros_f32x8(), zeros_f32x8()
    for b in range(xd.shape[1]):
        base = b * GROUP_BLOCK_BYTES
        prefetch_lines(w, base + PREFETCH_BYTES, 3)
        values = five_bit_vectors(w, base + 32, base + 64)
        accs, summs = tile_block_with_min(values, w, base, x, b * 32, xd, xs, t0, b, accs, summs)
    store_tile(out, t0, col, tile_results_plus(accs, summs))


@njit(cache=True, inline="always")
def _group_one(w, xq, xd, xs, out, t, col):
    """8 rows (packed Q5_1 group w) x token t -> out[t, col:col+8]."""
    x = xq[t]
    acc, summs = no_wide_lanes(), zeros_f32x8()
    for b in range(xd.shape[1]):
        base = b * GROUP_BLOCK_BYTES
        prefetch_lines(w, base + PREFETCH_BYTES, 3)
        acc, summs = block_with_min(five_bit_vectors(w, base + 32, base + 64), w, base, x, b * 32, xd[t, b], xs[t, b],
                                    acc, summs)
    store_f32x8(out[t], col, add(wide_result(acc), summs))


@njit(cache=True)
def _groups(first, last, packed, acts, outs, part_ends):
    """Row groups first..last-1 of packed x the activations -> their columns of outs (every token)."""
    align_stack_frame()
    xq, xd, xs = acts
    full_tiles = xd.shape[0] // 4 * 4
    for i in range(first, last):
        part, col = locate(part_ends, i)
        out = outs[part]
        for t0 in range(0, full_tiles, 4):
            _group(packed[i], xq, xd, xs, out, t0, col)
        for t in range(full_tiles, xd.shape[0]):
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
    run_serial(quantize_with_sums, _groups, _tail, packed, tail, part_ends, x, scratch, outs)


@njit(MATMUL_SIGNATURE, cache=True, parallel=True)
def matmul_parallel(packed, tail, part_ends, x, scratch, outs):
    """The same on numba's thread pool when big enough."""
    run_parallel(quantize_with_sums, _groups, _tail, packed, tail, part_ends, x, scratch, outs)
